// A forward uploads the metadata of its own plan (token ids, positions, slots, block table,
// sampling rows). The buffer that holds it on the backend keeps the size of the largest plan seen;
// a forward that staged and copied all of it would pay, at every later decode step, for the
// longest prefill before it. Counted on a backend that records and replays like a GPU's: a short
// request copies the same bytes before and after a long prompt.
#include "engine_fixture.h"
#include "recording_backend.h"

namespace specdec::testing {
namespace {

// Counts the bytes of every copy, host to backend and back.
class CopyCounter final : public RecordingBackend {
 public:
  using RecordingBackend::RecordingBackend;
  size_t bytes = 0;
  void copy(const Tensor& src, const Tensor& dst) override {
    bytes += src.bytes();
    RecordingBackend::copy(src, dst);
  }
};

TEST(MetaUpload, AStepCopiesItsOwnPlanNotTheLargestBeforeIt) {
  auto owned = std::make_unique<CopyCounter>(make_backend(test_backend_options()));
  CopyCounter& counter = *owned;
  Bundled models = Bundled::load(std::move(owned));
  EngineOptions options;
  options.prefix_cache = false;  // each run of the short request computes its whole prompt
  // Steps launched ahead (a GPU's default) upload one more array than the others: on every
  // backend alike, so that the counts are the same everywhere.
  options.overlap = Overlap::always;
  auto engine = make_engine(0, options, models);
  const auto copied = [&](const std::vector<int32_t>& prompt, int max_tokens) {
    const size_t before = counter.bytes;
    const RequestResult r = run_one(*engine, make_request(prompt, max_tokens));
    EXPECT_EQ(static_cast<int>(r.tokens.size()), max_tokens);
    return counter.bytes - before;
  };
  const std::vector<int32_t> short_prompt = models.tokenizer->encode("def add(a, b):\n", false);
  copied(short_prompt, 24);  // its shapes' first runs and recordings
  const size_t short_bytes = copied(short_prompt, 24);

  // A prompt of a whole prefill chunk grows the metadata buffer far past a decode step's plan.
  std::vector<int32_t> long_prompt;
  const std::vector<int32_t> piece =
      models.tokenizer->encode("for (int i = 0; i < n; ++i) total += values[i];\n", false);
  while (long_prompt.size() + piece.size() <= static_cast<size_t>(options.max_batch_tokens))
    long_prompt.insert(long_prompt.end(), piece.begin(), piece.end());
  // Its prefill's plan alone outweighs several of the short request's forwards.
  ASSERT_GT(copied(long_prompt, 1), 3 * short_bytes / 24);

  EXPECT_EQ(copied(short_prompt, 24), short_bytes);
}

}  // namespace
}  // namespace specdec::testing
