// The command line read in-process (src/cli/options.h): every bad flag ends with exit status 1 and
// exactly one error line, checked word for word; good lines give the typed command the library
// takes; --help answers with status 0. No process is spawned and no model loaded.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "cli/options.h"

namespace {

namespace fs = std::filesystem;
using specdec::cli::CommandLine;
using specdec::cli::parse_command_line;

struct BadLine {
  std::vector<std::string> args;
  std::string error;  // the whole line, after "specdec: error: "
};

void expect_error(const CommandLine& line, const std::string& error, const std::string& what) {
  EXPECT_FALSE(line.command.has_value()) << what;
  EXPECT_EQ(line.exit_status, 1) << what;
  EXPECT_EQ(line.out, "") << what;
  EXPECT_EQ(line.err, "specdec: error: " + error) << what;
}

std::string joined(const std::vector<std::string>& args) {
  std::string s;
  for (const auto& a : args) s += (s.empty() ? "" : " ") + a;
  return s;
}

const std::vector<BadLine> kBadGenerateLines = {
    {{"--device", "tpu"}, "unknown device 'tpu' (expected cpu or cuda)"},
    {{"--cpu-isa", "avx9"}, "unknown --cpu-isa 'avx9' (expected auto, best, avx512, avx2, scalar, avx512-bf16 or amx)"},
    {{"--kv-dtype", "f8"}, "unknown --kv-dtype 'f8' (expected bf16, f16 or f32)"},
    {{"--gpu-memory", "-1"}, "--gpu-memory must be a number of GiB in [0, 1048576] (0 = the default), got -1"},
    {{"--kv-memory", "-2"}, "--kv-memory must be a number of GiB in [0, 1048576] (0 = the default), got -2"},
    {{"--kv-memory", "1.72e10"}, "--kv-memory must be a number of GiB in [0, 1048576] (0 = the default), got 1.72e+10"},
    {{"--kv-memory", "inf"}, "--kv-memory must be a number of GiB in [0, 1048576] (0 = the default), got inf"},
    {{"--kv-memory", "nan"}, "--kv-memory must be a number of GiB in [0, 1048576] (0 = the default), got nan"},
    {{"--gpu-memory", "1e300"}, "--gpu-memory must be a number of GiB in [0, 1048576] (0 = the default), got 1e+300"},
    {{"--max-rows", "0"}, "--max-rows must be at least 1, got 0"},
    {{"--max-batch-tokens", "8"}, "--max-batch-tokens must be at least 16, got 8"},
    {{"--prompt-file", "/tmp/specdec_never.txt"}, "give --prompt or --prompt-file, not both"},
    {{"--max-tokens", "0"}, "max_tokens must be at least 1, got 0"},
    {{"--max-tokens", "abc"}, "Could not convert: --max-tokens = abc (see --help)"},
    {{"--bogus"}, "The following argument was not expected: --bogus (see --help)"},
    {{"--top-p", "2"}, "sampling: top_p must be in (0, 1], got 2"},
    {{"--temperature", "-1"}, "sampling: temperature must be finite and >= 0 (0 = greedy), got -1"},
    {{"--top-k", "-1"}, "sampling: top_k must be >= 0 (0 = off), got -1"},
    {{"--min-p", "1.5"}, "sampling: min_p must be in [0, 1], got 1.5"},
    {{"--temperature", "nan"}, "sampling: temperature must be finite and >= 0 (0 = greedy), got nan"},
    {{"--temperature", "-inf"}, "sampling: temperature must be finite and >= 0 (0 = greedy), got -inf"},
    {{"--top-p", "-0.5"}, "sampling: top_p must be in (0, 1], got -0.5"},
    {{"--top-p", "nan"}, "sampling: top_p must be in (0, 1], got nan"},
    {{"--top-k", "-5"}, "sampling: top_k must be >= 0 (0 = off), got -5"},
    {{"--min-p", "-1"}, "sampling: min_p must be in [0, 1], got -1"},
    {{"--min-p", "nan"}, "sampling: min_p must be in [0, 1], got nan"},
    {{"--repetition-penalty", "-1"}, "sampling: repetition_penalty must be finite and > 0 (1 = off), got -1"},
    {{"--temperature", "1e-38"},
     "--temperature 1e-38 is too small to sample at (the logits divided by it overflow): use 0 for greedy decoding or "
     "at least 1e-06"},
    {{"--temperature", "9e-7"},
     "--temperature 9e-07 is too small to sample at (the logits divided by it overflow): use 0 for greedy decoding or "
     "at least 1e-06"},
    {{"--seed", "18446744073709551616"},
     "--seed must be an integer in [0, 18446744073709551615], got '18446744073709551616'"},
    {{"--seed", "1e30"}, "--seed must be an integer in [0, 18446744073709551615], got '1e30'"},
    {{"--seed", "-1"}, "--seed must be an integer in [0, 18446744073709551615], got '-1'"},
    {{"--seed", "7x"}, "--seed must be an integer in [0, 18446744073709551615], got '7x'"},
    {{"--num-draft-tokens", "4"}, "--num-draft-tokens needs --draft (ngram or a draft model folder)"},
    {{"--spec-mode", "rejection"}, "--spec-mode needs --draft (ngram or a draft model folder)"},
    {{"--no-adaptive"}, "--no-adaptive needs --draft (ngram or a draft model folder)"},
    {{"--no-context-lookup"}, "--no-context-lookup needs --draft (ngram or a draft model folder)"},
    {{"--repetition-penalty", "0"}, "sampling: repetition_penalty must be finite and > 0 (1 = off), got 0"},
    {{"--presence-penalty", "3"}, "sampling: presence_penalty must be in [-2, 2], got 3"},
    {{"--frequency-penalty", "-3"}, "sampling: frequency_penalty must be in [-2, 2], got -3"},
    {{"--draft", "ngram", "--num-draft-tokens", "-1"}, "--num-draft-tokens must not be negative, got -1"},
    {{"--draft", "ngram", "--spec-mode", "greedy"}, "unknown --spec-mode 'greedy' (expected exact or rejection)"},
};

TEST(Options, BadGenerateFlagsGiveOneExactLine) {
  for (const BadLine& bad : kBadGenerateLines) {
    std::vector<std::string> args{"generate", "--prompt", "def f(x):"};
    args.insert(args.end(), bad.args.begin(), bad.args.end());
    expect_error(parse_command_line(args), bad.error, joined(args));
  }
}

const std::vector<BadLine> kBadLines = {
    {{}, "A subcommand is required (see --help)"},
    {{"info", "--bogus"}, "The following argument was not expected: --bogus (see --help)"},
    {{"generate", "--prompt", ""}, "--prompt is empty"},
    {{"generate", "--prompt-file", "/dev/null"}, "--prompt-file /dev/null is empty"},
    {{"generate", "--prompt-file", "/dev/zero"},
     "--prompt-file /dev/zero is larger than the 16 MiB a text file may have"},
    {{"generate", "--prompt-file", "/dev/urandom"},
     "--prompt-file /dev/urandom is larger than the 16 MiB a text file may have"},
    {{"generate", "--prompt-file", "/"}, "--prompt-file / is a directory (expected a text file)"},
    {{"bench", "--seed", "-3"}, "--seed must be an integer in [0, 18446744073709551615], got '-3'"},
    {{"bench", "--suite", "/"}, "/ is a directory (expected a text file)"},
    {{"generate", "--prompt-file", "/tmp/specdec_no_such_prompt.txt"}, "cannot read /tmp/specdec_no_such_prompt.txt"},
    {{"generate", "--device", "cpu", "--prompt", "x", "--cpu-isa", "sse2"},
     "unknown --cpu-isa 'sse2' (expected auto, best, avx512, avx2, scalar, avx512-bf16 or amx)"},
    {{"bench", "--temperature", "-1"}, "sampling: temperature must be finite and >= 0 (0 = greedy), got -1"},
    {{"bench", "--top-p", "0"}, "sampling: top_p must be in (0, 1], got 0"},
    {{"bench", "--temperature", "1e-30"},
     "--temperature 1e-30 is too small to sample at (the logits divided by it overflow): use 0 for greedy decoding or "
     "at least 1e-06"},
    {{"bench", "--repeats", "0"}, "--repeats must be at least 1"},
    {{"bench", "--draft", "ngram", "--replay", "--replay-window-cost", "-1"},
     "--replay-window-cost must not be negative, got -1"},
    {{"bench", "--draft", "ngram", "--replay", "--replay-forward-ms", "1.5"},
     "--replay-forward-ms needs the costs of at least 1 and 2 tokens, got 1"},
    {{"bench", "--draft", "ngram", "--replay", "--replay-forward-ms", "1.5,0"},
     "--replay-forward-ms: every cost must be positive, got 0"},
    {{"bench", "--draft", "ngram", "--replay", "--replay-repeats", "0"}, "--replay-repeats must be at least 1, got 0"},
    {{"bench", "--draft", "ngram", "--replay", "--replay-draft-ms", "0.1"},
     "--replay-draft-ms needs two costs (a call's fixed part and its part per step), got 1"},
    {{"bench", "--draft", "ngram", "--replay", "--replay-draft-ms", "0.1,-1"},
     "--replay-draft-ms: every cost must be at least 0, got -1"},
    {{"bench", "--replay"}, "--replay replays speculative decoding: name a method with --draft"},
    {{"bench", "--spec-mode", "fast"}, "unknown --spec-mode 'fast' (expected exact or rejection)"},
    {{"bench", "--draft", "ngram", "--replay", "--spec-mode", "rejection"},
     "--replay replays exact verification: a rejection-mode round's outcome is a draw of its own"},
    {{"bench", "--spec-batch", "0"}, "--spec-batch must be at least 1, got 0"},
    {{"bench", "--num-draft-tokens", "-1"}, "--num-draft-tokens must not be negative, got -1"},
    {{"bench", "--batch-sizes", "4,0"}, "--batch-sizes must be positive, got 0"},
    {{"bench", "--batch-sizes", "257"}, "--batch-sizes: at most 256 rows, got 257"},
    {{"bench", "--modes", "fast,slow"}, "--modes: unknown mode 'slow' (expected fast or invariant)"},
    {{"bench", "--prompt-tokens", "0"}, "--prompt-tokens must be >= 1 and --new-tokens >= 2"},
    {{"bench", "--new-tokens", "1"}, "--prompt-tokens must be >= 1 and --new-tokens >= 2"},
    {{"bench", "--draft", "ngram", "--draft", "ngram"}, "--draft ngram is given twice"},
    {{"bench", "--device", "tpu"}, "unknown device 'tpu' (expected cpu or cuda)"},
    {{"bench", "--suite", "/tmp/specdec_no_such_suite.json"}, "cannot read /tmp/specdec_no_such_suite.json"},
};

TEST(Options, BadLinesGiveOneExactLine) {
  for (const BadLine& bad : kBadLines) expect_error(parse_command_line(bad.args), bad.error, joined(bad.args));
}

class Suite : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/specdec_options_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr) << std::strerror(errno);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  // `bench --suite` of a file holding `body`.
  CommandLine bench(const std::string& body) {
    std::ofstream(dir_ / "suite.json") << body;
    return parse_command_line({"bench", "--draft", "ngram", "--suite", suite()});
  }
  std::string suite() const { return (dir_ / "suite.json").string(); }

  fs::path dir_;
};

