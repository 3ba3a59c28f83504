// `specdec chat-template`: prints what a chat template makes of a conversation, so that anyone can
// check a render against another implementation.
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "cli/commands.h"
#include "specdec/chat_template.h"

namespace specdec::cli {

void run_chat_template(const ChatTemplateCommand& command) {
  const ChatTemplate tpl = std::filesystem::is_directory(command.template_file)
                               ? ChatTemplate::load(command.template_file)
                               : ChatTemplate::from_file(command.template_file);
  std::ifstream in(command.messages_file);
  if (!in) throw std::runtime_error("cannot read " + command.messages_file);
  nlohmann::ordered_json doc;
  try {
    doc = nlohmann::ordered_json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(command.messages_file + ": " + e.what());
  }
  ChatRenderOptions o;
  o.add_generation_prompt = command.add_generation_prompt;
  o.bos_token = command.bos.value_or(tpl.default_bos_token());
  o.eos_token = command.eos.value_or(tpl.default_eos_token());
  nlohmann::ordered_json messages = doc;
  if (doc.is_object()) {  // {"messages": [...], "tools": [...], ...}: the rest become variables
    messages = doc.value("messages", nlohmann::ordered_json::array());
    for (const auto& [k, v] : doc.items())
      if (k != "messages") o.extra[k] = v;
  }
  if (!messages.is_array()) throw std::runtime_error(command.messages_file + ": messages must be a JSON array");
  const std::string text = tpl.render(messages, o);
  std::fwrite(text.data(), 1, text.size(), stdout);
}

}  // namespace specdec::cli
