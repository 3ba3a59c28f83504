// specdec: the command. Every subcommand is a thin client of the library; errors end with a
// one-line message naming the cause and exit status 1.
#include <cstdio>
#include <exception>

#include "cli/commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"specdec: LLM inference with lossless speculative decoding"};
  app.require_subcommand(1);
  specdec::cli::add_generate(app);
  specdec::cli::add_info(app);
  specdec::cli::add_bench(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and friends end with status 0 and print what they print; a real parse error gets
    // the same single line and status 1 as every other error.
    if (e.get_exit_code() == 0) return app.exit(e);
    std::fprintf(stderr, "specdec: error: %s (see --help)\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "specdec: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