TEST_F(Suite, MalformedSuitesAreNamedWithTheirFault) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"prompts": []})", "must be an object with a non-empty \"prompts\" array"},
      {R"([1, 2])", "must be an object with a non-empty \"prompts\" array"},
      {R"({"prompts": [3]})", ": prompt 0 is not an object"},
      {R"({"prompts": [{"name": "a", "category": "c", "prompt": "def f():"}]})",
       ": prompt 0 needs an integer \"max_tokens\""},
      {R"({"prompts": [{"name": "a", "category": "c", "prompt": "def f():", "max_tokens": 1}]})",
       ": prompt 0 (a): max_tokens must be at least 2, got 1"},
      {R"({"prompts": [{"name": "a", "category": "c", "max_tokens": 8}]})", ": prompt 0 needs a string \"prompt\""},
      {R"({"prompts": [{"name": "a", "category": "c", "prompt": "", "max_tokens": 8}]})",
       ": prompt 0 (a) has an empty prompt"},
  };
  for (const auto& [body, fault] : cases) {
    const std::string sep = fault[0] == ':' ? "" : " ";
    expect_error(bench(body), "bench suite " + suite() + sep + fault, body);
  }
  // The JSON library's own words follow the file's name.
  const CommandLine cut = bench("{\"prompts\": [");
  EXPECT_EQ(cut.exit_status, 1);
  EXPECT_EQ(cut.err.rfind("specdec: error: bench suite " + suite() + " is not valid JSON: ", 0), 0u) << cut.err;
}

