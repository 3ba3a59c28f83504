// The `specdec` command line read into typed commands: every flag checked and every file named
// on it (a prompt, a bench suite) read before a model is loaded, so that a bad command line
// fails at once with one line naming the flag, and tests can check that in-process.
#pragma once

#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "cli/bench_suite.h"
#include "cli/serve_options.h"
#include "specdec/specdec.h"

namespace specdec::cli {

struct GenerateCommand {
  EngineConfig engine;      // engine.drafts holds the --draft method, if any
  GenerateOptions request;  // request.speculative.draft names it
  std::string prompt;       // --prompt, or the text of --prompt-file
  bool json = false;
};

struct InfoCommand {
  std::string model_dir;
};

struct BenchCommand {
  EngineConfig engine;              // engine.drafts: one method per --draft, in order
  std::vector<std::string> drafts;  // the --draft values, as given
  std::vector<int> batches{1, 4, 8, 16};
  int prompt_tokens = 128;
  int gen_tokens = 64;
  int num_draft = 0;
  int spec_batch = 8;
  std::vector<SuitePrompt> suite;
  bool json = false;
  bool skip_plain = false;
  int repeats = 5;
  bool adaptive = true;
  VerifyMode mode = VerifyMode::exact;  // --spec-mode: how the speculative runs verify
  bool replay = false;
  double replay_window_cost = 1.0;        // --replay: scale of a window's cost beyond a plain step
  std::vector<double> replay_forward_ms;  // --replay: target forward of 1, 2, ... tokens instead of measured
  std::vector<double> replay_draft_ms;    // --replay: a draft call's fixed and per-step cost instead of measured
  int replay_repeats = 15;                // --replay: calls timed per measurement
  int prefix_tokens = 0;                  // --prefix-tokens: the prefix-cache measurement's shared prefix
  std::vector<std::string> modes;         // --modes: GPU kernel modes of the plain table ("fast", "invariant")
  // Every field set, none from the model: greedy unless --temperature; seeded, so that plain
  // and speculative runs draw alike.
  SamplingOptions sampling;
};

struct ChatTemplateCommand {
  std::string template_file;  // a .jinja file, or a model folder whose template to use
  std::string messages_file;  // a JSON array of messages, or an object with "messages" (and extras)
  bool add_generation_prompt = true;
  std::optional<std::string> bos, eos;  // unset: the model folder's, or empty
};

using Command = std::variant<GenerateCommand, InfoCommand, BenchCommand, ChatTemplateCommand, ServeCommand>;

struct CommandLine {
  std::optional<Command> command;  // what to run; empty when the line is answered already
  int exit_status = 0;             // without a command: 0 after --help, 1 after an error
  std::string out;                 // for stdout (--help)
  std::string err;                 // for stderr: "specdec: error: <cause>", or with a command a warning
};

// args: the words after the program name.
CommandLine parse_command_line(const std::vector<std::string>& args);

}  // namespace specdec::cli
