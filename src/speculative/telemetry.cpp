// Counting, merging and reporting the speculative figures of requests and methods.
#include "speculative/telemetry.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace specdec {
namespace {

void add_histogram(std::vector<int64_t>& into, const std::vector<int64_t>& from) {
  if (into.size() < from.size()) into.resize(from.size(), 0);
  for (size_t i = 0; i < from.size(); ++i) into[i] += from[i];
}

void check_histogram(const std::vector<int64_t>& h, int64_t total, const char* name,
                     const char* of) {
  SPECDEC_CHECK(std::accumulate(h.begin(), h.end(), int64_t{0}) == total, "telemetry: ", name,
                " sums to ", std::accumulate(h.begin(), h.end(), int64_t{0}), " but ", of, " is ",
                total);
  for (size_t i = 0; i < h.size(); ++i) {
    SPECDEC_CHECK(h[i] >= 0, "telemetry: ", name, "[", i, "] is negative");
    SPECDEC_CHECK(i == 0 || h[i] <= h[i - 1], "telemetry: ", name, "[", i, "] = ", h[i],
                  " exceeds ", name, "[", i - 1, "] = ", h[i - 1]);
  }
}

}  // namespace

void SpecTelemetry::record_round(int drafted_now, int accepted_now) {
  SPECDEC_CHECK(accepted_now >= 0 && accepted_now <= drafted_now, "telemetry: a round accepted ",
                accepted_now, " of ", drafted_now, " drafts");
  const auto d = static_cast<size_t>(drafted_now), a = static_cast<size_t>(accepted_now);
  if (drafted_at.size() < d) drafted_at.resize(d, 0);
  if (accepted_at.size() < d) accepted_at.resize(d, 0);
  for (size_t i = 0; i < d; ++i) ++drafted_at[i];
  for (size_t i = 0; i < a; ++i) ++accepted_at[i];
  drafted += drafted_now;
  accepted += accepted_now;
  rounds += 1;
  emitted += accepted_now + 1;
}

double SpecTelemetry::acceptance_rate() const {
  return drafted == 0 ? 0.0 : static_cast<double>(accepted) / static_cast<double>(drafted);
}

double SpecTelemetry::mean_accepted_length() const {
  return rounds == 0 ? 0.0 : static_cast<double>(emitted) / static_cast<double>(rounds);
}

std::vector<double> SpecTelemetry::acceptance_by_position() const {
  std::vector<double> out(drafted_at.size(), 0.0);
  for (size_t i = 0; i < drafted_at.size(); ++i) {
    const int64_t a = i < accepted_at.size() ? accepted_at[i] : 0;
    out[i] = drafted_at[i] == 0 ? 0.0 : static_cast<double>(a) / static_cast<double>(drafted_at[i]);
  }
  return out;
}

void SpecTelemetry::merge(const SpecTelemetry& other) {
  if (method.empty()) {
    method = other.method;
  } else if (!other.method.empty() && other.method != method) {
    method = "mixed";
  }
  drafted += other.drafted;
  accepted += other.accepted;
  rounds += other.rounds;
  emitted += other.emitted;
  target_forwards += other.target_forwards;
  add_histogram(drafted_at, other.drafted_at);
  add_histogram(accepted_at, other.accepted_at);
  draft_ns += other.draft_ns;
  verify_ns += other.verify_ns;
}

void SpecTelemetry::check() const {
  SPECDEC_CHECK(drafted >= 0 && accepted >= 0 && rounds >= 0 && emitted >= 0 &&
                    target_forwards >= 0 && draft_ns >= 0 && verify_ns >= 0,
                "telemetry: a counter is negative");
  SPECDEC_CHECK(accepted <= drafted, "telemetry: accepted ", accepted, " exceeds drafted ",
                drafted);
  SPECDEC_CHECK(emitted == accepted + rounds, "telemetry: emitted ", emitted,
                " differs from accepted ", accepted, " + rounds ", rounds);
  check_histogram(drafted_at, drafted, "drafted_at", "drafted");
  check_histogram(accepted_at, accepted, "accepted_at", "accepted");
  for (size_t i = 0; i < accepted_at.size(); ++i) {
    const int64_t d = i < drafted_at.size() ? drafted_at[i] : 0;
    SPECDEC_CHECK(accepted_at[i] <= d, "telemetry: accepted_at[", i, "] = ", accepted_at[i],
                  " exceeds drafted_at[", i, "] = ", d);
  }
}

nlohmann::json SpecTelemetry::to_json() const {
  return nlohmann::json{
      {"method", method},
      {"drafted", drafted},
      {"accepted", accepted},
      {"rounds", rounds},
      {"emitted", emitted},
      {"target_forwards", target_forwards},
      {"acceptance_rate", acceptance_rate()},
      {"mean_accepted_length", mean_accepted_length()},
      {"drafted_per_position", drafted_at},
      {"accepted_per_position", accepted_at},
      {"acceptance_per_position", acceptance_by_position()},
      {"draft_ns", draft_ns},
      {"verify_ns", verify_ns},
  };
}

void SpecTelemetryByMethod::add(const SpecTelemetry& request) {
  SpecTelemetry& into = by_method_[request.method];
  into.merge(request);
}

SpecTelemetry SpecTelemetryByMethod::method(const std::string& name) const {
  const auto it = by_method_.find(name);
  if (it != by_method_.end()) return it->second;
  SpecTelemetry empty;
  empty.method = name;
  return empty;
}

SpecTelemetry SpecTelemetryByMethod::total() const {
  SpecTelemetry sum;
  for (const auto& [name, t] : by_method_) sum.merge(t);
  return sum;
}

nlohmann::json SpecTelemetryByMethod::to_json() const {
  nlohmann::json methods = nlohmann::json::object();
  for (const auto& [name, t] : by_method_) methods[name] = t.to_json();
  return nlohmann::json{{"methods", methods}, {"total", total().to_json()}};
}

}  // namespace specdec