TEST_F(Suite, AGoodBenchLineCarriesTheSuiteAndTheMethods) {
  const CommandLine line =
      bench(R"({"prompts": [{"name": "a", "category": "c", "prompt": "def f():", "max_tokens": 8}]})");
  ASSERT_TRUE(line.command.has_value()) << line.err;
  const auto& b = std::get<specdec::cli::BenchCommand>(*line.command);
  ASSERT_EQ(b.suite.size(), 1u);
  EXPECT_EQ(b.suite[0].text, "def f():");
  ASSERT_EQ(b.engine.drafts.size(), 1u);
  EXPECT_EQ(b.engine.drafts[0].kind, specdec::DraftKind::ngram);
  EXPECT_TRUE(b.engine.drafts[0].context_lookup);  // on unless --no-context-lookup
  // Greedy unless --temperature, every sampling field set so the model's defaults play no part.
  EXPECT_EQ(b.sampling.temperature, 0.0f);
  EXPECT_EQ(b.sampling.top_p, 1.0f);
  EXPECT_EQ(b.sampling.top_k, 0);
  EXPECT_EQ(b.sampling.repetition_penalty, 1.0f);
  EXPECT_EQ(b.mode, specdec::VerifyMode::exact);  // exact verification unless --spec-mode
}

TEST(Options, BenchTakesTheVerificationMode) {
  const CommandLine line = parse_command_line({"bench", "--draft", "ngram", "--spec-mode", "rejection"});
  ASSERT_TRUE(line.command.has_value()) << line.err;
  EXPECT_EQ(std::get<specdec::cli::BenchCommand>(*line.command).mode, specdec::VerifyMode::rejection);
}

