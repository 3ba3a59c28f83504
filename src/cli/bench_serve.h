// `specdec bench-serve`: streamed load against an OpenAI-compatible server (bench_serve.cpp). It
// reads its own flags, so that the command line's parser (options.h) stays as it is.
#pragma once

#include <string>
#include <vector>

namespace specdec::cli {

// args: what follows `bench-serve`. Returns the exit status (0, or CLI11's for bad flags).
int run_bench_serve(const std::vector<std::string>& args);

}  // namespace specdec::cli
