// The engine: requests in, tokens out. Continuous batching over one target model: each
// iteration admits waiting requests, lets every draft group propose for its speculating rows,
// runs ONE target forward over prefill chunks, plain steps and verify windows together, verifies,
// rolls each row's KV back to what was accepted, commits the outcome to the draft groups, and
// streams the new tokens. Rows join and leave only between iterations.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/request.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "speculative/draft.h"
#include "speculative/policy.h"
#include "tokenizer/tokenizer.h"

namespace specdec {

struct EngineOptions {
  int kv_blocks = 0;            // 0 = enough for max_rows rows of the full context, capped at kv_memory
  size_t kv_memory = 1ull << 30;
  int max_rows = 64;            // rows decoding or prefilling at once
  int max_batch_tokens = 512;   // tokens in one target forward (prefill chunks fill what decode leaves)
  // Draw tokens where the logits were computed when every decoding row allows it (see step()).
  // false: the host draws every token from copied logits (the reference path, for comparisons).
  bool sample_on_backend = true;
};

class EngineCore {
 public:
  EngineCore(Model& target, const Tokenizer& tokenizer, EngineOptions options = {});
  ~EngineCore();
  EngineCore(const EngineCore&) = delete;
  EngineCore& operator=(const EngineCore&) = delete;

  // Makes a draft method instance available to requests under `id` (SpecOptions::method).
  // Two instances of one method (two draft models, two n-gram configurations) live side by
  // side under different ids, each with its own rows; an id already in use is refused.
  void add_method(const std::string& id, std::shared_ptr<DraftMethod> method);
  bool has_method(const std::string& id) const;

  // Validates and queues a request; throws specdec::Error (naming the cause) for a bad one,
  // leaving the engine and other requests untouched.
  int64_t submit(Request request);
  void cancel(int64_t id);
  // One iteration. Returns false when there was nothing to do.
  bool step();
  // Steps until every submitted request has finished.
  void run();
  bool idle() const { return rows_.empty() && waiting_.empty(); }

  // The result of a finished request (moves it out); nullopt while it runs.
  std::optional<RequestResult> take_result(int64_t id);

  const KvCache& kv() const { return *kv_; }
  const Model& target() const { return target_; }
  int64_t target_forwards() const { return forwards_; }

 private:
  struct Row;
  struct Group;

  void admit();
  bool reserve_or_preempt(Row& row, int new_len);
  // reserve_or_preempt, and when that fails: the oldest row ends with an error, another is
  // preempted. Returns whether the row may run this iteration.
  bool reserve_or_yield(Row& row, int new_len, const char* what);
  void preempt(Row& row);
  void finish(Row& row, FinishReason reason, const std::string& error = {});
  void remove_finished();
  // Appends one emitted token (an EOS ends the row instead) and checks the stop strings;
  // returns true when the row has finished.
  bool append_token(Row& row, int32_t token, bool is_eos);
  void stream(Row& row, std::vector<int32_t> tokens, bool final);
  Group* group_of(const Row& row);

  Model& target_;
  const Tokenizer& tokenizer_;
  EngineOptions options_;
  std::unique_ptr<KvCache> kv_;
  std::map<std::string, std::shared_ptr<DraftMethod>> methods_;
  std::map<std::string, std::unique_ptr<Group>> groups_;
  std::vector<std::unique_ptr<Row>> rows_;
  std::deque<std::unique_ptr<Row>> waiting_;
  std::map<int64_t, RequestResult> results_;
  CostModel costs_;
  int64_t next_id_ = 1;
  int64_t forwards_ = 0;
};

}  // namespace specdec