TEST(Options, AGenerateLineBecomesTypedOptions) {
  const CommandLine line = parse_command_line({"generate",
                                               "--device",
                                               "cpu",
                                               "--cpu-isa",
                                               "avx2",
                                               "--kv-dtype",
                                               "f16",
                                               "--fast-gpu",
                                               "--prompt",
                                               "hi",
                                               "--draft",
                                               "/models/small",
                                               "--num-draft-tokens",
                                               "4",
                                               "--spec-mode",
                                               "rejection",
                                               "--no-adaptive",
                                               "--no-context-lookup",
                                               "--temperature",
                                               "0.5",
                                               "--stop",
                                               "\n\n",
                                               "--max-tokens",
                                               "7",
                                               "--json"});
  ASSERT_TRUE(line.command.has_value()) << line.err;
  const auto& g = std::get<specdec::cli::GenerateCommand>(*line.command);
  EXPECT_EQ(g.engine.device, specdec::DeviceKind::cpu);
  EXPECT_EQ(g.engine.cpu_isa, specdec::CpuIsa::avx2);
  EXPECT_EQ(g.engine.kv_type, specdec::KvCacheType::f16);
  EXPECT_FALSE(g.engine.batch_invariant);
  ASSERT_EQ(g.engine.drafts.size(), 1u);
  EXPECT_EQ(g.engine.drafts[0].kind, specdec::DraftKind::model);
  EXPECT_EQ(g.engine.drafts[0].path, "/models/small");
  EXPECT_EQ(g.engine.drafts[0].num_draft_tokens, 4);
  EXPECT_FALSE(g.engine.drafts[0].context_lookup);
  EXPECT_EQ(g.request.speculative.draft, specdec::draft_id(g.engine.drafts[0]));
  EXPECT_EQ(g.request.speculative.num_draft_tokens, 4);
  EXPECT_EQ(g.request.speculative.mode, specdec::VerifyMode::rejection);
  EXPECT_FALSE(g.request.speculative.adaptive);
  EXPECT_EQ(g.request.sampling.temperature, 0.5f);
  EXPECT_FALSE(g.request.sampling.top_p.has_value());  // the model's default
  EXPECT_EQ(g.request.stop, std::vector<std::string>{"\n\n"});
  EXPECT_EQ(g.request.max_tokens, 7);
  EXPECT_EQ(g.prompt, "hi");
  EXPECT_TRUE(g.json);
  // Without --device, the engine picks; without --draft, no method is loaded.
  const CommandLine plain = parse_command_line({"generate", "--prompt", "hi"});
  ASSERT_TRUE(plain.command.has_value()) << plain.err;
  const auto& p = std::get<specdec::cli::GenerateCommand>(*plain.command);
  EXPECT_EQ(p.engine.device, specdec::DeviceKind::automatic);
  EXPECT_EQ(p.engine.cpu_isa, specdec::CpuIsa::automatic);
  // The default by name, and the fastest exact kernels.
  for (const auto& [name, isa] : {std::pair{"auto", specdec::CpuIsa::automatic}, {"best", specdec::CpuIsa::best}}) {
    const CommandLine named = parse_command_line({"generate", "--prompt", "hi", "--cpu-isa", name});
    ASSERT_TRUE(named.command.has_value()) << named.err;
    EXPECT_EQ(std::get<specdec::cli::GenerateCommand>(*named.command).engine.cpu_isa, isa) << name;
  }
  EXPECT_TRUE(p.engine.drafts.empty());
  EXPECT_TRUE(p.request.speculative.draft.empty());
}

