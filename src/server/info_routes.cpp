// Small read-only routes, each answering from the engine's public API or the server's metrics.
#include "server/info_routes.h"

#include <chrono>

#include "server/api_error.h"
#include "server/request_fields.h"

namespace specdec::server {

namespace {

using nlohmann::json;

void send_json(httplib::Response& res, const json& j) {
  res.set_content(j.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

json body_object(const httplib::Request& req) {
  json body;
  try {
    body = json::parse(req.body);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number beyond double
    throw ApiError(400, std::string("the request body is not valid JSON: ") + e.what(), "invalid_request_error");
  }
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object", "invalid_request_error");
  return body;
}

void tokenize(ServerState& state, const httplib::Request& req, httplib::Response& res) {
  const Engine& engine = state.loaded_engine();
  const json body = body_object(req);
  const std::optional<std::string> content = read_string(body, "content");
  if (!content) throw invalid_field("content", "'content' is required");
  // The engine's encoder parses special tokens and adds none: add_special changes nothing here.
  read_bool(body, "add_special");
  const bool with_pieces = read_bool(body, "with_pieces").value_or(false);
  const std::vector<int32_t> ids = engine.encode(*content, read_bool(body, "parse_special").value_or(true));
  json tokens = json::array();
  for (int32_t id : ids) {
    if (with_pieces)
      tokens.push_back({{"id", id}, {"piece", engine.decode({id}, false)}});
    else
      tokens.push_back(id);
  }
  send_json(res, {{"tokens", tokens}});
}

void detokenize(ServerState& state, const httplib::Request& req, httplib::Response& res) {
  const Engine& engine = state.loaded_engine();
  const json body = body_object(req);
  auto it = body.find("tokens");
  if (it == body.end() || !it->is_array()) throw invalid_field("tokens", "'tokens' must be an array of token ids");
  const int vocab = engine.model_info().tokenizer_vocab_size;
  std::vector<int32_t> ids;
  for (const json& t : *it) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= vocab)
      throw invalid_field("tokens", "'tokens' must hold token ids from 0 to " + std::to_string(vocab - 1));
    ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  send_json(res, {{"content", engine.decode(ids, false)}});
}

void models(ServerState& state, httplib::Response& res) {
  const Engine& engine = state.loaded_engine();
  static const int64_t created =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  json model = {{"id", state.options.served_model_name},
                {"object", "model"},
                {"created", created},
                {"owned_by", "specdec"},
                {"root", engine.model_info().model_dir},
                {"max_model_len", engine.model_info().context_length}};
  send_json(res, {{"object", "list"}, {"data", json::array({model})}});
}

void metrics(ServerState& state, httplib::Response& res) {
  const Engine* engine = state.engine.load();
  const std::optional<EngineStats> stats = engine ? std::optional<EngineStats>(engine->stats()) : std::nullopt;
  res.set_content(state.metrics.render(stats ? &*stats : nullptr), "text/plain; version=0.0.4");
}

}  // namespace

void add_info_routes(httplib::Server& http, ServerState& state) {
  http.Get("/health", [&state](const httplib::Request&, httplib::Response& res) {
    if (!state.engine.load()) throw ApiError(503, "the model is loading", "server_error", {}, "model_loading");
    send_json(res, json::object());
  });
  http.Get("/v1/models", [&state](const httplib::Request&, httplib::Response& res) { models(state, res); });
  http.Get("/version", [](const httplib::Request&, httplib::Response& res) {
    send_json(res, {{"version", SPECDEC_VERSION}, {"name", "specdec"}});
  });
  http.Get("/metrics", [&state](const httplib::Request&, httplib::Response& res) { metrics(state, res); });
  http.Post("/tokenize", [&state](const httplib::Request& req, httplib::Response& res) { tokenize(state, req, res); });
  http.Post("/detokenize",
            [&state](const httplib::Request& req, httplib::Response& res) { detokenize(state, req, res); });
}

}  // namespace specdec::server
