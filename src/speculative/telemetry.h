// Speculative-decoding telemetry: per-request counters (drafted, accepted, rounds, emitted,
// target forwards, per-draft-position histograms, drafting and verifying time), their merge into
// per-method totals, and their JSON form for results, the server and benchmarks.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace specdec {

// Invariants (check() enforces them; record_round keeps them):
//   accepted <= drafted; emitted == accepted + rounds (each round emits its accepted drafts and
//   one target token); drafted_at / accepted_at sum to drafted / accepted and never increase
//   with the position (a draft at position i implies drafts at 0..i-1, likewise accepts).
struct SpecTelemetry {
  std::string method;                // the draft method; "mixed" after merging different methods
  int64_t drafted = 0;               // draft tokens proposed
  int64_t accepted = 0;              // draft tokens accepted by the verifier
  int64_t rounds = 0;                // verify rounds (a round with 0 drafts is a plain step)
  int64_t emitted = 0;               // tokens the verifier emitted: accepted drafts + one per round
  int64_t target_forwards = 0;       // target forwards the request took part in
  std::vector<int64_t> drafted_at;   // [i]: rounds that proposed a draft at window position i
  std::vector<int64_t> accepted_at;  // [i]: rounds that accepted the draft at position i
  int64_t draft_ns = 0;              // time spent drafting for this request
  int64_t verify_ns = 0;             // time spent in the target forward and the verifier

  // One verify round: `drafted` drafts proposed, the first `accepted` of them accepted.
  // Throws unless 0 <= accepted <= drafted.
  void record_round(int drafted, int accepted);

  // accepted / drafted; 0 when nothing was drafted.
  double acceptance_rate() const;
  // emitted / rounds: tokens per verify round; 0 before the first round.
  double mean_accepted_length() const;
  // accepted_at[i] / drafted_at[i] for each position.
  std::vector<double> acceptance_by_position() const;

  // Adds another request's (or group's) counters to these.
  void merge(const SpecTelemetry& other);
  // Throws specdec::Error naming the broken invariant.
  void check() const;
  nlohmann::json to_json() const;
};

// Totals per draft method, e.g. across a server's finished requests or a benchmark run.
class SpecTelemetryByMethod {
 public:
  void add(const SpecTelemetry& request);
  // The totals of one method; an empty record when the method was never seen.
  SpecTelemetry method(const std::string& name) const;
  // All methods together.
  SpecTelemetry total() const;
  const std::map<std::string, SpecTelemetry>& methods() const { return by_method_; }
  // {"methods": {name: ...}, "total": ...}
  nlohmann::json to_json() const;

 private:
  std::map<std::string, SpecTelemetry> by_method_;
};

}  // namespace specdec
