// POST /v1/completions and /v1/chat/completions: parse, plan, submit, and answer whole or as an
// SSE stream. A streaming client that goes away cancels its requests (Submission's destructor).
#pragma once

#include <httplib.h>

#include "server/completion_request.h"
#include "server/server_state.h"

namespace specdec::server {

void handle_completion(ServerState& state, Endpoint endpoint, const httplib::Request& req, httplib::Response& res);

}  // namespace specdec::server
