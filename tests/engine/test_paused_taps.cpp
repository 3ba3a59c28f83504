// A row whose hidden-state drafter (EAGLE-3, DFlash) the depth policy has paused costs what a
// plain row costs: the target forward does not tap it and the method copies nothing, so its
// steps make exactly the backend calls of a plain decoding step, counted on a backend that sees
// every call. The engine taps it again in the rounds before the pause ends, so that the drafter
// drafts over the gap in its context (test_lazy_taps.cpp checks how well), and the output stays
// that of plain decoding; beside it, a row of the same drafter that is tapped gets exactly its
// own taps.
#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <thread>

#include "engine_fixture.h"
#include "speculative/methods/dflash.h"
#include "speculative/methods/eagle3.h"

namespace specdec::testing {
namespace {

// Forwards every call to the wrapped backend and counts it. It records nothing, so that a
// replayed step cannot hide its calls: every call of every forward goes through here.
class CountingBackend final : public Backend {
 public:
  explicit CountingBackend(Backend& inner) : in_(inner) {}
  int64_t calls = 0;

  Device device() const override { return in_.device(); }
  std::string name() const override { return "counting " + in_.name(); }
  DType kv_dtype() const override { return in_.kv_dtype(); }
  Buffer allocate(size_t bytes) override { return in_.allocate(bytes); }
  size_t memory_available() const override { return in_.memory_available(); }
  void copy(const Tensor& src, const Tensor& dst) override {
    ++calls;
    in_.copy(src, dst);
  }
  void synchronize() override { in_.synchronize(); }
  void embedding(const Tensor& table, const Tensor& ids, const Tensor& out) override {
    ++calls;
    in_.embedding(table, ids, out);
  }
  void rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& out) override {
    ++calls;
    in_.rms_norm(x, w, eps, out);
  }
  void linear(const Tensor& x, const Weight& w, const Tensor* bias, const Tensor& out) override {
    ++calls;
    in_.linear(x, w, bias, out);
  }
  void rope(const Tensor& x, const Tensor& positions, const Tensor& inv_freq, float scaling) override {
    ++calls;
    in_.rope(x, positions, inv_freq, scaling);
  }
  void silu_mul(const Tensor& gate, const Tensor& up, const Tensor& out) override {
    ++calls;
    in_.silu_mul(gate, up, out);
  }
  void add(const Tensor& a, const Tensor& b, const Tensor& out) override {
    ++calls;
    in_.add(a, b, out);
  }
  void gather_rows(const Tensor& x, const Tensor& indices, const Tensor& out) override {
    ++calls;
    in_.gather_rows(x, indices, out);
  }
  void scatter_columns(const Tensor& x, const Tensor& index, float fill, const Tensor& out) override {
    ++calls;
    in_.scatter_columns(x, index, fill, out);
  }
  void kv_write(const Tensor& k, const Tensor& v, const Tensor& k_pool, const Tensor& v_pool,
                const AttentionBatch& batch) override {
    ++calls;
    in_.kv_write(k, v, k_pool, v_pool, batch);
  }
  void attention(const Tensor& q, const Tensor& k_pool, const Tensor& v_pool, const AttentionBatch& batch, float scale,
                 const Tensor& out) override {
    ++calls;
    in_.attention(q, k_pool, v_pool, batch, scale, out);
  }
  void argmax(const Tensor& logits, const Tensor& out) override {
    ++calls;
    in_.argmax(logits, out);
  }
  void top_logprob(const Tensor& logits, const Tensor& out) override {
    ++calls;
    in_.top_logprob(logits, out);
  }
  void sample(const Tensor& logits, const Tensor& rows, const Tensor& out) override {
    ++calls;
    in_.sample(logits, rows, out);
  }
  void linear_many(const Tensor& x, std::span<const Projection> projections) override {
    ++calls;
    in_.linear_many(x, projections);
  }
  void gated_linear(const Tensor& x, const Weight& g, const Weight& u, const Tensor& out) override {
    ++calls;
    in_.gated_linear(x, g, u, out);
  }
  void linear_add(const Tensor& x, const Weight& w, const Tensor* bias, const Tensor& out) override {
    ++calls;
    in_.linear_add(x, w, bias, out);
  }
  void norm_linear_many(const Tensor& x, const Tensor& norm, float eps, const Tensor& normed,
                        std::span<const Projection> projections) override {
    ++calls;
    in_.norm_linear_many(x, norm, eps, normed, projections);
  }
  void norm_gated_linear(const Tensor& x, const Tensor& norm, float eps, const Tensor& normed, const Weight& g,
                         const Weight& u, const Tensor& out) override {
    ++calls;
    in_.norm_gated_linear(x, norm, eps, normed, g, u, out);
  }
  void rope_kv_write(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& positions, const Tensor& inv_freq,
                     float scaling, const Tensor& k_pool, const Tensor& v_pool, const AttentionBatch& batch) override {
    ++calls;
    in_.rope_kv_write(q, k, v, positions, inv_freq, scaling, k_pool, v_pool, batch);
  }
  void rope_kv_write_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& positions,
                               const Tensor& inv_freq, float scaling, const Tensor& k_pool, const Tensor& v_pool,
                               const AttentionBatch& batch, float scale, const Tensor& out) override {
    ++calls;
    in_.rope_kv_write_attention(q, k, v, positions, inv_freq, scaling, k_pool, v_pool, batch, scale, out);
  }
  std::unique_ptr<RecordedCalls> record(const std::function<void()>&) override { return nullptr; }

