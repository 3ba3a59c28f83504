// specdec's library API: load a Hugging Face checkpoint folder once and generate text from any
// thread, plainly or with lossless speculative decoding. The `specdec` command is a client of
// these headers; they expose no internal type, so programs link the library without its
// internal headers.
#pragma once

#include "specdec/engine.h"
#include "specdec/generator.h"
#include "specdec/model_info.h"
#include "specdec/options.h"
#include "specdec/replay.h"
#include "specdec/request.h"
