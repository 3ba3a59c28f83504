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
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "specdec: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
