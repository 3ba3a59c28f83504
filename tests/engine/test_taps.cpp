// The target view as ports: a method that declares tap layers receives, with every prefill block
// and verified round, the target's hidden states of exactly those positions, equal value for
// value to an independent forward of the same tokens; output stays the plain output; the weight
// ports are views of the target's own weights.
#include <cstring>
#include <numeric>

#include "core/error.h"
#include "engine_fixture.h"
#include "model/weights.h"

namespace specdec::testing {
namespace {

// What one row of a recording group was told, position by position: the tokens and, per
// declared tap layer, their hidden states ([tokens, hidden], copied to the host).
struct Seen {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> taps;
};

// Every row a recording group ever held, in joining order (a preempted row's record stays as it
// was; the row rejoins as a new record).
struct Log {
  std::vector<Seen> rows;
  int drafted = 0, accepted = 0;
};

// Drafts from the known greedy outputs (`oracle`: prompt + plain output per request), the last
// draft of every third round wrong, so that windows are accepted whole, in part and not at all.
class RecordingRows : public DraftRows {
 public:
  RecordingRows(const Model& target, std::vector<int> layers, std::shared_ptr<Log> log,
                const std::vector<std::vector<int32_t>>& oracle)
      : target_(target), layers_(std::move(layers)), log_(std::move(log)), oracle_(oracle) {}

  int row_count() const override { return static_cast<int>(live_.size()); }
  PreparedChange prepare_append(std::span<const Checkpoint* const> checkpoints) override {
    const size_t n = checkpoints.size();
    return PreparedChange(
        [this, n] {
          for (size_t i = 0; i < n; ++i) {
            live_.push_back(log_->rows.size());
            log_->rows.push_back(Seen{{}, std::vector<std::vector<float>>(layers_.size())});
          }
        },
        [] {});
  }
  void filter_rows(std::span<const int> keep) override {
    std::vector<size_t> next;
    for (int i : keep) next.push_back(live_.at(static_cast<size_t>(i)));
    live_ = std::move(next);
  }
  void prefill(int row, std::span<const int32_t> tokens, const TargetContext& context) override {
    record(row, std::vector<int32_t>(tokens.begin(), tokens.end()), context);
  }
  std::vector<DraftProposal> draft(std::span<const DraftRequestRow> asks) override {
    std::vector<DraftProposal> out(asks.size());
    for (size_t i = 0; i < asks.size(); ++i) {
      std::vector<int32_t> known = seen(asks[i].row).tokens;
      known.push_back(asks[i].pending);
      for (const auto& full : oracle_) {
        if (full.size() <= known.size() || !std::equal(known.begin(), known.end(), full.begin())) continue;
        const size_t n = std::min(full.size() - known.size(), static_cast<size_t>(asks[i].depth));
        out[i].tokens.assign(full.begin() + static_cast<std::ptrdiff_t>(known.size()),
                             full.begin() + static_cast<std::ptrdiff_t>(known.size() + n));
        if (n > 0 && asks[i].position % 3 == 0) out[i].tokens.back() = (out[i].tokens.back() + 1) % 7;
        break;
      }
    }
    return out;
  }
  void commit(std::span<const RowCommit> commits) override {
    for (const RowCommit& c : commits) {
      std::vector<int32_t> verified = {c.pending};
      verified.insert(verified.end(), c.emitted.begin(), c.emitted.begin() + c.accepted);
      record(c.row, verified, c.context);
      log_->drafted += c.drafted;
      log_->accepted += c.accepted;
    }
  }
  Checkpoint capture(int row) const override {
    Checkpoint cp;
    cp.ns = "recording-v1";
    cp.tokens = log_->rows.at(live_.at(static_cast<size_t>(row))).tokens;
    cp.processed_tokens = static_cast<int64_t>(cp.tokens.size());
    return cp;
  }

 private:
  Seen& seen(int row) { return log_->rows.at(live_.at(static_cast<size_t>(row))); }
  void record(int row, const std::vector<int32_t>& tokens, const TargetContext& context) {
    Seen& s = seen(row);
    s.tokens.insert(s.tokens.end(), tokens.begin(), tokens.end());
    ASSERT_EQ(context.taps.size(), layers_.size());
    const int64_t H = target_.config().hidden_size;
    for (size_t j = 0; j < layers_.size(); ++j) {
      const Tensor& t = context.taps[j];
      ASSERT_EQ(t.dim(0), static_cast<int64_t>(tokens.size()));
      ASSERT_EQ(t.dim(1), H);
      std::vector<float>& dst = s.taps[j];
      const size_t at = dst.size();
      dst.resize(at + static_cast<size_t>(t.numel()));
      target_.backend().copy(t, Tensor(dst.data() + at, DType::f32, {t.numel()}));
    }
    target_.backend().synchronize();
  }

