// specdec: the command. Every subcommand is a thin client of the library; errors end with a
// one-line message naming the cause and exit status 1.
#include <stdexcept>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "cli/commands.h"
#ifndef SPECDEC_NO_HTTP_SERVER
#include "cli/bench_serve.h"
#endif

namespace {

struct Run {
  void operator()(const specdec::cli::GenerateCommand& c) const { specdec::cli::run_generate(c); }
  void operator()(const specdec::cli::InfoCommand& c) const { specdec::cli::run_info(c); }
  void operator()(const specdec::cli::BenchCommand& c) const { specdec::cli::run_bench(c); }
  void operator()(const specdec::cli::ChatTemplateCommand& c) const { specdec::cli::run_chat_template(c); }
#ifdef SPECDEC_NO_HTTP_SERVER
  void operator()(const specdec::cli::ServeCommand&) const {
    throw std::runtime_error("this build has no HTTP server: cpp-httplib was not found when it was configured");
  }
#else
  void operator()(const specdec::cli::ServeCommand& c) const { specdec::cli::run_serve(c); }
#endif
};

}  // namespace

int main(int argc, char** argv) {
  // bench-serve is an HTTP client with flags of its own, read by its own parser.
  if (argc > 1 && std::string(argv[1]) == "bench-serve") {
#ifdef SPECDEC_NO_HTTP_SERVER
    std::fprintf(stderr, "specdec: error: this build has no HTTP client: cpp-httplib was not found\n");
    return 1;
#else
    try {
      return specdec::cli::run_bench_serve(std::vector<std::string>(argv + 2, argv + argc));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "specdec: error: %s\n", e.what());
      return 1;
    }
#endif
  }
  const specdec::cli::CommandLine line =
      specdec::cli::parse_command_line(std::vector<std::string>(argv + 1, argv + argc));
  std::fputs(line.out.c_str(), stdout);
  if (!line.err.empty()) std::fprintf(stderr, "%s\n", line.err.c_str());
  if (!line.command) return line.exit_status;
  try {
    std::visit(Run{}, *line.command);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "specdec: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
