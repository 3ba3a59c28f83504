// Reading tokenizer_config.json: the eos/bos token names (plain strings or AddedToken objects)
// and the chat template (a string, a list of named templates, or chat_template.jinja beside it).
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "tokenizer/tokenizer_state.h"

namespace specdec {
namespace {

std::string read_text_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  SPECDEC_CHECK(in.good(), "tokenizer: cannot open ", path.string());
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// eos_token / bos_token: null, "text" or {"content": "text", ...}.
std::optional<std::string> token_name(const nlohmann::json& config, const char* key, const std::string& where) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    auto c = it->find("content");
    if (c != it->end() && c->is_string()) return c->get<std::string>();
  }
  fail(where, ": field \"", key, "\" must be null, a string or an object with \"content\"");
}

std::optional<int32_t> resolve(const TokenizerState& state, const std::optional<std::string>& name,
                               const char* key, const std::string& where) {
  if (!name) return std::nullopt;
  if (const AddedToken* t = state.added.by_content(*name)) return t->id;
  if (auto id = state.model->token_to_id(*name)) return id;
  fail(where, ": ", key, " '", *name, "' is not in the vocabulary of ", state.source);
}

}  // namespace

nlohmann::json read_json_file(const std::filesystem::path& path) {
  std::error_code ec;
  SPECDEC_CHECK(std::filesystem::is_regular_file(path, ec), "tokenizer: file not found: ", path.string());
  const std::string text = read_text_file(path);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    fail(path.string(), ": invalid JSON: ", e.what());
  } catch (const nlohmann::json::out_of_range& e) {  // a number beyond double, e.g. 1e606
    fail(path.string(), ": invalid JSON: ", e.what());
  }
}

void load_tokenizer_config(TokenizerState& state, const std::filesystem::path& dir) {
  const auto config_path = dir / "tokenizer_config.json";
  std::error_code ec;
  if (std::filesystem::is_regular_file(config_path, ec)) {
    const nlohmann::json config = read_json_file(config_path);
    const std::string where = config_path.string();
    SPECDEC_CHECK(config.is_object(), where, ": top level must be an object");
    state.eos_id = resolve(state, token_name(config, "eos_token", where), "eos_token", where);
    state.bos_id = resolve(state, token_name(config, "bos_token", where), "bos_token", where);
    if (auto it = config.find("chat_template"); it != config.end() && !it->is_null()) {
      if (it->is_string()) {
        state.chat_template = it->get<std::string>();
      } else if (it->is_array()) {
        // [{"name": ..., "template": ...}]: the "default" one, else the first.
        for (const auto& entry : *it) {
          SPECDEC_CHECK(entry.is_object() && entry.contains("template") && entry["template"].is_string(), where,
                        ": chat_template entries must be objects with a \"template\" string");
          const bool is_default = entry.value("name", std::string()) == "default";
          if (state.chat_template.empty() || is_default) state.chat_template = entry["template"].get<std::string>();
          if (is_default) break;
        }
      } else {
        fail(where, ": field \"chat_template\" must be a string or a list of named templates");
      }
    }
  }
  const auto jinja_path = dir / "chat_template.jinja";
  if (state.chat_template.empty() && std::filesystem::is_regular_file(jinja_path, ec)) {
    state.chat_template = read_text_file(jinja_path);
  }
}

}  // namespace specdec
