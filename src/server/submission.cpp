// Submission: admission against the queue bound, submit_all, and RAII cancellation.
#include "server/submission.h"

#include "server/api_error.h"

namespace specdec::server {

void EventQueue::push(ChoiceEvent event) {
  {
    std::lock_guard lock(mutex_);
    events_.push_back(std::move(event));
  }
  ready_.notify_one();
}

std::optional<ChoiceEvent> EventQueue::pop(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  if (!ready_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return std::nullopt;
  ChoiceEvent e = std::move(events_.front());
  events_.pop_front();
  return e;
}

Submission::Submission(Engine& engine, Admission& admission, Metrics& metrics, std::vector<GenerationRequest> requests,
                       std::shared_ptr<EventQueue> events)
    : engine_(engine), admission_(admission), metrics_(metrics) {
  const int n = static_cast<int>(requests.size());
  admission_.acquire(n);
  admitted_ = n;
  if (events)
    for (int i = 0; i < n; ++i)
      requests[i].on_event = [events, i](const GenerationEvent& e) {
        events->push({i, e.text, static_cast<int>(e.tokens.size()), e.finish, e.logprobs, e.prompt_logprobs});
      };
  try {
    ids_ = engine_.submit_all(std::move(requests));
  } catch (const QueueFull& e) {
    admission_.release(admitted_);
    throw ApiError(429, std::string("the server is busy: ") + e.what() + "; retry later", "server_overloaded", {},
                   "queue_full");
  } catch (const std::exception& e) {
    admission_.release(admitted_);
    throw ApiError(400, e.what(), "invalid_request_error");
  }
  waited_.assign(ids_.size(), false);
}

Submission::~Submission() {
  int abandoned = 0;
  for (size_t i = 0; i < ids_.size(); ++i) {
    if (waited_[i]) continue;
    // Cancel first so that its row frees at the next iteration; release drops the result then.
    try {
      engine_.cancel(ids_[i]);
      engine_.release(ids_[i]);
    } catch (...) {  // an engine that failed has nothing left to free
    }
    ++abandoned;
  }
  if (abandoned) metrics_.cancelled(abandoned);
  admission_.release(admitted_);
}

GenerationResult Submission::wait(size_t i) {
  GenerationResult r = engine_.wait(ids_[i]);
  waited_[i] = true;
  if (r.finish != Finish::cancelled) metrics_.finished(r);
  return r;
}

}  // namespace specdec::server
