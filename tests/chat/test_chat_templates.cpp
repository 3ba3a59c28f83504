// Every real template in tests/fixtures/chat_templates × every conversation, with and without the
// generation prompt, against Python jinja2's render: byte-equal text, or an error where jinja2 raised.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "specdec/chat_template.h"

namespace {

const std::filesystem::path kDir = std::filesystem::path(SPECDEC_SOURCE_DIR) / "tests/fixtures/chat_templates";

nlohmann::ordered_json read_json(const std::filesystem::path& file) {
  std::ifstream in(file);
  return nlohmann::ordered_json::parse(in);
}

std::vector<std::string> template_names() {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(kDir / "templates"))
    if (e.path().extension() == ".jinja") names.push_back(e.path().stem().string());
  std::sort(names.begin(), names.end());
  return names;
}

// render.py fixes strftime_now to this time.
std::tm fixture_time() {
  std::tm t{};
  t.tm_year = 2026 - 1900;
  t.tm_mon = 0;
  t.tm_mday = 15;
  t.tm_hour = 9;
  t.tm_min = 30;
  t.tm_wday = 4;
  t.tm_yday = 14;
  return t;
}

class RealTemplate : public ::testing::TestWithParam<std::string> {};

TEST_P(RealTemplate, MatchesJinja2ForEveryConversation) {
  const specdec::ChatTemplate tpl = specdec::ChatTemplate::from_file(kDir / "templates" / (GetParam() + ".jinja"));
  const nlohmann::ordered_json conversations = read_json(kDir / "conversations.json");
  for (const auto& expected : read_json(kDir / "expected" / (GetParam() + ".json"))) {
    const int conversation = expected["conversation"].get<int>();
    specdec::ChatRenderOptions o;
    o.add_generation_prompt = expected["add_generation_prompt"].get<bool>();
    o.bos_token = "<s>";
    o.eos_token = "</s>";
    o.extra = {{"tools", nullptr}, {"documents", nullptr}};
    o.now = fixture_time();
    SCOPED_TRACE("conversation " + std::to_string(conversation) +
                 (o.add_generation_prompt ? " with" : " without") + " the generation prompt");
    const auto& messages = conversations[static_cast<size_t>(conversation)]["messages"];
    if (expected.contains("error")) {
      try {
        const std::string text = tpl.render(messages, o);
        ADD_FAILURE() << "expected the error " << expected["error"] << " but rendered:\n" << text;
      } catch (const std::runtime_error& e) {
        EXPECT_NE(std::string(e.what()).find(expected["error"].get<std::string>()), std::string::npos) << e.what();
      }
      continue;
    }
    try {
      EXPECT_EQ(tpl.render(messages, o), expected["text"].get<std::string>());
    } catch (const std::runtime_error& e) {
      ADD_FAILURE() << e.what();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, RealTemplate, ::testing::ValuesIn(template_names()),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n;
                         });

}  // namespace