  const Model& target_;
  std::vector<int> layers_;
  std::shared_ptr<Log> log_;
  const std::vector<std::vector<int32_t>>& oracle_;
  std::vector<size_t> live_;  // each current row's record in log_->rows
};

class RecordingMethod : public DraftMethod {
 public:
  RecordingMethod(std::vector<int> layers, std::vector<std::vector<int32_t>> oracle)
      : layers_(std::move(layers)), oracle_(std::move(oracle)) {}
  std::string name() const override { return "recording"; }
  std::string checkpoint_namespace() const override { return "recording-v1"; }
  TargetNeeds needs() const override { return TargetNeeds{layers_, false, false, false}; }
  std::unique_ptr<DraftRows> open(const TargetView& target) override {
    return std::make_unique<RecordingRows>(*target.model, layers_, log, oracle_);
  }
  int default_depth() const override { return 4; }

  std::shared_ptr<Log> log = std::make_shared<Log>();

 private:
  std::vector<int> layers_;
  std::vector<std::vector<int32_t>> oracle_;
};

std::vector<int32_t> plain(const std::vector<int32_t>& prompt, int n) {
  auto engine = make_engine();
  return run_one(*engine, make_request(prompt, n)).tokens;
}

// The taps of every position of `tokens` but the last (the one never processed), from one plain
// forward on a cache of its own.
std::vector<std::vector<float>> reference_taps(const std::vector<int32_t>& tokens, const std::vector<int>& layers) {
  Model& target = *Bundled::get().target;
  auto cache = target.make_cache(64);
  const auto seq = cache->create();
  const int n = static_cast<int>(tokens.size()) - 1;
  EXPECT_TRUE(cache->reserve(seq, n));
  SequenceInput in{seq, {tokens.begin(), tokens.begin() + n}, {}};
  in.taps_at.resize(static_cast<size_t>(n));
  std::iota(in.taps_at.begin(), in.taps_at.end(), 0);
  const ForwardResult out = target.forward(ForwardRequest{{in}, layers}, *cache);
  std::vector<std::vector<float>> taps;
  for (const Tensor& t : out.taps) {
    std::vector<float> v(static_cast<size_t>(t.numel()));
    target.backend().copy(t, Tensor(v.data(), DType::f32, {t.numel()}));
    taps.push_back(std::move(v));
  }
  target.backend().synchronize();
  return taps;
}

// Every record must be the start of one request's tokens, with that prefix's reference taps.
// `complete`: no row was preempted, so each was told of every position up to its last round (a
// finished row's last round, pending and at most 4 drafts, is not relayed).
void expect_taps_match(const Log& log, const std::vector<std::vector<int32_t>>& oracle, const std::vector<int>& layers,
                       bool complete = false) {
  std::vector<std::vector<std::vector<float>>> refs;
  for (const auto& full : oracle) refs.push_back(reference_taps(full, layers));
  const size_t H = static_cast<size_t>(Bundled::get().target->config().hidden_size);
  for (size_t r = 0; r < log.rows.size(); ++r) {
    const Seen& s = log.rows[r];
    ASSERT_FALSE(s.tokens.empty()) << "record " << r;
    size_t o = 0;
    auto is_prefix_of = [&](const std::vector<int32_t>& full) {
      return s.tokens.size() <= full.size() && std::equal(s.tokens.begin(), s.tokens.end(), full.begin());
    };
    while (o < oracle.size() && !is_prefix_of(oracle[o])) ++o;
    ASSERT_LT(o, oracle.size()) << "record " << r << " is no request's prefix";
    if (complete) {
      EXPECT_GE(s.tokens.size() + 6, oracle[o].size()) << "record " << r;
    }
    for (size_t j = 0; j < layers.size(); ++j) {
      ASSERT_EQ(s.taps[j].size(), s.tokens.size() * H);
      ASSERT_LE(s.taps[j].size(), refs[o][j].size());
      EXPECT_EQ(std::memcmp(s.taps[j].data(), refs[o][j].data(), s.taps[j].size() * sizeof(float)), 0)
          << "record " << r << ", tap layer " << layers[j];
    }
  }
}

std::vector<std::string> texts() {
  return {"def fibonacci(n):\n", "class Stack:\n    def __init__(self):\n        self.items = []\n",
          "import os\nimport sys\n\n\ndef main():\n"};
}

// Runs `methods[i]` rows (empty: plain) over the texts, returns their outputs.
std::vector<std::vector<int32_t>> run_rows(EngineCore& engine, const std::vector<std::string>& methods, int n) {
  std::vector<int64_t> ids;
  for (size_t i = 0; i < methods.size(); ++i) {
    Request r = make_request(encode(texts()[i % texts().size()]), n);
    r.spec.method = methods[i];
    r.spec.adaptive = false;
    ids.push_back(engine.submit(std::move(r)));
    engine.step();  // rows join while others prefill or decode
  }
  engine.run();
  std::vector<std::vector<int32_t>> out;
  for (int64_t id : ids) out.push_back(engine.take_result(id)->tokens);
  return out;
}

TEST(TargetTaps, PrefillAndCommitCarryTheTappedHiddenOfExactlyThosePositions) {
  const int L = Bundled::get().target->config().num_layers;
  const std::vector<int> layers = {L, 0, 2};  // the method's order, not the forward's
  const int n = 32;
  std::vector<std::vector<int32_t>> oracle, want;
  for (const auto& text : texts()) {
    want.push_back(plain(encode(text), n));
    oracle.push_back(encode(text));
    oracle.back().insert(oracle.back().end(), want.back().begin(), want.back().end());
  }
  EngineOptions options;
  options.max_batch_tokens = 24;  // prompts in several chunks, beside other rows' windows
  auto engine = make_engine(4, options);
  auto method = std::make_shared<RecordingMethod>(layers, oracle);
  engine->add_method("recording", method);
  const std::vector<std::string> methods = {"recording", "ngram", "", "recording", "recording", "draft"};
  const auto got = run_rows(*engine, methods, n);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], want[i % want.size()]) << "row " << i;
  EXPECT_EQ(method->log->rows.size(), 3u);
  EXPECT_GT(method->log->accepted, 0);
  EXPECT_LT(method->log->accepted, method->log->drafted);
  expect_taps_match(*method->log, oracle, layers, true);
}

