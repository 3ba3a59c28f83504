// HttpServer: the OpenAI-compatible HTTP front of an Engine. A pool of connection threads parses
// requests, submits them and streams their events back; the engine's one loop thread does all
// the model work. The server listens before the engine is loaded (GET /health says 503 until
// attach), so that orchestrators see it come up.
#pragma once

#include <memory>

#include "server/server_options.h"
#include "specdec/engine.h"

namespace specdec::server {

class HttpServer {
 public:
  HttpServer(ServerOptions options, PromptRenderer render);
  ~HttpServer();  // stops listening and joins the connection threads
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds options.host:options.port (port 0: any free port); returns the port. Throws on failure.
  int bind();
  // Serves on the calling thread until stop(). Call bind() first.
  void run();
  // Serves on a thread of its own (joined by the destructor). Call bind() first.
  void start();
  void stop();
  // The loaded engine (it must outlive this server): from now on requests are served.
  void attach(Engine& engine);
  // Requests the server holds now (running or waiting): 0 once every client is answered or gone.
  int held_requests() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace specdec::server
