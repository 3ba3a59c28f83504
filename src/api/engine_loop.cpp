// The engine's loop thread: tasks between iterations, steps while rows run, results collected
// after each iteration, and an orderly stop (cancel, collect, reject what is still queued).
#include "api/engine_loop.h"

#include "api/convert.h"
#include "core/heap.h"

namespace specdec {

EngineLoop::EngineLoop(std::unique_ptr<EngineCore> core, bool release_memory_when_idle)
    : core_(std::move(core)), release_memory_when_idle_(release_memory_when_idle), thread_([this] { run(); }) {}

EngineLoop::~EngineLoop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_.notify_all();
  thread_.join();
}

void EngineLoop::enqueue(Task task) {
  {
    std::lock_guard lock(mutex_);
    if (!stopped_) {
      tasks_.push_back(std::move(task));
      work_.notify_one();
      return;
    }
  }
  task(nullptr);
}

void EngineLoop::post(std::function<void(EngineCore&)> fn) {
  enqueue([fn = std::move(fn)](EngineCore* core) {
    if (core) fn(*core);
  });
}

int64_t EngineLoop::submit(Request request) {
  std::vector<Request> one;
  one.push_back(std::move(request));
  return submit_all(std::move(one)).front();
}

std::vector<int64_t> EngineLoop::submit_all(std::vector<Request> requests) {
  return call([this, &requests](EngineCore& core) {
    {
      std::lock_guard lock(mutex_);
      SPECDEC_CHECK(failure_.empty(), "the engine stopped serving after an error: ", failure_);
    }
    std::vector<int64_t> ids;
    try {
      for (Request& r : requests) ids.push_back(core.submit(std::move(r)));
    } catch (...) {
      for (int64_t id : ids) core.cancel(id);
      for (int64_t id : ids) core.take_result(id);
      throw;
    }
    for (int64_t id : ids) track(id);
    return ids;
  });
}

void EngineLoop::track(int64_t id) {
  live_.insert(id);
  std::lock_guard lock(mutex_);
  outcomes_.emplace(id, std::nullopt);
}

GenerationResult EngineLoop::wait(int64_t id) {
  SPECDEC_CHECK(!on_loop_thread(), "the engine cannot be waited on from its own thread (an event callback)");
  std::unique_lock lock(mutex_);
  auto known = [&] { return outcomes_.find(id) != outcomes_.end(); };
  SPECDEC_CHECK(known(), "no request ", id, " to wait for (never submitted, or its result was already taken)");
  // Every tracked request gets an outcome: it finishes, fails with the engine, or is cancelled
  // when the loop stops.
  done_.wait(lock, [&] { return !known() || outcomes_.at(id).has_value(); });
  SPECDEC_CHECK(known(), "request ", id, "'s result was taken by another wait");
  auto it = outcomes_.find(id);
  GenerationResult result = std::move(*it->second);
  outcomes_.erase(it);
  return result;
}

void EngineLoop::release(int64_t id) {
  std::lock_guard lock(mutex_);
  auto it = outcomes_.find(id);
  if (it == outcomes_.end()) return;
  if (it->second.has_value()) {
    outcomes_.erase(it);
  } else {
    released_.insert(id);
  }
}

void EngineLoop::run() {
  snapshot();
  bool had_work = false;  // the core was not idle after the previous pass
  for (;;) {
    std::deque<Task> tasks;
    {
      std::unique_lock lock(mutex_);
      work_.wait(lock, [&] { return stopping_ || !tasks_.empty() || (!broken_ && !core_->idle()); });
      if (stopping_) break;
      tasks.swap(tasks_);
    }
    for (Task& task : tasks) task(core_.get());
    collect();  // a cancel finishes its request at once
    const bool stepping = !broken_ && !core_->idle();
    if (stepping) step();
    const bool has_work = !broken_ && !core_->idle();
    // Once per stretch of work, whether its last request finished or was cancelled.
    if ((had_work || stepping) && !has_work && release_memory_when_idle_) release_free_heap_memory();
    had_work = has_work;
    snapshot();
  }
  shut_down();
}

void EngineLoop::snapshot() {
  EngineCounters c = core_->stats();
  std::lock_guard lock(mutex_);
  counters_ = std::move(c);
}

EngineCounters EngineLoop::counters() const {
  std::lock_guard lock(mutex_);
  return counters_;
}

void EngineLoop::step() {
  try {
    core_->step();
  } catch (const std::exception& e) {
    // The core's state after a failed iteration is unknown: its requests end with the error and
    // no request is admitted again.
    fail_all(e.what());
    return;
  }
  collect();
}

void EngineLoop::collect() {
  bool any = false;
  for (auto it = live_.begin(); it != live_.end();) {
    std::optional<RequestResult> r = core_->take_result(*it);
    if (!r) {
      ++it;
      continue;
    }
    {
      std::lock_guard lock(mutex_);
      if (released_.erase(*it)) {
        outcomes_.erase(*it);
      } else {
        outcomes_[*it] = public_result(std::move(*r));
      }
    }
    it = live_.erase(it);
    any = true;
  }
  if (any) done_.notify_all();
}

void EngineLoop::fail_all(const std::string& why) {
  broken_ = true;
  {
    std::lock_guard lock(mutex_);
    failure_ = why;
    for (int64_t id : live_) {
      GenerationResult r;
      r.request_id = id;
      r.finish = Finish::error;
      r.error = str_cat("the engine failed: ", why);
      if (released_.erase(id)) {
        outcomes_.erase(id);
      } else {
        outcomes_[id] = std::move(r);
      }
    }
  }
  live_.clear();
  done_.notify_all();
}

void EngineLoop::shut_down() {
  if (!broken_) {
    try {
      for (int64_t id : std::set<int64_t>(live_)) core_->cancel(id);
      collect();
    } catch (const std::exception& e) {
      fail_all(e.what());
    }
  }
  if (!live_.empty()) fail_all("a request was still running when the engine stopped");
  std::deque<Task> rejected;
  {
    std::lock_guard lock(mutex_);
    stopped_ = true;
    rejected.swap(tasks_);
  }
  for (Task& task : rejected) task(nullptr);
}

}  // namespace specdec
