// The server's Prometheus metrics (names in vLLM's style, prefixed `specdec:`): request and token
// counters and TTFT / inter-token / end-to-end latency histograms kept here, and the engine's
// state from its public stats (running and waiting requests, KV usage, prefix-cache queries and
// hits, preemptions, speculation per method: drafted, accepted, emitted, accepted per window
// position). Updated from connection threads; rendered as Prometheus text for GET /metrics.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "specdec/engine.h"
#include "specdec/request.h"

namespace specdec::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);
  // `name`_bucket / _sum / _count lines, with `labels` (e.g. model_name="x") on each.
  std::string render(const std::string& name, const std::string& help, const std::string& labels) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative; one more for +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

class Metrics {
 public:
  explicit Metrics(std::string model_name);
  // A request that ran to its end (any finish but cancelled): its tokens, latencies, speculation.
  void finished(const GenerationResult& result);
  void cancelled(int count);  // requests ended by their client (a disconnect)
  void failed(int status);    // an error response, by status
  // The server's counters and histograms with the engine's state (null while it loads).
  std::string render(const EngineStats* engine) const;

 private:
  std::string counters(const std::string& labels) const;
  static std::string engine_state(const EngineStats& engine, const std::string& labels);

  mutable std::mutex mutex_;
  std::string model_name_;
  std::map<std::string, int64_t> finished_by_reason_;
  std::map<int, int64_t> errors_by_status_;
  int64_t prompt_tokens_ = 0, generation_tokens_ = 0;
  Histogram ttft_, inter_token_, e2e_;
};

}  // namespace specdec::server
