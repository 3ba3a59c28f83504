// A model's chat template: the Jinja program that turns a list of messages into the prompt text
// the model was trained on. Rendered by specdec's own interpreter (src/chat) in the environment
// Hugging Face's apply_chat_template uses, so a render matches what the model vendor tested.
#pragma once

#include <ctime>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace specdec {

struct ChatRenderOptions {
  bool add_generation_prompt = true;
  std::string bos_token;  // defaults: what the model folder's tokenizer_config.json names
  std::string eos_token;
  // Further variables, e.g. {"tools": [...], "documents": [...], "enable_thinking": false}.
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
  std::optional<std::tm> now;  // what strftime_now formats; unset, the local time
};

class ChatTemplate {
 public:
  // Parses `source`; throws std::runtime_error naming `name` and the line on bad syntax.
  static ChatTemplate from_source(const std::string& source, const std::string& name = "chat_template");
  static ChatTemplate from_file(const std::filesystem::path& file);
  // The template of a model folder: tokenizer_config.json's `chat_template` (a string, or a list
  // of named templates, of which "default" is taken), else chat_template.jinja beside it. Its
  // bos_token and eos_token become the render defaults. Throws when the folder has none.
  static ChatTemplate load(const std::filesystem::path& model_dir);

  // messages: a JSON array of {"role", "content", ...}. Throws std::runtime_error naming the
  // template and line when the template fails or refuses (raise_exception).
  std::string render(const nlohmann::ordered_json& messages, const ChatRenderOptions& options = {}) const;

  const std::string& name() const;
  const std::string& default_bos_token() const;
  const std::string& default_eos_token() const;

 private:
  struct Parsed;
  std::shared_ptr<const Parsed> parsed_;
};

}  // namespace specdec