TEST(TargetTaps, PreemptedRowsAreTappedAgainWhenTheyRecompute) {
  // A cache too small for every row at once: rows are preempted, leave their group, rejoin and
  // re-prefill their prompt and what they generated; every record still matches.
  const int L = Bundled::get().target->config().num_layers;
  const std::vector<int> layers = {1, L - 1};
  const int n = 40;
  std::vector<std::vector<int32_t>> oracle, want;
  for (const auto& text : texts()) {
    want.push_back(plain(encode(text), n));
    oracle.push_back(encode(text));
    oracle.back().insert(oracle.back().end(), want.back().begin(), want.back().end());
  }
  EngineOptions options;
  options.kv_blocks = 10;
  // A preempted row would find its own released prompt blocks in the prefix cache (and take them
  // untapped): off, so that it recomputes them.
  options.prefix_cache = false;
  auto engine = make_engine(4, options);
  auto method = std::make_shared<RecordingMethod>(layers, oracle);
  engine->add_method("recording", method);
  // The youngest rows are preempted first: the recording rows come last.
  const auto got = run_rows(*engine, {"", "ngram", "recording", "recording"}, n);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], want[i % want.size()]) << "row " << i;
  EXPECT_GT(method->log->rows.size(), 2u) << "no recording row was preempted";
  expect_taps_match(*method->log, oracle, layers);
}

TEST(TargetTaps, WeightPortsAreTheTargetsOwnWeights) {
  struct Ports {
    const Tensor* embedding = nullptr;
    const Weight* lm_head = nullptr;
  };
  class NeedsWeights : public DraftMethod {
   public:
    explicit NeedsWeights(Ports& seen) : seen_(seen) {}
    std::string name() const override { return "needs-weights"; }
    std::string checkpoint_namespace() const override { return "needs-weights-v1"; }
    TargetNeeds needs() const override { return TargetNeeds{{}, true, true, false}; }
    std::unique_ptr<DraftRows> open(const TargetView& target) override {
      seen_ = Ports{target.embedding, target.lm_head};
      return std::make_unique<RecordingRows>(*target.model, std::vector<int>{}, std::make_shared<Log>(), oracle_);
    }
    int default_depth() const override { return 2; }

   private:
    Ports& seen_;
    std::vector<std::vector<int32_t>> oracle_;
  };

  const Model& target = *Bundled::get().target;
  const ModelConfig& c = target.config();
  Ports seen;
  auto engine = make_engine();
  engine->add_method("weights", std::make_shared<NeedsWeights>(seen));
  ASSERT_NE(seen.embedding, nullptr);
  ASSERT_NE(seen.lm_head, nullptr);
  // The very tensors the target's forward reads: same memory, no copy.
  EXPECT_EQ(seen.embedding->data, target.embedding().data);
  EXPECT_EQ(seen.lm_head->data.data, target.lm_head().data.data);
  EXPECT_EQ(seen.embedding->dim(0), c.vocab_size);
  EXPECT_EQ(seen.embedding->dim(1), c.hidden_size);
  EXPECT_EQ(seen.lm_head->rows(), c.vocab_size);
  EXPECT_EQ(seen.lm_head->cols(), c.hidden_size);
  if (c.tie_word_embeddings) {
    EXPECT_EQ(seen.lm_head->data.data, seen.embedding->data);
  }
  if (seen.embedding->device == Device::cpu) {
    // On the CPU they are views of the checkpoint's own bytes.
    auto store = WeightStore::open(source_path("models/target"));
    const Tensor file = store.get("model.embed_tokens.weight");
    ASSERT_EQ(file.bytes(), seen.embedding->bytes());
    EXPECT_EQ(std::memcmp(file.data, seen.embedding->data, file.bytes()), 0);
  }
  // A row of the method runs like any other (it declared no taps: its group gets none).
  const auto prompt = encode(texts()[0]);
  Request r = make_request(prompt, 12);
  r.spec.method = "weights";
  EXPECT_EQ(run_one(*engine, std::move(r)).tokens, plain(prompt, 12));
}

}  // namespace
}  // namespace specdec::testing
