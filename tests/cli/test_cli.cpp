// End-to-end tests of the `specdec` command: the real binary is run on the bundled models and on
// broken copies of model folders made in a temporary folder, and its exit status and output checked.
// Every failure must end with status 1 and exactly one `specdec: error:` line naming the cause.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

const std::string kSource = SPECDEC_SOURCE_DIR;
const std::string kTarget = kSource + "/models/target";
const std::string kDraft = kSource + "/models/draft";
const std::string kTinyLlama = kSource + "/tests/fixtures/models/llama";

struct RunResult {
  int status = -1;       // exit status; -1 when the process did not exit normally
  int signal = 0;        // the signal that ended it, if any
  std::string out, err;  // stdout, stderr
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << p;
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) {
    if (c == '\'')
      q += "'\\''";
    else
      q += c;
  }
  return q + "'";
}

std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> v;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) v.push_back(l);
  return v;
}

// Each test gets a fresh folder under /tmp, removed afterwards; the repository is never written.
class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/specdec_cli_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr) << std::strerror(errno);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  RunResult run(const std::vector<std::string>& args) {
    const fs::path out = dir_ / "stdout.txt", err = dir_ / "stderr.txt";
    std::string cmd = shell_quote(SPECDEC_BINARY);
    for (const auto& a : args) cmd.append(" ").append(shell_quote(a));
    cmd.append(" </dev/null >").append(shell_quote(out.string()));
    cmd.append(" 2>").append(shell_quote(err.string()));
    const int raw = std::system(cmd.c_str());
    RunResult r;
    if (raw != -1 && WIFEXITED(raw)) r.status = WEXITSTATUS(raw);
    if (raw != -1 && WIFSIGNALED(raw)) r.signal = WTERMSIG(raw);
    r.out = slurp(out);
    r.err = slurp(err);
    return r;
  }

  nlohmann::json run_json(std::vector<std::string> args) {
    args.push_back("--json");
    const RunResult r = run(args);
    EXPECT_EQ(r.status, 0) << r.err;
    const auto ls = lines(r.out);
    EXPECT_EQ(ls.size(), 1u) << r.out;
    if (ls.empty()) return {};
    return nlohmann::json::parse(ls[0]);
  }

  // A model folder in the temp dir whose files are links to `from`'s, except those the test
  // then overwrites (remove the link first so the original is never written through it).
  fs::path linked_copy(const std::string& from, const std::string& name) {
    const fs::path to = dir_ / name;
    fs::create_directories(to);
    for (const auto& e : fs::directory_iterator(from)) fs::create_symlink(e.path(), to / e.path().filename());
    return to;
  }
  void replace(const fs::path& file, const std::string& bytes) {
    fs::remove(file);
    write(file, bytes);
  }

  fs::path dir_;
};

// The failure contract: status 1, no signal, one stderr line `specdec: error: ...` containing `cause`.
void expect_error(const RunResult& r, const std::string& cause) {
  EXPECT_EQ(r.signal, 0) << "ended by signal " << r.signal << "; stderr: " << r.err;
  EXPECT_EQ(r.status, 1) << r.err;
  const auto ls = lines(r.err);
  ASSERT_EQ(ls.size(), 1u) << "stderr: " << r.err;
  EXPECT_EQ(ls[0].rfind("specdec: error: ", 0), 0u) << ls[0];
  EXPECT_NE(ls[0].find(cause), std::string::npos) << "expected '" << cause << "' in: " << ls[0];
}

// A safetensors file as (header JSON, data bytes), for editing tiny fixtures.
struct Safetensors {
  nlohmann::json header;
  std::string data;

  static Safetensors read(const fs::path& p) {
    const std::string b = slurp(p);
    uint64_t n = 0;
    std::memcpy(&n, b.data(), 8);
    return {nlohmann::json::parse(b.substr(8, n)), b.substr(8 + n)};
  }
  std::string bytes() const {
    std::string h = header.dump();
    while (h.size() % 8 != 0) h += ' ';
    const uint64_t n = h.size();
    std::string b(8, '\0');
    std::memcpy(b.data(), &n, 8);
    return b + h + data;
  }
};