 private:
  Backend& in_;
};

// What the rows of a BlindedMethod's group went through, round by round.
struct RoundLog {
  bool asked = false;  // the method was asked to draft for the row
  int proposed = 0;    // drafts the method proposed (before any blinding)
  int drafted = 0;     // drafts the round verified
  int accepted = 0;
  bool tapped = false;          // the round came with the target's taps
  std::vector<int32_t> drafts;  // the proposal the round verified (after any blinding)
};

// The real method, except that for the first `blind_rounds` rounds every draft is replaced by
// another token (the target rejects it) and a draft call is slow: the depth policy sees a row
// that does not pay and pauses it.
class BlindedRows final : public DraftRows {
 public:
  BlindedRows(std::unique_ptr<DraftRows> inner, int vocab, int blind_rounds, std::vector<RoundLog>& log)
      : in_(std::move(inner)), vocab_(vocab), blind_(blind_rounds), log_(log) {}
  int row_count() const override { return in_->row_count(); }
  PreparedChange prepare_append(std::span<const Checkpoint* const> cps) override { return in_->prepare_append(cps); }
  void filter_rows(std::span<const int> keep) override { in_->filter_rows(keep); }
  void prefill(int row, std::span<const int32_t> tokens, const TargetContext& context) override {
    in_->prefill(row, tokens, context);
  }
  std::vector<DraftProposal> draft(std::span<const DraftRequestRow> rows) override {
    asked_ = true;
    std::vector<DraftProposal> got = in_->draft(rows);
    proposed_ = got.empty() ? 0 : static_cast<int>(got.front().tokens.size());
    if (static_cast<int>(log_.size()) < blind_) {
      for (DraftProposal& p : got)
        for (int32_t& t : p.tokens) t = (t + 1) % vocab_;
      // Slow too, several plain steps a call: then no timing noise on a busy machine can make
      // rejected drafts look worth a window, and the policy pauses the row.
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    drafts_ = got.empty() ? std::vector<int32_t>{} : got.front().tokens;
    return got;
  }
  void commit(std::span<const RowCommit> commits) override {
    for (const RowCommit& c : commits)
      log_.push_back({asked_, proposed_, c.drafted, c.accepted, !c.context.empty(), drafts_});
    asked_ = false;
    proposed_ = 0;
    drafts_.clear();
    in_->commit(commits);
  }
  Checkpoint capture(int row) const override { return in_->capture(row); }
  bool has_room(int tokens) const override { return in_->has_room(tokens); }

 private:
  std::unique_ptr<DraftRows> in_;
  int vocab_, blind_;
  std::vector<RoundLog>& log_;
  bool asked_ = false;
  int proposed_ = 0;
  std::vector<int32_t> drafts_;
};

class BlindedMethod final : public DraftMethod {
 public:
  BlindedMethod(std::shared_ptr<DraftMethod> inner, int blind_rounds) : in_(std::move(inner)), blind_(blind_rounds) {}
  std::string name() const override { return in_->name(); }
  std::string checkpoint_namespace() const override { return in_->checkpoint_namespace(); }
  TargetNeeds needs() const override { return in_->needs(); }
  std::unique_ptr<DraftRows> open(const TargetView& target) override {
    return std::make_unique<BlindedRows>(in_->open(target), target.vocab_size, blind_, log);
  }
  int default_depth() const override { return in_->default_depth(); }
  std::vector<RoundLog> log;

