// The loop thread behind the public Engine: it owns the internal EngineCore, runs queued tasks
// (submits, cancels, method registrations) between iterations, steps while there is work, and
// hands finished requests' results to the threads waiting for them.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <type_traits>

#include "core/error.h"
#include "engine/engine_core.h"
#include "specdec/request.h"

namespace specdec {

class EngineLoop {
 public:
  // release_memory_when_idle: EngineConfig's, done on the loop thread after the iteration that
  // leaves the core idle and before the snapshot that shows it idle.
  explicit EngineLoop(std::unique_ptr<EngineCore> core, bool release_memory_when_idle = false);
  // Cancels what still runs (its last events are sent, its results kept), rejects queued tasks
  // and joins the thread.
  ~EngineLoop();
  EngineLoop(const EngineLoop&) = delete;
  EngineLoop& operator=(const EngineLoop&) = delete;

  // Runs fn(core) on the loop thread between iterations and returns what it returns, or rethrows
  // what it threw. Refused from the loop thread itself (an event callback), which would wait on
  // itself.
  template <typename Fn>
  auto call(Fn&& fn) -> std::invoke_result_t<Fn&, EngineCore&>;
  // Queues fn(core) without waiting; dropped when the loop is stopping.
  void post(std::function<void(EngineCore&)> fn);

  // Submits on the loop thread; the result is kept for wait().
  int64_t submit(Request request);
  // All or nothing: a bad request cancels the ones queued before it and throws.
  std::vector<int64_t> submit_all(std::vector<Request> requests);
  GenerationResult wait(int64_t id);
  // Drops the request's result now if it has one, else when it arrives.
  void release(int64_t id);
  // The core's counters as of its latest iteration (or task), without waiting for the loop.
  EngineCounters counters() const;

 private:
  // A queued task; called with nullptr when the loop stops before running it.
  using Task = std::function<void(EngineCore*)>;
  void enqueue(Task task);
  bool on_loop_thread() const { return std::this_thread::get_id() == thread_.get_id(); }
  void run();
  void step();
  void collect();
  // Tracks a request submitted on the loop thread, so that wait() finds it.
  void track(int64_t id);
  void fail_all(const std::string& why);
  void shut_down();
  void snapshot();  // copies the core's counters for counters(); loop thread only

  std::unique_ptr<EngineCore> core_;
  const bool release_memory_when_idle_;
  std::set<int64_t> live_;  // submitted and not yet collected; loop thread only
  bool broken_ = false;     // a step threw: the core is not stepped again; loop thread only

  mutable std::mutex mutex_;
  std::condition_variable work_;  // tasks queued or stopping
  std::condition_variable done_;  // a result arrived
  std::deque<Task> tasks_;
  bool stopping_ = false;
  bool stopped_ = false;
  std::string failure_;                                          // why the engine stopped serving, once a step threw
  std::map<int64_t, std::optional<GenerationResult>> outcomes_;  // submitted, not yet waited for
  std::set<int64_t> released_;                                   // running, nobody will wait: drop the result
  EngineCounters counters_;                                      // the latest snapshot
  std::thread thread_;                                           // last: it starts once everything above exists
};

template <typename Fn>
auto EngineLoop::call(Fn&& fn) -> std::invoke_result_t<Fn&, EngineCore&> {
  using R = std::invoke_result_t<Fn&, EngineCore&>;
  SPECDEC_CHECK(!on_loop_thread(), "the engine cannot be waited on from its own thread (an event callback)");
  // The task leaves its value or exception in these, and `done` only says that it has run. Not
  // promise::set_exception: libstdc++ copies the exception_ptr into the shared state and drops
  // its parameter only after the caller is woken, so the loop thread may release the last
  // reference and destroy the exception after the caller has read it. That is ordered by the
  // exception's atomic reference count, but inside uninstrumented libstdc++, so ThreadSanitizer
  // reports the caller's read of what() and the loop thread's delete as a data race. Here the
  // loop thread has let go of everything before it signals: the caller alone ends the exception.
  std::conditional_t<std::is_void_v<R>, bool, std::optional<R>> value{};
  std::exception_ptr error;
  std::promise<void> done;
  std::future<void> ran = done.get_future();
  // fn and the slots are referenced, not copied: this call waits until the task has run or been
  // rejected, and a rejected task is never run afterwards.
  enqueue([&](EngineCore* core) {
    try {
      SPECDEC_CHECK(core != nullptr, "the engine is shutting down");
      if constexpr (std::is_void_v<R>) {
        fn(*core);
      } else {
        value.emplace(fn(*core));
      }
    } catch (...) {
      error = std::current_exception();
    }
    done.set_value();
  });
  ran.get();
  if (error) std::rethrow_exception(error);
  if constexpr (!std::is_void_v<R>) return std::move(*value);
}

}  // namespace specdec