// --threads is bounded by the machine: past max_threads() an error naming the limit, above the
// hardware threads a command with one warning line, and 0 (all) or the core count quietly.
TEST(Options, ThreadsAreBoundedByTheMachine) {
  const int hw = specdec::hardware_threads(), limit = specdec::max_threads();
  const std::string range = "--threads must be in [0, " + std::to_string(limit) +
                            "] (0 = one per hardware thread; this machine has " + std::to_string(hw) + "), got ";
  for (const std::string& bad : {std::string("-1"), std::string("100000"), std::to_string(limit + 1)}) {
    expect_error(parse_command_line({"generate", "--prompt", "x", "--threads", bad}), range + bad, bad);
    expect_error(parse_command_line({"bench", "--threads", bad}), range + bad, bad);
  }
  const CommandLine over = parse_command_line({"generate", "--prompt", "x", "--threads", std::to_string(hw + 1)});
  ASSERT_TRUE(over.command.has_value()) << over.err;
  EXPECT_EQ(over.err, "specdec: warning: --threads " + std::to_string(hw + 1) + " is more than this machine's " +
                          std::to_string(hw) + " hardware threads; the extra threads only compete with each other");
  for (const std::string& fine : {std::string("0"), std::to_string(hw)}) {
    const CommandLine line = parse_command_line({"generate", "--prompt", "x", "--threads", fine});
    ASSERT_TRUE(line.command.has_value()) << line.err;
    EXPECT_EQ(line.err, "") << fine;
  }
}

TEST(Options, SeedsTakeTheWholeUnsignedRange) {
  const CommandLine line = parse_command_line({"generate", "--prompt", "x", "--seed", "18446744073709551615"});
  ASSERT_TRUE(line.command.has_value()) << line.err;
  EXPECT_EQ(std::get<specdec::cli::GenerateCommand>(*line.command).request.sampling.seed, ~uint64_t{0});
}

TEST(Options, HelpAnswersWithStatusZero) {
  const CommandLine help = parse_command_line({"generate", "--help"});
  EXPECT_FALSE(help.command.has_value());
  EXPECT_EQ(help.exit_status, 0);
  EXPECT_EQ(help.err, "");
  EXPECT_NE(help.out.find("--prompt"), std::string::npos) << help.out;
  EXPECT_NE(help.out.find("--spec-mode"), std::string::npos) << help.out;
}

TEST(Options, InfoTakesAModelFolder) {
  const CommandLine line = parse_command_line({"info", "--model", "/some/folder"});
  ASSERT_TRUE(line.command.has_value()) << line.err;
  EXPECT_EQ(std::get<specdec::cli::InfoCommand>(*line.command).model_dir, "/some/folder");
}

TEST(Options, AServeLineCarriesItsDraftsAndTheirLookup) {
  const CommandLine line =
      parse_command_line({"serve", "--draft", "ngram", "--draft", "/models/dflash", "--no-context-lookup"});
  ASSERT_TRUE(line.command.has_value()) << line.err;
  const auto& s = std::get<specdec::cli::ServeCommand>(*line.command);
  ASSERT_EQ(s.engine.drafts.size(), 2u);
  EXPECT_EQ(s.engine.drafts[1].path, "/models/dflash");
  for (const specdec::DraftSpec& d : s.engine.drafts) EXPECT_FALSE(d.context_lookup);
  const CommandLine plain = parse_command_line({"serve", "--draft", "/models/dflash"});
  ASSERT_TRUE(plain.command.has_value()) << plain.err;
  EXPECT_TRUE(std::get<specdec::cli::ServeCommand>(*plain.command).engine.drafts.at(0).context_lookup);
}

}  // namespace