 private:
  std::shared_ptr<DraftMethod> in_;
  int blind_;
};

class PausedTaps : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    Bundled& b = Bundled::get();
    target_ = Model::load(source_path("models/target"), counting_);
    // Blind through the first pauses (4, 8, 16 and 32 rounds after the first rounds'
    // rejections, with room for however many rounds the policy drafts before it has measured
    // the costs).
    blinded_ = std::make_shared<BlindedMethod>(method(), 80);
    EngineOptions options;
    options.kv_blocks = 256;
    // Every request here repeats one prompt: each must compute (and tap) all of it, as the
    // comparisons of taps and telemetry between runs assume.
    options.prefix_cache = false;
    engine_ = std::make_unique<EngineCore>(*target_, *b.tokenizer, options);
    engine_->add_method("hidden", blinded_);
    prompt_ = encode(
        "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n        "
        "self.items.append(item)\n\n    def pop(self):\n");
  }

  // A new instance of the method under test, on the counting backend.
  std::shared_ptr<DraftMethod> method() {
    // At most the drafter's own drafts (a chain or a block): rounds that run on along this
    // prompt's repeated text would end the neighbour's request before the paused row's first
    // pauses are over.
    if (std::string(GetParam()) == "eagle3") {
      Eagle3Options o;
      o.kv_blocks = 256;
      o.num_draft = kEagle3Chain;
      return std::make_shared<Eagle3Method>(Eagle3Head::load(source_path("models/eagle3"), counting_), "bundled-eagle3",
                                            target_->config().num_layers, o);
    }
    DflashOptions o;
    o.kv_blocks = 256;
    o.confidence_cut = false;  // every draft call proposes the depth asked
    o.num_draft = 7;
    return std::make_shared<DflashMethod>(source_path("models/dflash"), counting_, "bundled-dflash", o);
  }

  CountingBackend counting_{*Bundled::get().backend};
  std::unique_ptr<Model> target_;
  std::shared_ptr<BlindedMethod> blinded_;
  std::unique_ptr<EngineCore> engine_;
  std::vector<int32_t> prompt_;
};

TEST_P(PausedTaps, APausedRowCostsAPlainStepAndDraftsAgainAfterThePause) {
  CountingBackend& counting = counting_;
  EngineCore& engine = *engine_;
  const auto& blinded = blinded_;
  const std::vector<int32_t>& prompt = prompt_;
  const int max_tokens = 240;
  // Backend calls of each step, and whether the step ended a round of the speculating row.
  const auto run = [&](Request r, std::vector<int64_t>& per_step, std::vector<int>& round_of_step) {
    const int64_t id = engine.submit(std::move(r));
    while (!engine.idle()) {
      const int64_t calls = counting.calls;
      const size_t rounds = blinded->log.size();
      engine.step();
      per_step.push_back(counting.calls - calls);
      round_of_step.push_back(blinded->log.size() > rounds ? static_cast<int>(rounds) : -1);
    }
    return engine.take_result(id)->tokens;
  };

  std::vector<int64_t> plain_calls, spec_calls;
  std::vector<int> unused, round_of_step;
  const std::vector<int32_t> plain = run(make_request(prompt, max_tokens), plain_calls, unused);
  // A plain decoding step makes the same calls every time (the first steps prefill).
  std::map<int64_t, int> plain_counts;
  for (size_t s = 2; s < plain_calls.size(); ++s) ++plain_counts[plain_calls[s]];
  ASSERT_EQ(plain_counts.size(), 1u) << "plain decoding steps of different costs";
  const int64_t plain_step = plain_counts.begin()->first;

  Request spec = make_request(prompt, max_tokens);
  spec.spec.method = "hidden";
  EXPECT_EQ(run(std::move(spec), spec_calls, round_of_step), plain);

  const std::vector<RoundLog>& log = blinded->log;
  int untapped = 0, tapped_plain = 0, probes_after_gaps = 0;
  for (size_t s = 0; s < spec_calls.size(); ++s) {
    if (round_of_step[s] < 0) continue;
    const RoundLog& round = log[static_cast<size_t>(round_of_step[s])];
    if (round.asked || round.drafted > 0) continue;
    if (!round.tapped) {
      ++untapped;
      EXPECT_EQ(spec_calls[s], plain_step) << "step " << s << ": an untapped paused round";
    } else {
      // The counter sees taps: a tapped round that drafts nothing costs more than a plain one.
      ++tapped_plain;
      EXPECT_GT(spec_calls[s], plain_step) << "step " << s;
    }
  }
  // Every draft call proposes: the round before one that may draft is tapped, so a drafter
  // whose context has a gap still has the taps it drafts from.
  bool gap = false;
  for (size_t r = 0; r < log.size(); ++r) {
    gap = gap || !log[r].tapped;
    if (!log[r].asked) continue;
    EXPECT_GT(log[r].proposed, 0) << "round " << r;
    probes_after_gaps += gap;
    gap = false;
  }
  // The blind rounds pause the row for 4, 8, 16 and then 32 rounds at least (its probes fail):
  // the last two go untapped but for the rounds before their probes.
  EXPECT_GE(untapped, 24) << "of " << log.size() << " rounds";
  EXPECT_GE(tapped_plain, 1);
  EXPECT_GE(probes_after_gaps, 1);
}

