// Telemetry: counting a round, the derived rates, merging across requests and methods, the
// invariants (accepted <= drafted, emitted = accepted + rounds) and the JSON form.
#include <gtest/gtest.h>

#include "core/error.h"
#include "sampling/philox.h"
#include "speculative/telemetry.h"

namespace specdec {
namespace {

TEST(Telemetry, RecordRoundCountsAndHistograms) {
  SpecTelemetry t;
  t.method = "ngram";
  t.record_round(3, 2);
  t.record_round(4, 0);
  t.record_round(0, 0);  // a plain step
  t.record_round(2, 2);
  EXPECT_EQ(t.drafted, 9);
  EXPECT_EQ(t.accepted, 4);
  EXPECT_EQ(t.rounds, 4);
  EXPECT_EQ(t.emitted, 8);  // 3 + 1 + 1 + 3
  EXPECT_EQ(t.drafted_at, (std::vector<int64_t>{3, 3, 2, 1}));
  EXPECT_EQ(t.accepted_at, (std::vector<int64_t>{2, 2, 0, 0}));
  EXPECT_DOUBLE_EQ(t.acceptance_rate(), 4.0 / 9.0);
  EXPECT_DOUBLE_EQ(t.mean_accepted_length(), 2.0);
  EXPECT_EQ(t.acceptance_by_position(), (std::vector<double>{2.0 / 3, 2.0 / 3, 0.0, 0.0}));
  EXPECT_NO_THROW(t.check());
}

TEST(Telemetry, EmptyRatesAreZero) {
  const SpecTelemetry t;
  EXPECT_EQ(t.acceptance_rate(), 0.0);
  EXPECT_EQ(t.mean_accepted_length(), 0.0);
  EXPECT_NO_THROW(t.check());
}

TEST(Telemetry, RecordRoundRejectsImpossibleRounds) {
  SpecTelemetry t;
  EXPECT_THROW(t.record_round(2, 3), Error);
  EXPECT_THROW(t.record_round(2, -1), Error);
  EXPECT_EQ(t.rounds, 0);  // a refused round changes nothing
}

TEST(Telemetry, InvariantsHoldOverRandomRoundsAndMerges) {
  SpecTelemetry a, b;
  a.method = b.method = "draft_model";
  for (uint64_t r = 0; r < 500; ++r) {
    const int d = static_cast<int>(uniform01(1, r) * 8);
    const int acc = static_cast<int>(uniform01(2, r) * static_cast<float>(d + 1));
    (r % 2 ? a : b).record_round(d, acc);
  }
  a.check();
  b.check();
  SpecTelemetry sum = a;
  sum.merge(b);
  EXPECT_NO_THROW(sum.check());
  EXPECT_LE(sum.accepted, sum.drafted);
  EXPECT_EQ(sum.emitted, sum.accepted + sum.rounds);
  EXPECT_EQ(sum.rounds, 500);
  EXPECT_EQ(sum.method, "draft_model");
}

TEST(Telemetry, CheckNamesTheBrokenInvariant) {
  auto message = [](const SpecTelemetry& t) {
    try {
      t.check();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("ok");
  };
  SpecTelemetry good;
  good.record_round(3, 1);
  ASSERT_EQ(message(good), "ok");

  SpecTelemetry t = good;
  t.accepted = 4;
  t.emitted = 5;
  EXPECT_NE(message(t).find("accepted 4 exceeds drafted 3"), std::string::npos);
  t = good;
  t.emitted += 1;
  EXPECT_NE(message(t).find("emitted"), std::string::npos);
  t = good;
  t.drafted_at = {1, 2, 0};
  EXPECT_NE(message(t).find("drafted_at[1]"), std::string::npos);
  t = good;
  t.accepted_at = {0, 1, 0};
  EXPECT_NE(message(t).find("accepted_at"), std::string::npos);
  t = good;
  t.verify_ns = -5;
  EXPECT_NE(message(t).find("negative"), std::string::npos);
}

TEST(Telemetry, MergeSumsEverything) {
  SpecTelemetry a, b;
  a.method = "ngram";
  a.record_round(2, 1);
  a.target_forwards = 3;
  a.draft_ns = 10;
  a.verify_ns = 100;
  b.method = "ngram";
  b.record_round(5, 5);
  b.target_forwards = 1;
  b.draft_ns = 7;
  b.verify_ns = 50;
  a.merge(b);
  EXPECT_EQ(a.drafted, 7);
  EXPECT_EQ(a.accepted, 6);
  EXPECT_EQ(a.rounds, 2);
  EXPECT_EQ(a.emitted, 8);
  EXPECT_EQ(a.target_forwards, 4);
  EXPECT_EQ(a.draft_ns, 17);
  EXPECT_EQ(a.verify_ns, 150);
  EXPECT_EQ(a.drafted_at, (std::vector<int64_t>{2, 2, 1, 1, 1}));
  EXPECT_EQ(a.accepted_at, (std::vector<int64_t>{2, 1, 1, 1, 1}));
  EXPECT_EQ(a.method, "ngram");
  SpecTelemetry other;
  other.method = "eagle";
  a.merge(other);
  EXPECT_EQ(a.method, "mixed");
}

TEST(Telemetry, PerMethodTotals) {
  SpecTelemetryByMethod book;
  SpecTelemetry r1, r2, r3;
  r1.method = "ngram";
  r1.record_round(4, 2);
  r2.method = "ngram";
  r2.record_round(4, 4);
  r3.method = "draft_model";
  r3.record_round(3, 0);
  book.add(r1);
  book.add(r2);
  book.add(r3);
  EXPECT_EQ(book.methods().size(), 2u);
  EXPECT_EQ(book.method("ngram").accepted, 6);
  EXPECT_EQ(book.method("ngram").rounds, 2);
  EXPECT_EQ(book.method("draft_model").drafted, 3);
  EXPECT_EQ(book.method("eagle").rounds, 0);
  const SpecTelemetry total = book.total();
  EXPECT_EQ(total.drafted, 11);
  EXPECT_EQ(total.emitted, 9);
  EXPECT_EQ(total.method, "mixed");
  EXPECT_NO_THROW(total.check());

  const nlohmann::json j = book.to_json();
  EXPECT_EQ(j["methods"]["ngram"]["accepted"], 6);
  EXPECT_EQ(j["total"]["rounds"], 3);
}

TEST(Telemetry, JsonHoldsCountersAndDerivedFigures) {
  SpecTelemetry t;
  t.method = "ngram";
  t.record_round(4, 3);
  t.target_forwards = 2;
  t.draft_ns = 1000;
  t.verify_ns = 5000;
  const nlohmann::json j = t.to_json();
  EXPECT_EQ(j["method"], "ngram");
  EXPECT_EQ(j["drafted"], 4);
  EXPECT_EQ(j["accepted"], 3);
  EXPECT_EQ(j["rounds"], 1);
  EXPECT_EQ(j["emitted"], 4);
  EXPECT_EQ(j["target_forwards"], 2);
  EXPECT_DOUBLE_EQ(j["acceptance_rate"].get<double>(), 0.75);
  EXPECT_DOUBLE_EQ(j["mean_accepted_length"].get<double>(), 4.0);
  EXPECT_EQ(j["accepted_per_position"], (nlohmann::json{1, 1, 1, 0}));
  EXPECT_EQ(j["drafted_per_position"], (nlohmann::json{1, 1, 1, 1}));
  EXPECT_EQ(j["draft_ns"], 1000);
  EXPECT_EQ(j["verify_ns"], 5000);
}

}  // namespace
}  // namespace specdec
