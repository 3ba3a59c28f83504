// One HTTP request's generations in the engine. The engine calls on_event on its loop thread;
// the events go into an EventQueue that the connection thread drains. A Submission owns its
// engine requests: whatever it has not waited for when it ends (a client gone, an error) is
// cancelled and released, so a disconnect frees its rows and its results never pile up.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "server/metrics.h"
#include "specdec/engine.h"

namespace specdec::server {

struct ChoiceEvent {
  int index = 0;  // the choice
  std::string text;
  int tokens = 0;
  Finish finish = Finish::none;
  std::vector<TokenLogprob> logprobs;
  std::vector<TokenLogprob> prompt_logprobs;  // on the choice's first event, when asked for
};

class EventQueue {
 public:
  void push(ChoiceEvent event);
  // The next event, or nullopt after `timeout` without one.
  std::optional<ChoiceEvent> pop(std::chrono::milliseconds timeout);

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<ChoiceEvent> events_;
};

// Requests held by the server (running or waiting in the engine). The engine bounds its waiting
// queue (EngineConfig::max_queue); this only counts, so that a test can see every one released.
class Admission {
 public:
  void acquire(int n) { held_ += n; }
  void release(int n) { held_ -= n; }
  int held() const { return held_; }

 private:
  std::atomic<int> held_{0};
};

class Submission {
 public:
  // Submits the requests together, each streaming into `events` (when given). Throws ApiError:
  // 429 when the engine's waiting queue is full, 400 when the engine refuses one (none stays
  // queued then).
  Submission(Engine& engine, Admission& admission, Metrics& metrics, std::vector<GenerationRequest> requests,
             std::shared_ptr<EventQueue> events);
  ~Submission();
  Submission(const Submission&) = delete;
  Submission& operator=(const Submission&) = delete;

  size_t size() const { return ids_.size(); }
  // The finished result of request i (blocks until it finishes); recorded in the metrics.
  GenerationResult wait(size_t i);

 private:
  Engine& engine_;
  Admission& admission_;
  Metrics& metrics_;
  std::vector<int64_t> ids_;
  std::vector<bool> waited_;
  int admitted_ = 0;
};

}  // namespace specdec::server