// Checks, round by round, that the row of `log` was tapped exactly when its depth policy let it:
// a round that goes untapped drafts nothing (the row is paused), and a paused row is tapped only
// in the last `resume_taps` rounds of a pause, after which it probes (drafts) or its pause is
// renewed (an untapped round). This holds whatever the measured costs made the policy choose, so
// it is checked on every round rather than by how many rounds went untapped.
void expect_taps_follow_pauses(const std::vector<RoundLog>& log, int resume_taps) {
  int tapped_plain = 0;  // tapped rounds that drafted nothing, in a row up to round r
  for (size_t r = 0; r < log.size(); ++r) {
    const RoundLog& round = log[r];
    const bool plain = !round.asked && round.drafted == 0;
    if (!round.tapped) {
      EXPECT_TRUE(plain) << "round " << r << " drafted untapped";
    } else if (plain) {
      ++tapped_plain;
      EXPECT_LE(tapped_plain, resume_taps) << "round " << r << ": a paused row tapped early in its pause";
      continue;
    } else if (r > 0) {
      // A draft follows a tapped round: the drafter has the taps of the positions just before it.
      EXPECT_TRUE(log[r - 1].tapped) << "round " << r << " drafted after an untapped round";
    }
    tapped_plain = 0;
  }
}

TEST_P(PausedTaps, AnUntappedRowLeavesItsNeighboursTapsAlone) {
  // A paused row beside a row of the same kind of drafter that drafts every round at a fixed
  // depth: the forwards tap only the second, and it is handed exactly its own positions' taps,
  // so it proposes (and is accepted) round by round exactly as when it runs alone. The neighbour
  // runs under a recorder that blinds none of its rounds.
  const auto neighbour = std::make_shared<BlindedMethod>(method(), 0);
  engine_->add_method("real", neighbour);
  const auto request = [&](const std::string& method) {
    Request r = make_request(prompt_, 160);
    r.spec.method = method;
    r.spec.adaptive = method == "hidden";
    return r;
  };
  // The pair runs first, while the engine has measured only the pair's own forwards: the paused
  // row's policy then prices windows against forwards timed under the same load as its plain
  // steps, not against a reference run's timings from a quieter or busier minute.
  const int64_t paused = engine_->submit(request("hidden"));
  const int64_t beside = engine_->submit(request("real"));
  std::optional<RequestResult> b;
  size_t beside_rounds = 0;  // the paused row's rounds that shared a forward with its neighbour
  while (!engine_->idle()) {
    engine_->step();
    if (b) continue;
    beside_rounds = blinded_->log.size();
    b = engine_->take_result(beside);
  }
  ASSERT_TRUE(b.has_value());
  const RequestResult a = *engine_->take_result(paused);
  const std::vector<RoundLog> beside_log = std::move(neighbour->log);
  neighbour->log.clear();

  const RequestResult alone = run_one(*engine_, request("real"));
  const RequestResult plain = run_one(*engine_, make_request(prompt_, 160));
  EXPECT_EQ(a.tokens, plain.tokens);
  EXPECT_EQ(b->tokens, plain.tokens);
  // The neighbour, round by round: tapped every round, the same proposals, the same verdicts.
  ASSERT_EQ(beside_log.size(), neighbour->log.size());
  for (size_t r = 0; r < beside_log.size(); ++r) {
    const RoundLog &got = beside_log[r], &want = neighbour->log[r];
    EXPECT_TRUE(got.asked && got.tapped) << "round " << r;
    EXPECT_EQ(got.drafts, want.drafts) << "round " << r;
    EXPECT_EQ(got.accepted, want.accepted) << "round " << r;
  }
  EXPECT_EQ(b->stats.speculative.drafted_at, alone.stats.speculative.drafted_at);
  EXPECT_EQ(b->stats.speculative.accepted_at, alone.stats.speculative.accepted_at);
  EXPECT_GT(b->stats.speculative.accepted, 0);

  // The paused row: tapped only where its policy let it, every round.
  const std::vector<RoundLog>& log = blinded_->log;
  const int resume_taps = blinded_->needs().resume_taps;
  expect_taps_follow_pauses(log, resume_taps);
  // And it did pause beside its neighbour: its first pauses, of 4 and then 8 rounds once its first
  // rounds have measured the costs (its blind drafts are rejected and slow, so that no timing
  // makes them pay), fall within the neighbour's rounds and go untapped but for their last
  // resume_taps rounds. Without such rounds the comparison above would not see an untapped row
  // beside a tapped one.
  const auto untapped_beside = std::count_if(log.begin(), log.begin() + static_cast<std::ptrdiff_t>(beside_rounds),
                                             [](const RoundLog& r) { return !r.tapped; });
  EXPECT_GE(untapped_beside, (4 - resume_taps) + (8 - resume_taps)) << "of " << beside_rounds << " rounds";
}