std::vector<std::string> generate_args(const std::vector<std::string>& extra) {
  std::vector<std::string> a = {
      "generate", "--device", "cpu", "--prompt", "def f(x):", "--max-tokens", "8", "--temperature", "0"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// ---- happy paths -------------------------------------------------------------------------------

void expect_plain_stats(const nlohmann::json& j) {
  ASSERT_TRUE(j.is_object()) << j;
  ASSERT_TRUE(j.contains("tokens") && j["tokens"].is_array()) << j;
  EXPECT_EQ(j["tokens"].size(), 8u) << j;
  ASSERT_TRUE(j.contains("text") && j["text"].is_string()) << j;
  EXPECT_FALSE(j["text"].get<std::string>().empty());
  ASSERT_TRUE(j.contains("stats")) << j;
  const auto& st = j["stats"];
  for (const char* k : {"prompt_tokens", "generated_tokens", "prefill_tokens_per_s", "decode_tokens_per_s"}) {
    EXPECT_TRUE(st.contains(k) && st[k].is_number()) << k << " in " << st;
  }
  EXPECT_GT(st["prompt_tokens"].get<int>(), 0);
  EXPECT_EQ(st["generated_tokens"].get<int>(), 8);
}

void expect_speculative_stats(const nlohmann::json& j) {
  ASSERT_TRUE(j["stats"].contains("speculative")) << j;
  const auto& sp = j["stats"]["speculative"];
  ASSERT_TRUE(sp.is_object()) << sp;
  bool drafted = false, accepted = false;
  for (const auto& [k, v] : sp.items()) {
    if (k.find("drafted") != std::string::npos && v.is_number()) drafted = true;
    if (k.find("accepted") != std::string::npos && v.is_number()) accepted = true;
  }
  EXPECT_TRUE(drafted) << sp;
  EXPECT_TRUE(accepted) << sp;
}

TEST_F(Cli, GenerateJsonPrintsTokensTextAndStats) {
  const auto j = run_json(generate_args({}));
  expect_plain_stats(j);
  EXPECT_FALSE(j["stats"].contains("speculative"));
}

TEST_F(Cli, SpeculativeDraftsGiveTheSameTokensAsPlainDecoding) {
  const auto plain = run_json(generate_args({}));
  const auto ngram = run_json(generate_args({"--draft", "ngram"}));
  const auto draft = run_json(generate_args({"--draft", kDraft}));
  expect_plain_stats(ngram);
  expect_plain_stats(draft);
  expect_speculative_stats(ngram);
  expect_speculative_stats(draft);
  EXPECT_EQ(ngram["tokens"], plain["tokens"]);
  EXPECT_EQ(draft["tokens"], plain["tokens"]);
  EXPECT_EQ(draft["text"], plain["text"]);
}

// Greedy continuations computed independently from the same checkpoint (tests/fixtures/README.md),
// through the command, plain and with each draft method.
TEST_F(Cli, GreedyTokensMatchTheReference) {
  const auto ref = nlohmann::json::parse(slurp(kSource + "/tests/fixtures/bundled/greedy.json"));
  constexpr size_t kTokens = 32;
  for (size_t i : {size_t{0}, size_t{2}}) {
    const std::string text = ref["prompts_text"][i].get<std::string>();
    std::vector<int> expected = ref["target"]["greedy"][i].get<std::vector<int>>();
    expected.resize(kTokens);
    for (const std::string draft : {"", "ngram", "draft"}) {
      std::vector<std::string> args = {
          "generate",      "--device", "cpu",         "--prompt", text, "--max-tokens", std::to_string(kTokens),
          "--temperature", "0",        "--ignore-eos"};
      if (!draft.empty()) args.insert(args.end(), {"--draft", draft == "draft" ? kDraft : draft});
      const auto j = run_json(args);
      EXPECT_EQ(j["stats"]["prompt_tokens"].get<size_t>(), ref["prompts"][i].size()) << "prompt " << i;
      EXPECT_EQ(j["tokens"].get<std::vector<int>>(), expected) << "prompt " << i << ", draft '" << draft << "'";
    }
  }
}

TEST_F(Cli, PromptFileGivesTheSameResultAsPrompt) {
  write(dir_ / "prompt.txt", "def f(x):");
  const auto inline_prompt = run_json(generate_args({}));
  const auto file_prompt = run_json({"generate", "--device", "cpu", "--prompt-file", (dir_ / "prompt.txt").string(),
                                     "--max-tokens", "8", "--temperature", "0"});
  expect_plain_stats(file_prompt);
  EXPECT_EQ(file_prompt["tokens"], inline_prompt["tokens"]);
  EXPECT_EQ(file_prompt["stats"]["prompt_tokens"], inline_prompt["stats"]["prompt_tokens"]);
}

TEST_F(Cli, StreamingPrintsTextToStdoutAndStatsToStderr) {
  const auto j = run_json(generate_args({}));
  const RunResult r = run(generate_args({}));
  ASSERT_EQ(r.status, 0) << r.err;
  // The streamed text is the generated text followed by one newline.
  EXPECT_EQ(r.out, j["text"].get<std::string>() + "\n");
  const auto ls = lines(r.err);
  ASSERT_EQ(ls.size(), 1u) << r.err;
  EXPECT_EQ(ls[0].rfind("[stats]", 0), 0u) << ls[0];
  EXPECT_NE(ls[0].find("generated tokens 8"), std::string::npos) << ls[0];
}

TEST_F(Cli, InfoDescribesTheBundledModel) {
  const RunResult r = run({"info", "--model", kTarget});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("LlamaForCausalLM"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("22028800"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("8192"), std::string::npos) << r.out;
  bool vocab_line = false;
  for (const auto& l : lines(r.out)) {
    if (l.rfind("vocabulary", 0) == 0) {
      vocab_line = true;
      EXPECT_NE(l.find("8192"), std::string::npos) << l;
    }
  }
  EXPECT_TRUE(vocab_line) << r.out;
}

// ---- bad input: one line, status 1 -------------------------------------------------------------

TEST_F(Cli, MissingModelFolder) {
  const std::string missing = (dir_ / "no_such_model").string();
  expect_error(run(generate_args({"--model", missing})), "no_such_model");
  expect_error(run({"info", "--model", missing}), "no_such_model");
}

TEST_F(Cli, MissingConfig) {
  const fs::path m = linked_copy(kTarget, "m");
  fs::remove(m / "config.json");
  expect_error(run(generate_args({"--model", m.string()})), "config.json");
  expect_error(run({"info", "--model", m.string()}), "config.json");
}

TEST_F(Cli, InvalidConfigJson) {
  const fs::path m = linked_copy(kTarget, "m");
  replace(m / "config.json", "{\"vocab_size\": 8192, ");
  expect_error(run(generate_args({"--model", m.string()})), "config.json");
}

TEST_F(Cli, UnknownArchitecture) {
  const fs::path m = linked_copy(kTarget, "m");
  auto config = nlohmann::json::parse(slurp(kTarget + "/config.json"));
  config["architectures"] = {"FooForCausalLM"};
  config["model_type"] = "foo";
  replace(m / "config.json", config.dump(2));
  expect_error(run(generate_args({"--model", m.string()})), "FooForCausalLM");
}

TEST_F(Cli, TruncatedWeights) {
  const fs::path m = linked_copy(kTarget, "m");
  replace(m / "model.safetensors", slurp(kTarget + "/model.safetensors").substr(0, 1000));
  expect_error(run(generate_args({"--model", m.string()})), "model.safetensors");
  // Header intact, tensor data cut short.
  const fs::path tiny = linked_copy(kTinyLlama, "tiny");
  const std::string whole = slurp(kTinyLlama + "/model.safetensors");
  replace(tiny / "model.safetensors", whole.substr(0, whole.size() / 2));
  expect_error(run(generate_args({"--model", tiny.string()})), "model.safetensors");
}

TEST_F(Cli, TensorWithTheWrongShape) {
  const fs::path m = linked_copy(kTinyLlama, "m");
  Safetensors st = Safetensors::read(kTinyLlama + "/model.safetensors");
  // Same number of elements, other shape: only the shape check can catch it.
  st.header["model.layers.0.self_attn.q_proj.weight"]["shape"] = {32, 128};
  replace(m / "model.safetensors", st.bytes());
  expect_error(run(generate_args({"--model", m.string()})), "model.layers.0.self_attn.q_proj.weight");
  expect_error(run({"generate", "--device", "cpu", "--prompt", "x", "--draft", m.string()}),
               "model.layers.0.self_attn.q_proj.weight");
}

TEST_F(Cli, MissingTensor) {
  const fs::path m = linked_copy(kTinyLlama, "m");
  Safetensors st = Safetensors::read(kTinyLlama + "/model.safetensors");
  // model.norm.weight holds the last bytes, so dropping it leaves a consistent file.
  const auto end = st.header["model.norm.weight"]["data_offsets"][0].get<size_t>();
  ASSERT_EQ(st.header["model.norm.weight"]["data_offsets"][1].get<size_t>(), st.data.size());
  st.header.erase("model.norm.weight");
  st.data.resize(end);
  replace(m / "model.safetensors", st.bytes());
  expect_error(run(generate_args({"--model", m.string()})), "model.norm.weight");
}

TEST_F(Cli, EmptyPrompt) {
  expect_error(run({"generate", "--device", "cpu", "--prompt", ""}), "prompt");
  write(dir_ / "empty.txt", "");
  expect_error(run({"generate", "--device", "cpu", "--prompt-file", (dir_ / "empty.txt").string()}), "prompt");
}

TEST_F(Cli, MissingPromptFile) {
  expect_error(run({"generate", "--device", "cpu", "--prompt-file", (dir_ / "nothing.txt").string()}), "nothing.txt");
}

TEST_F(Cli, PromptLongerThanTheContext) {
  std::string text;
  for (int i = 0; i < 3000; ++i) text += "x = 1\n";
  write(dir_ / "long.txt", text);
  expect_error(run({"generate", "--device", "cpu", "--prompt-file", (dir_ / "long.txt").string(), "--max-tokens", "8"}),
               "2048");
}

TEST_F(Cli, DraftWithAnotherVocabulary) { expect_error(run(generate_args({"--draft", kTinyLlama})), "vocab"); }

TEST_F(Cli, UnknownSpecMode) {
  expect_error(run(generate_args({"--draft", "ngram", "--spec-mode", "greedy"})), "greedy");
}

TEST_F(Cli, TopPOutOfRange) { expect_error(run(generate_args({"--top-p", "2"})), "top_p"); }

TEST_F(Cli, CommandLineParseErrors) {
  expect_error(run({"generate", "--device", "cpu", "--prompt", "x", "--max-tokens", "abc"}), "abc");
  expect_error(run(generate_args({"--bogus"})), "--bogus");
  expect_error(run({}), "subcommand");
  expect_error(run({"generate", "--device", "cpu", "--prompt", "x", "--max-tokens", "0"}), "max_tokens");
  const RunResult help = run({"generate", "--help"});
  EXPECT_EQ(help.status, 0) << help.err;
  EXPECT_NE(help.out.find("--prompt"), std::string::npos) << help.out;
}

TEST_F(Cli, NegativeMemorySizes) {
  expect_error(run({"generate", "--device", "cpu", "--prompt", "x", "--gpu-memory", "-1"}), "--gpu-memory");
  expect_error(run({"generate", "--device", "cpu", "--prompt", "x", "--kv-memory", "-2"}), "--kv-memory");
  expect_error(run({"bench", "--device", "cpu", "--temperature", "-1"}), "temperature");
}

TEST_F(Cli, MalformedBenchSuite) {
  const auto bench = [&](const std::string& name, const std::string& body) {
    const fs::path suite = dir_ / name;
    write(suite, body);
    return run(
        {"bench", "--device", "cpu", "--skip-plain", "--draft", "ngram", "--repeats", "1", "--suite", suite.string()});
  };
  expect_error(bench("cut.json", "{\"prompts\": ["), "not valid JSON");
  expect_error(bench("empty.json", "{\"prompts\": []}"), "non-empty \"prompts\"");
  expect_error(bench("nolen.json", R"({"prompts": [{"name": "a", "category": "c", "prompt": "def f():"}]})"),
               "max_tokens");
  expect_error(
      bench("short.json", R"({"prompts": [{"name": "a", "category": "c", "prompt": "def f():", "max_tokens": 1}]})"),
      "at least 2");
  expect_error(bench("noprompt.json", R"({"prompts": [{"name": "a", "category": "c", "max_tokens": 8}]})"),
               "\"prompt\"");
}

TEST_F(Cli, BenchReplaysThePolicyAgainstTheBestSchedule) {
  const fs::path suite = dir_ / "replay.json";
  write(suite, R"({"prompts": [{"name": "copy", "category": "c", "max_tokens": 24,
    "prompt": "def add(a, b):\n    return a + b\n\n\ndef add(a, b):\n"}]})");
  // `bench --replay` of that suite with n-gram, plus `extra`.
  const auto replay = [&](std::vector<std::string> extra) {
    std::vector<std::string> args{"bench", "--device", "cpu",     "--skip-plain", "--draft",
                                  "ngram", "--replay", "--suite", suite.string()};
    args.insert(args.end(), extra.begin(), extra.end());
    return run(args);
  };
  const RunResult r = replay({"--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  const auto ls = lines(r.out);
  ASSERT_FALSE(ls.empty());
  const auto report = nlohmann::json::parse(ls.back());
  const auto& forward = report["replay"]["forward_ms"];
  ASSERT_EQ(forward.size(), 17u);
  for (const auto& ms : forward) EXPECT_GT(ms.get<double>(), 0.0);
  const auto& prompt = report["replay"]["methods"][0]["prompts"][0];
  const double best = prompt["best_schedule"]["decode_speedup"];
  EXPECT_GE(best + 1e-9, prompt["policy"]["decode_speedup"].get<double>());
  EXPECT_GE(best + 1e-9, prompt["best_fixed_depth"]["decode_speedup"].get<double>());
  EXPECT_LE(prompt["policy"]["accepted"].get<int>(), prompt["policy"]["drafted"].get<int>());
  // The copy is found: some drafts are accepted on the best schedule.
  EXPECT_GT(prompt["best_schedule"]["accepted"].get<int>(), 0);
  expect_error(replay({"--temperature", "0.8"}), "greedy");
  expect_error(replay({"--replay-window-cost", "-1"}), "--replay-window-cost");
  // Given forward costs replace the measured ones; widths past the list go on at its last step.
  const RunResult given = replay({"--replay-forward-ms", "1.5,2,2.25", "--json"});
  ASSERT_EQ(given.status, 0) << given.err;
  const auto given_forward = nlohmann::json::parse(lines(given.out).back())["replay"]["forward_ms"];
  ASSERT_EQ(given_forward.size(), 17u);
  EXPECT_DOUBLE_EQ(given_forward[0].get<double>(), 1.5);
  EXPECT_DOUBLE_EQ(given_forward[1].get<double>(), 2.0);
  EXPECT_DOUBLE_EQ(given_forward[2].get<double>(), 2.25);
  EXPECT_DOUBLE_EQ(given_forward[16].get<double>(), 2.25 + 14 * 0.25);
  expect_error(replay({"--replay-forward-ms", "1.5"}), "at least 1 and 2 tokens");
  expect_error(replay({"--replay-forward-ms", "1.5,0"}), "positive");
}

TEST_F(Cli, UnknownDevice) { expect_error(run({"generate", "--device", "tpu", "--prompt", "def f(x):"}), "tpu"); }

}  // namespace
