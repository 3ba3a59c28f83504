// End-to-end tests of the `specdec` command: the real binary is run on the bundled models and its
// exit status and output checked. Every failure must end with status 1 and exactly one
// `specdec: error:` line naming the cause. Flags are checked in-process (test_options.cpp), broken
// model folders through the library (tests/api/test_model_errors.cpp).
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <algorithm>
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

// The bundled target's parameters a decoded token multiplies, from its config.json: its tied
// table as the LM head, the final norm, and per layer q/k/v/o, gate/up/down and two norms.
double bundled_matmul_parameters() {
  const auto c = nlohmann::json::parse(slurp(kTarget + "/config.json"));
  const double h = c["hidden_size"], v = c["vocab_size"], inter = c["intermediate_size"];
  const double q = c["num_attention_heads"].get<double>() * c["head_dim"].get<double>();
  const double kv = c["num_key_value_heads"].get<double>() * c["head_dim"].get<double>();
  EXPECT_TRUE(c["tie_word_embeddings"].get<bool>());
  const double layer = h * q + 2 * h * kv + q * h + 3 * h * inter + 2 * h;
  return v * h + h + c["num_hidden_layers"].get<double>() * layer;
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

std::vector<std::string> generate_args(const std::vector<std::string>& extra) {
  std::vector<std::string> a = {
      "generate", "--device", "cpu", "--prompt", "def f(x):", "--max-tokens", "8", "--temperature", "0"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

void expect_stats(const nlohmann::json& j, size_t tokens) {
  ASSERT_TRUE(j.is_object()) << j;
  ASSERT_TRUE(j.contains("tokens") && j["tokens"].is_array()) << j;
  EXPECT_EQ(j["tokens"].size(), tokens) << j;
  ASSERT_TRUE(j.contains("text") && j["text"].is_string()) << j;
  EXPECT_FALSE(j["text"].get<std::string>().empty());
  EXPECT_EQ(j["finish_reason"], "length");
  ASSERT_TRUE(j.contains("stats")) << j;
  const auto& st = j["stats"];
  for (const char* k : {"prompt_tokens", "generated_tokens", "prefill_tokens_per_s", "decode_tokens_per_s"}) {
    EXPECT_TRUE(st.contains(k) && st[k].is_number()) << k << " in " << st;
  }
  EXPECT_GT(st["prompt_tokens"].get<int>(), 0);
  EXPECT_EQ(st["generated_tokens"].get<size_t>(), tokens);
}

// Greedy continuations computed independently from the same checkpoint (tests/fixtures/README.md),
// through the command, plain and with each draft method, with the speculative telemetry.
TEST_F(Cli, GreedyTokensMatchTheReferencePlainAndSpeculative) {
  const auto ref = nlohmann::json::parse(slurp(kSource + "/tests/fixtures/bundled/greedy.json"));
  constexpr size_t kTokens = 32;
  const std::string text = ref["prompts_text"][2].get<std::string>();
  std::vector<int> expected = ref["target"]["greedy"][2].get<std::vector<int>>();
  expected.resize(kTokens);
  for (const std::string draft : {"", "ngram", "draft"}) {
    std::vector<std::string> args = {
        "generate",      "--device", "cpu",         "--prompt", text, "--max-tokens", std::to_string(kTokens),
        "--temperature", "0",        "--ignore-eos"};
    if (!draft.empty()) args.insert(args.end(), {"--draft", draft == "draft" ? kDraft : draft});
    const auto j = run_json(args);
    expect_stats(j, kTokens);
    EXPECT_EQ(j["stats"]["prompt_tokens"].get<size_t>(), ref["prompts"][2].size());
    EXPECT_EQ(j["tokens"].get<std::vector<int>>(), expected) << "draft '" << draft << "'";
    EXPECT_EQ(j["stats"].contains("speculative"), !draft.empty()) << j;
    if (draft.empty()) continue;
    const auto& sp = j["stats"]["speculative"];
    EXPECT_LE(sp["accepted"].get<int>(), sp["drafted"].get<int>()) << sp;
    EXPECT_EQ(sp["emitted"].get<int>(), sp["accepted"].get<int>() + sp["rounds"].get<int>()) << sp;
  }
}

TEST_F(Cli, StreamingPrintsTextToStdoutAndStatsToStderr) {
  const auto j = run_json(generate_args({}));
  expect_stats(j, 8);
  const RunResult r = run(generate_args({"--draft", "ngram"}));
  ASSERT_EQ(r.status, 0) << r.err;
  // The streamed text is the generated text followed by one newline.
  EXPECT_EQ(r.out, j["text"].get<std::string>() + "\n");
  const auto ls = lines(r.err);
  ASSERT_EQ(ls.size(), 1u) << r.err;
  EXPECT_EQ(ls[0].rfind("[stats]", 0), 0u) << ls[0];
  EXPECT_NE(ls[0].find("generated tokens 8"), std::string::npos) << ls[0];
  EXPECT_NE(ls[0].find("ngram acceptance"), std::string::npos) << ls[0];
}

TEST_F(Cli, InfoDescribesTheBundledModel) {
  const RunResult r = run({"info", "--model", kTarget});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("LlamaForCausalLM"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("22028800"), std::string::npos) << r.out;
  bool vocab_line = false;
  for (const auto& l : lines(r.out)) {
    if (l.rfind("vocabulary", 0) == 0) {
      vocab_line = true;
      EXPECT_NE(l.find("8192"), std::string::npos) << l;
    }
  }
  EXPECT_TRUE(vocab_line) << r.out;
}

TEST_F(Cli, BenchComparesPlainAndSpeculativeRuns) {
  const fs::path suite = dir_ / "suite.json";
  write(suite, R"({"prompts": [{"name": "copy", "category": "c", "max_tokens": 16,
    "prompt": "def add(a, b):\n    return a + b\n\n\ndef add(a, b):\n"}]})");
  const RunResult r =
      run({"bench", "--device", "cpu", "--batch-sizes", "1,2", "--prompt-tokens", "16", "--new-tokens", "4", "--draft",
           "ngram", "--repeats", "1", "--spec-batch", "2", "--suite", suite.string(), "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  const auto report = nlohmann::json::parse(lines(r.out).back());
  const auto& plain = report["plain"];
  ASSERT_EQ(plain["rows"].size(), 2u) << plain;
  for (const auto& row : plain["rows"]) {
    EXPECT_GT(row["decode_tokens_per_s"].get<double>(), 0) << row;
    EXPECT_GT(row["bandwidth_fraction"].get<double>(), 0) << row;
    // Two FLOPs per matmul parameter per decoded token.
    EXPECT_DOUBLE_EQ(row["matmul_tflops_per_s"].get<double>(),
                     2.0 * bundled_matmul_parameters() * row["decode_tokens_per_s"].get<double>() / 1e12)
        << row;
    // The host's share is a part of the decode iteration, and the device's part is not empty.
    EXPECT_GT(row["decode_step_ms"].get<double>(), 0) << row;
    EXPECT_GE(row["host_ms_per_step"].get<double>(), 0) << row;
    EXPECT_LT(row["host_ms_per_step"].get<double>(), row["decode_step_ms"].get<double>()) << row;
  }
  EXPECT_GT(plain["bandwidth_bytes_per_s"].get<double>(), 0);
  EXPECT_EQ(plain["bandwidth_kind"], "host read");
  const auto& spec = report["speculative"][0];
  EXPECT_EQ(spec["method"], "ngram");
  ASSERT_EQ(spec["batch1"].size(), 1u);
  EXPECT_TRUE(spec["batch1"][0]["identical"].get<bool>()) << spec;
  const auto& tel = spec["batch1"][0]["telemetry"];
  EXPECT_EQ(tel["emitted"].get<int>(), tel["accepted"].get<int>() + tel["rounds"].get<int>()) << tel;
  EXPECT_EQ(spec["batch"]["rows"], 2);
  EXPECT_TRUE(spec["batch"]["identical"].get<bool>()) << spec;
  // Pairs go on past --repeats 1 while the shorter run of each pair has totalled less than 0.5 s,
  // up to four pairs (runs of 16 tokens take more than one pair here, one under a sanitizer);
  // the reported speedup is the median pair's, within the reported range.
  for (const auto* m : {&spec["batch1"][0], &spec["batch"]}) {
    const auto& spread = (*m)["spread"];
    const auto& pairs = spread["pairs"];
    ASSERT_GE(pairs.size(), 1u) << spread;
    ASSERT_LE(pairs.size(), 4u) << spread;
    double before_last = 0, total = 0;
    for (size_t i = 0; i < pairs.size(); ++i) {
      const double shorter = std::min(pairs[i]["plain_ms"].get<double>(), pairs[i]["spec_ms"].get<double>());
      if (i + 1 < pairs.size()) before_last += shorter;
      total += shorter;
    }
    EXPECT_LT(before_last, 500.0) << spread;
    if (pairs.size() < 4) {
      EXPECT_GE(total, 500.0) << spread;
    }
    std::vector<double> ratios;
    for (const auto& p : pairs) {
      EXPECT_GT(p["plain_ms"].get<double>(), 0) << p;
      EXPECT_GT(p["spec_ms"].get<double>(), 0) << p;
      EXPECT_LE(p["drafting_rounds"].get<int>(), p["rounds"].get<int>()) << p;
      EXPECT_LE(p["accepted"].get<int>(), p["drafted"].get<int>()) << p;
      ratios.push_back(p["decode_speedup"].get<double>());
    }
    std::sort(ratios.begin(), ratios.end());
    const size_t n = ratios.size();
    const double median = n % 2 ? ratios[n / 2] : 0.5 * (ratios[n / 2 - 1] + ratios[n / 2]);
    EXPECT_DOUBLE_EQ((*m)["decode_speedup"].get<double>(), median) << spread;
    EXPECT_DOUBLE_EQ(spread["decode_speedup_min"].get<double>(), ratios.front()) << spread;
    EXPECT_DOUBLE_EQ(spread["decode_speedup_max"].get<double>(), ratios.back()) << spread;
  }
}

// A prompt the model's context cannot hold (the bundled target's is 2,048) fails before any
// engine is loaded, naming the flag and the context.
TEST_F(Cli, BenchRefusesAPromptPastTheContextAtOnce) {
  const RunResult r = run({"bench", "--device", "cpu", "--prompt-tokens", "5000"});
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("--prompt-tokens 5000 does not fit the model's context of 2048 tokens"), std::string::npos)
      << r.err;
  EXPECT_EQ(r.out.find("plain decoding"), std::string::npos) << r.out;
}

// A prompt that leaves one position of the context: the row says why its decode rate cannot be
// measured instead of reporting 0 tok/s.
TEST_F(Cli, BenchExplainsARowWithNoDecodeStep) {
  // The bundled target seen with a 256-position context (its weights and tokenizer linked, its
  // config's max_position_embeddings lowered): a prompt that fills the context but one position
  // costs a 255-token prefill here instead of a 2,047-token one.
  const fs::path model = dir_ / "short-context";
  fs::create_directory(model);
  for (const char* f : {"model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"})
    fs::create_symlink(fs::path(kTarget) / f, model / f);
  auto config = nlohmann::json::parse(slurp(fs::path(kTarget) / "config.json"));
  config["max_position_embeddings"] = 256;
  write(model / "config.json", config.dump());
  const RunResult r = run({"bench", "--model", model.string(), "--device", "cpu", "--batch-sizes", "1",
                           "--prompt-tokens", "255", "--new-tokens", "8", "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("decode not measured: a 255-token prompt leaves 1 position(s)"), std::string::npos) << r.out;
  const auto report = nlohmann::json::parse(lines(r.out).back());
  const auto& row = report["plain"]["rows"][0];
  EXPECT_FALSE(row.contains("decode_tokens_per_s")) << row;
  EXPECT_TRUE(row.contains("decode_unmeasured")) << row;
  EXPECT_GT(row["prefill_tokens_per_s"].get<double>(), 0) << row;
  // The KV cache as sized at start, with the rows it holds at the run's context (256: the prompt
  // and the one position left), 16 blocks of 16 positions each.
  const auto& kv = report["kv_cache"];
  EXPECT_EQ(kv["context"], 256) << kv;
  EXPECT_EQ(kv["tokens"].get<int64_t>(), kv["blocks"].get<int64_t>() * kv["block_size"].get<int64_t>()) << kv;
  EXPECT_EQ(kv["rows_at_context"].get<int64_t>(), kv["blocks"].get<int64_t>() / 16) << kv;
  EXPECT_GE(kv["rows_at_context"].get<int64_t>(), 1) << kv;
  EXPECT_NE(r.out.find("KV cache (cpu): "), std::string::npos) << r.out;
}

TEST_F(Cli, BenchReplaysThePolicyAgainstTheBestSchedule) {
  const fs::path suite = dir_ / "replay.json";
  write(suite, R"({"prompts": [{"name": "copy", "category": "c", "max_tokens": 24,
    "prompt": "def add(a, b):\n    return a + b\n\n\ndef add(a, b):\n"}]})");
  const RunResult r = run({"bench", "--device", "cpu", "--skip-plain", "--draft", "ngram", "--replay", "--suite",
                           suite.string(), "--replay-repeats", "1", "--replay-forward-ms", "1.5,2,2.25", "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("best schedule"), std::string::npos) << r.out;
  const auto report = nlohmann::json::parse(lines(r.out).back());
  const auto& forward = report["replay"]["forward_ms"];
  ASSERT_EQ(forward.size(), 17u);
  EXPECT_NEAR(forward[1].get<double>(), 2.0, 1e-9);
  const auto& prompt = report["replay"]["methods"][0]["prompts"][0];
  const double best = prompt["best_schedule"]["decode_speedup"];
  EXPECT_GE(best + 1e-9, prompt["policy"]["decode_speedup"].get<double>());
  EXPECT_GE(best + 1e-9, prompt["best_fixed_depth"]["decode_speedup"].get<double>());
  EXPECT_GT(prompt["best_schedule"]["accepted"].get<int>(), 0);
}

// ---- failures: one line, status 1 --------------------------------------------------------------

TEST_F(Cli, ErrorsEndWithOneLineAndStatusOne) {
  // A flag the command does not know, a model folder that is not there, a prompt file likewise.
  expect_error(run(generate_args({"--bogus"})), "--bogus");
  expect_error(run(generate_args({"--model", (dir_ / "no_such_model").string()})), "no_such_model");
  expect_error(run({"info", "--model", (dir_ / "no_such_model").string()}), "no_such_model");
  expect_error(run({"generate", "--prompt-file", (dir_ / "nothing.txt").string()}), "nothing.txt");
  const RunResult help = run({"generate", "--help"});
  EXPECT_EQ(help.status, 0) << help.err;
  EXPECT_NE(help.out.find("--prompt"), std::string::npos) << help.out;
}

}  // namespace