TEST_P(PausedTaps, StepsRunAheadOfAPausedRow) {
  // With steps launched ahead of the previous commit (a GPU's default), the rounds in which a
  // paused row drafts nothing and goes untapped, before and after, are launched ahead as a plain
  // row's steps are; the tapped rounds before a probe and the probe are not. The output, and the
  // taps the drafter gets, are those of steps taken one after the other.
  EngineOptions options;
  options.kv_blocks = 256;
  options.prefix_cache = false;
  options.overlap = Overlap::always;
  EngineCore engine(*target_, *Bundled::get().tokenizer, options);
  engine.add_method("hidden", blinded_);
  Request spec = make_request(prompt_, 160);
  spec.spec.method = "hidden";
  const RequestResult got = run_one(engine, std::move(spec));
  EXPECT_EQ(got.tokens, run_one(*engine_, make_request(prompt_, 160)).tokens);

  const std::vector<RoundLog>& log = blinded_->log;
  expect_taps_follow_pauses(log, blinded_->needs().resume_taps);
  // A step launched ahead is a round that drafts nothing and is untapped, after a round that
  // was untapped too; or the request's last round, which ends it and reaches no drafter's log.
  int64_t quiet_pairs = 0;
  for (size_t r = 1; r < log.size(); ++r) quiet_pairs += !log[r - 1].tapped && !log[r].tapped && !log[r].asked;
  const int64_t ahead = engine.stats().forwards_ahead;
  EXPECT_GT(ahead, 0);
  EXPECT_LE(ahead, quiet_pairs + 1);
  // The blind rounds pause the row for 4, 8, 16 and 32 rounds at least: most of their rounds run
  // ahead.
  EXPECT_GE(ahead, 24) << "of " << log.size() << " rounds, " << quiet_pairs << " untapped after untapped";
}

INSTANTIATE_TEST_SUITE_P(Eagle3AndDflash, PausedTaps, ::testing::Values("eagle3", "dflash"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace specdec::testing
