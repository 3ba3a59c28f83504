// HttpServer on cpp-httplib: routes, API-key check, and every failure (a thrown ApiError, an
// unknown route, a body over the limit, an unexpected exception) turned into OpenAI's error JSON.
#include "server/http_server.h"

#include <httplib.h>

#include <sys/socket.h>

#include <algorithm>
#include <stdexcept>
#include <thread>

#include "server/api_error.h"
#include "server/completion_routes.h"
#include "server/generation_plan.h"
#include "server/info_routes.h"
#include "server/server_state.h"

namespace specdec::server {

using nlohmann::json;

Engine& ServerState::loaded_engine() const {
  Engine* e = engine.load();
  if (!e) throw ApiError(503, "the model is loading, retry later", "server_error", {}, "model_loading");
  return *e;
}

void ServerState::check_model(const std::string& requested) const {
  if (!requested.empty() && requested != options.served_model_name)
    throw ApiError(404, "The model `" + requested + "` does not exist.", "invalid_request_error", "model",
                   "model_not_found");
}

struct HttpServer::Impl {
  Impl(ServerOptions options, PromptRenderer render) : state(std::move(options), std::move(render)) {}
  void add_routes();
  void add_error_handling();
  void add_auth();

  ServerState state;
  httplib::Server http;
  int listen_socket = -1;  // the listening socket, once bound (set by the socket-options hook)
  std::thread thread;  // start(): the listening thread
};

namespace {

void send_error(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

// GET /health, /metrics and /version answer without the key, as monitoring probes expect.
bool needs_key(const std::string& path) { return path != "/health" && path != "/metrics" && path != "/version"; }

}  // namespace

void HttpServer::Impl::add_routes() {
  http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    handle_completion(state, Endpoint::completions, req, res);
  });
  http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    handle_completion(state, Endpoint::chat, req, res);
  });
  add_info_routes(http, state);
}

void HttpServer::Impl::add_error_handling() {
  http.set_exception_handler([this](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    try {
      std::rethrow_exception(ep);
    } catch (const ApiError& e) {
      send_error(res, e.status(), e.body());
    } catch (const std::exception& e) {
      send_error(res, 500, error_body(std::string("internal error: ") + e.what(), "server_error"));
    } catch (...) {
      send_error(res, 500, error_body("internal error", "server_error"));
    }
    state.metrics.failed(res.status);
  });
  // Called for every status >= 400; the routes' own errors already have their body.
  http.set_error_handler(
      httplib::Server::HandlerWithResponse([this](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        std::string message = "HTTP error " + std::to_string(res.status);
        std::string type = "invalid_request_error", code;
        if (res.status == 404) {
          message = "Not found: " + req.method + " " + req.path;
          code = "not_found";
        } else if (res.status == 413) {
          message = "the request body is larger than the server's limit of " +
                    std::to_string(state.options.max_body_bytes) + " bytes";
          code = "payload_too_large";
        }
        send_error(res, res.status, error_body(message, type, {}, code));
        state.metrics.failed(res.status);
        return httplib::Server::HandlerResponse::Handled;
      }));
}

void HttpServer::Impl::add_auth() {
  if (state.options.api_key.empty()) return;
  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!needs_key(req.path) || req.get_header_value("Authorization") == "Bearer " + state.options.api_key)
      return httplib::Server::HandlerResponse::Unhandled;
    send_error(res, 401,
               error_body("Incorrect or missing API key: send it as 'Authorization: Bearer KEY'",
                          "invalid_request_error", {}, "invalid_api_key"));
    state.metrics.failed(401);
    return httplib::Server::HandlerResponse::Handled;
  });
}

namespace {

void widen_accept_queue(int sock, const ServerOptions& o) {
  // httplib listens with an accept queue of 5 connections. When more clients connect at once
  // than the queue holds, the kernel drops their handshakes and the clients see failed reads;
  // a queue as long as the connections the server admits keeps a burst of clients whole. A
  // second listen() on a listening socket only changes its queue length.
  const int wanted = std::max(SOMAXCONN, o.max_rows + std::max(o.max_queue, 0) + 8);
  if (sock >= 0 && ::listen(sock, wanted) != 0)
    throw std::runtime_error("cannot set the accept queue of " + o.host + " to " + std::to_string(wanted) +
                             " connections");
}

}  // namespace

HttpServer::HttpServer(ServerOptions options, PromptRenderer render) {
  if (options.served_model_name.empty()) options.served_model_name = "default";
  impl_ = std::make_unique<Impl>(std::move(options), std::move(render));
  const ServerOptions& o = impl_->state.options;
  // Each streaming client holds a connection thread for its whole stream: enough threads for
  // every request the admission bound lets in, plus a few for probes and refusals.
  const size_t threads = o.http_threads > 0 ? size_t(o.http_threads) : size_t(o.max_rows + o.max_queue + 8);
  // httplib owns the queue it gets from this factory (it deletes it when listening ends).
  impl_->http.new_task_queue = [threads] { return std::make_unique<httplib::ThreadPool>(threads).release(); };
  impl_->http.set_payload_max_length(o.max_body_bytes);
  // httplib's own option (address reuse, so a restarted server can bind at once), and the socket
  // kept so that bind() can widen its accept queue.
  impl_->http.set_socket_options([impl = impl_.get()](int sock) {
    const int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    impl->listen_socket = sock;
  });
  impl_->add_routes();
  impl_->add_error_handling();
  impl_->add_auth();
}

HttpServer::~HttpServer() {
  stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

int HttpServer::bind() {
  const ServerOptions& o = impl_->state.options;
  int port = o.port;
  if (port == 0) {
    port = impl_->http.bind_to_any_port(o.host);
    if (port <= 0) throw std::runtime_error("cannot listen on " + o.host + ": no free port");
  } else if (!impl_->http.bind_to_port(o.host, o.port)) {
    throw std::runtime_error("cannot listen on " + o.host + ":" + std::to_string(o.port) +
                             " (is the port in use, or the host not local?)");
  }
  widen_accept_queue(impl_->listen_socket, o);
  return port;
}

void HttpServer::run() { impl_->http.listen_after_bind(); }

void HttpServer::start() {
  impl_->thread = std::thread([this] { run(); });
  // The socket is bound already (connections queue in its backlog); wait for the accept loop so
  // that a caller's stop() cannot come before it and be missed.
  for (int i = 0; i < 500 && !impl_->http.is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

void HttpServer::stop() { impl_->http.stop(); }

void HttpServer::attach(Engine& engine) {
  impl_->state.end_of_turn = end_of_turn_tokens(impl_->state.render, engine);
  impl_->state.engine = &engine;  // publishes end_of_turn with it
}

int HttpServer::held_requests() const { return impl_->state.admission.held(); }

}  // namespace specdec::server
