// The subcommands of `specdec`, each run from its parsed command (options.h) as a client of the
// public library API only.
#pragma once

#include "cli/options.h"

namespace specdec::cli {

void run_generate(const GenerateCommand& command);
void run_info(const InfoCommand& command);
void run_bench(const BenchCommand& command);
void run_chat_template(const ChatTemplateCommand& command);
void run_serve(const ServeCommand& command);

}  // namespace specdec::cli
