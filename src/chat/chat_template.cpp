// ChatTemplate: finding a model's template, parsing it once, and rendering it with the
// variables Hugging Face passes (messages, add_generation_prompt, bos/eos tokens, extras).
#include "specdec/chat_template.h"

#include <fstream>
#include <sstream>
#include <stdexcept>

#include "chat/globals.h"
#include "chat/parser.h"
#include "chat/renderer.h"

namespace specdec {

struct ChatTemplate::Parsed {
  std::string name;
  chat::Body body;
  std::string bos_token, eos_token;
};

namespace {

std::string read_file(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read chat template " + file.string());
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// A special token in tokenizer_config.json is a string or an object with "content".
std::string token_text(const nlohmann::json& config, const char* key) {
  if (!config.contains(key)) return "";
  const nlohmann::json& t = config[key];
  if (t.is_string()) return t.get<std::string>();
  if (t.is_object() && t.contains("content") && t["content"].is_string()) return t["content"].get<std::string>();
  return "";
}

std::optional<std::string> template_in_config(const nlohmann::json& config, const std::filesystem::path& file) {
  if (!config.contains("chat_template")) return std::nullopt;
  const nlohmann::json& t = config["chat_template"];
  if (t.is_string()) return t.get<std::string>();
  if (t.is_array()) {
    for (const auto& entry : t)
      if (entry.value("name", "") == "default" && entry.contains("template")) return entry["template"].get<std::string>();
    throw std::runtime_error(file.string() + ": chat_template lists named templates but none named \"default\"");
  }
  throw std::runtime_error(file.string() + ": chat_template is neither a string nor a list of named templates");
}

}  // namespace

ChatTemplate ChatTemplate::from_source(const std::string& source, const std::string& name) {
  auto parsed = std::make_shared<Parsed>();
  parsed->name = name;
  parsed->body = chat::parse_template(source, name);
  ChatTemplate t;
  t.parsed_ = std::move(parsed);
  return t;
}

ChatTemplate ChatTemplate::from_file(const std::filesystem::path& file) {
  return from_source(read_file(file), file.filename().string());
}

ChatTemplate ChatTemplate::load(const std::filesystem::path& model_dir) {
  const std::filesystem::path config_file = model_dir / "tokenizer_config.json";
  nlohmann::json config = nlohmann::json::object();
  if (std::filesystem::exists(config_file)) {
    try {
      config = nlohmann::json::parse(read_file(config_file));
    } catch (const nlohmann::json::exception& e) {
      throw std::runtime_error(config_file.string() + ": " + e.what());
    }
  }
  ChatTemplate t;
  if (auto source = template_in_config(config, config_file)) {
    t = from_source(*source, config_file.string() + " chat_template");
  } else if (std::filesystem::exists(model_dir / "chat_template.jinja")) {
    t = from_file(model_dir / "chat_template.jinja");
  } else {
    throw std::runtime_error(model_dir.string() + " has no chat template (neither tokenizer_config.json's "
                             "chat_template nor chat_template.jinja)");
  }
  auto parsed = std::const_pointer_cast<Parsed>(t.parsed_);
  parsed->bos_token = token_text(config, "bos_token");
  parsed->eos_token = token_text(config, "eos_token");
  return t;
}

std::string ChatTemplate::render(const nlohmann::ordered_json& messages, const ChatRenderOptions& o) const {
  chat::Frame vars = chat::builtin_globals(o.now);
  vars["messages"] = chat::from_json(messages);
  vars["add_generation_prompt"] = chat::Value(o.add_generation_prompt);
  vars["bos_token"] = chat::Value(o.bos_token.empty() ? parsed_->bos_token : o.bos_token);
  vars["eos_token"] = chat::Value(o.eos_token.empty() ? parsed_->eos_token : o.eos_token);
  for (const auto& [k, v] : o.extra.items()) vars[k] = chat::from_json(v);
  return chat::Renderer(parsed_->name, std::move(vars)).render(parsed_->body);
}

const std::string& ChatTemplate::name() const { return parsed_->name; }
const std::string& ChatTemplate::default_bos_token() const { return parsed_->bos_token; }
const std::string& ChatTemplate::default_eos_token() const { return parsed_->eos_token; }

}  // namespace specdec
