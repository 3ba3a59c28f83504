// `specdec serve`: the HTTP server listens at once (GET /health answers 503) while the engine
// loads on another thread; SIGINT or SIGTERM stops it, cancelling what is still running.
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>

#include "cli/commands.h"
#include "specdec/chat_template.h"
#include "server/http_server.h"

namespace specdec::cli {

namespace {

// SIGINT and SIGTERM are blocked in every thread (threads inherit the mask) and taken by one
// thread with sigwait, which stops the server: no handler runs in an arbitrary thread.
sigset_t stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

// The chat renderer for the model folder's template (tokenizer_config.json or
// chat_template.jinja), with the folder's bos/eos tokens. A folder without one gets no renderer:
// /v1/chat/completions then answers 400 "this model has no chat template".
server::PromptRenderer chat_renderer(const std::string& model_dir) {
  std::shared_ptr<const ChatTemplate> chat;
  try {
    chat = std::make_shared<const ChatTemplate>(ChatTemplate::load(model_dir));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "specdec serve: no chat template (%s); /v1/chat/completions is off\n", e.what());
    return {};
  }
  return [chat](const nlohmann::json& messages, bool add_generation_prompt) {
    ChatRenderOptions options;
    options.add_generation_prompt = add_generation_prompt;
    // The template reads messages in the request's key order (tojson of tool calls).
    return chat->render(nlohmann::ordered_json::parse(messages.dump()), options);
  };
}

}  // namespace

void run_serve(const ServeCommand& c) {
  const sigset_t signals = stop_signals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::unique_ptr<Engine> engine;  // outlives the server, which only borrows it
  server::HttpServer http(c.server, chat_renderer(c.engine.model_dir));
  const int port = http.bind();
  std::fprintf(stderr, "specdec serve: listening on http://%s:%d (model %s, loading)\n", c.server.host.c_str(), port,
               c.server.served_model_name.c_str());
  std::string load_error;
  std::atomic<bool> served{false};
  // httplib ignores a stop before its accept loop runs: repeat it until run() has returned.
  auto stop = [&] {
    while (!served) {
      http.stop();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  };
  std::thread loader([&] {
    try {
      engine = std::make_unique<Engine>(c.engine);
      http.attach(*engine);
      const KvCapacity kv = engine->kv_capacity();
      const int context = engine->model_info().context_length;
      std::fprintf(stderr,
                   "specdec serve: ready on %s; KV cache %d blocks of %d (%lld tokens, %.2f GB): %lld rows at %d\n",
                   engine->device_name().c_str(), kv.blocks, kv.block_size, static_cast<long long>(kv.tokens),
                   kv.bytes / 1e9, static_cast<long long>(kv.rows_at(context)), context);
    } catch (const std::exception& e) {
      load_error = e.what();
      stop();
    }
  });
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    stop();
  });
  http.run();
  served = true;
  loader.join();
  // Wake the signal thread if the server stopped for another reason (a failed load).
  pthread_kill(waiter.native_handle(), SIGTERM);
  waiter.join();
  if (!load_error.empty()) throw std::runtime_error(load_error);
}

}  // namespace specdec::cli
