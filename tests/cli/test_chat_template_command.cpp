// `specdec chat-template`: prints the bundled target's render of a conversation, and fails with one
// line naming the template and line when the template refuses.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <unistd.h>

namespace {

// The command's stdout and exit status (stderr joined to stdout, so that failures show it).
std::pair<std::string, int> run(const std::string& args) {
  const std::string cmd = std::string("'") + SPECDEC_BINARY + "' chat-template " + args + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return {"popen failed", -1};
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
  const int status = pclose(pipe);
  return {out, WIFEXITED(status) ? WEXITSTATUS(status) : -1};
}

// A file of its own per test process: the tests run as separate processes at once, and one that
// rewrote a shared file while another's command read it gave that command an empty file. Removed
// when the test ends, so that runs leave nothing behind.
class MessagesFile {
 public:
  MessagesFile() { std::ofstream(path_) << R"([{"role": "user", "content": "Hi"}])"; }
  ~MessagesFile() { std::remove(path_.c_str()); }
  MessagesFile(const MessagesFile&) = delete;
  MessagesFile& operator=(const MessagesFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_ = testing::TempDir() + "specdec_chat_messages_" + std::to_string(::getpid()) + ".json";
};

TEST(ChatTemplateCommand, RendersTheBundledTargetsTemplate) {
  const MessagesFile messages;
  const auto [out, status] = run("--template '" SPECDEC_SOURCE_DIR "/models/target' --messages " + messages.path());
  EXPECT_EQ(status, 0) << out;
  EXPECT_EQ(out, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  const auto [bare, bare_status] =
      run("--no-generation-prompt --template '" SPECDEC_SOURCE_DIR "/models/target' --messages " + messages.path());
  EXPECT_EQ(bare, "<|im_start|>user\nHi<|im_end|>\n");
}

TEST(ChatTemplateCommand, ATemplatesRefusalIsOneErrorLine) {
  const MessagesFile messages;
  const auto [out, status] = run("--template '" SPECDEC_SOURCE_DIR
                                 "/tests/fixtures/chat_templates/templates/fireworks-ai-llama-3-firefunction-v2.jinja'"
                                 " --messages " +
                                 messages.path());
  EXPECT_EQ(status, 1);
  EXPECT_EQ(out, "specdec: error: template fireworks-ai-llama-3-firefunction-v2.jinja line 21: UndefinedError: "
                 "'functions' is undefined\n");
}

}  // namespace
