// The routes besides the completions: GET /health, /v1/models, /version, /metrics and
// POST /tokenize, /detokenize (llama-server's shapes).
#pragma once

#include <httplib.h>

#include "server/server_state.h"

namespace specdec::server {

void add_info_routes(httplib::Server& http, ServerState& state);

}  // namespace specdec::server
