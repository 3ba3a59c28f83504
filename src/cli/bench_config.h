// The engine configuration of `specdec bench`'s runs, apart from the runs so that tests check it.
#pragma once

#include "cli/options.h"

namespace specdec::cli {

// The engine configuration of every run of `o` on `model`: rows, batch tokens and (without
// --kv-memory) a KV cache that holds the largest run, plain or speculative, at full length.
EngineConfig bench_engine_config(const BenchCommand& o, const ModelInfo& model);

}  // namespace specdec::cli
