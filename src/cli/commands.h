// The subcommands of `specdec`. Each registers its options on the app and runs when chosen.
#pragma once

#include <CLI/CLI.hpp>

#include "specdec/specdec.h"

namespace specdec::cli {

// --model, --device, --threads, --cpu-isa, --fast-gpu
void add_common(CLI::App& cmd, ModelOptions& options);
void add_generate(CLI::App& app);
void add_info(CLI::App& app);
void add_bench(CLI::App& app);

}  // namespace specdec::cli
