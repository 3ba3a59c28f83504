// Timing the target's forwards for a replay, on scratch caches.
#include "api/replay_target.h"

#include "core/error.h"

namespace specdec {

double median_of(std::vector<double> v) {
  SPECDEC_CHECK(!v.empty(), "replay: a median of no measurements");
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

Scratch scratch(Model& model, const std::vector<int32_t>& context, int room) {
  Scratch sc;
  const int total = static_cast<int>(context.size()) + room;
  sc.cache = model.make_cache(total / 16 + 4);
  sc.seq = sc.cache->create();
  SPECDEC_CHECK(sc.cache->reserve(sc.seq, total), "replay: the scratch KV cache is too small");
  sc.context = static_cast<int>(context.size());
  if (!context.empty()) model.forward(ForwardRequest{{SequenceInput{sc.seq, context, {}}}, {}}, *sc.cache);
  return sc;
}

void window(Model& model, Scratch& sc, int width) {
  SPECDEC_CHECK(sc.cache->reserve(sc.seq, sc.context + width), "replay: the scratch KV cache is too small");
  SequenceInput in{sc.seq, std::vector<int32_t>(static_cast<size_t>(width), 7), {}};
  for (int j = 0; j < width; ++j) in.logits_at.push_back(j);
  model.forward(ForwardRequest{{in}, {}, std::vector<SampleRow>(static_cast<size_t>(width))}, *sc.cache);
  sc.cache->truncate(sc.seq, sc.context);
}

std::vector<double> time_windows(Model& model, Scratch& sc, int widths, int reps) {
  std::vector<std::vector<double>> t(static_cast<size_t>(widths) + 1);
  for (int pass = 0; pass < 3; ++pass)
    for (int w = 1; w <= widths; ++w) {
      for (int i = 0; i < 3; ++i) window(model, sc, w);  // not timed: the switch of width
      t[static_cast<size_t>(w)].push_back(median_seconds(reps, [&] { window(model, sc, w); }));
    }
  std::vector<double> forward(static_cast<size_t>(widths) + 1, 0.0);
  for (int w = 1; w <= widths; ++w) forward[static_cast<size_t>(w)] = median_of(t[static_cast<size_t>(w)]);
  return forward;
}

}  // namespace specdec
