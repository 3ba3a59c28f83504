// The EAGLE-3 head's context rows (eagle3_head.h): target tokens outside the draft vocabulary
// that the drafter's rows hold get logit columns after the draft vocabulary's, copied from the
// target's LM head and scaled to the head's row norms, the least recently seen giving way.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/dtype.h"
#include "speculative/methods/eagle3_head.h"

namespace specdec {

std::vector<float> Eagle3Head::host_rows(const Weight& weight, std::span<const int32_t> ids) {
  const Tensor& table = weight.data;
  const int64_t n = static_cast<int64_t>(ids.size()), H = table.dim(1);
  const size_t index_bytes = (ids.size() * sizeof(int32_t) + 255) / 256 * 256;
  const size_t row_bytes = static_cast<size_t>(H) * dtype_size(table.dtype);
  Buffer stage = backend_.allocate(index_bytes + ids.size() * row_bytes);
  const Tensor index = stage.view(DType::i32, {n});
  const Tensor rows(static_cast<char*>(stage.data()) + index_bytes, table.dtype, {n, H}, stage.device());
  backend_.copy(Tensor(const_cast<int32_t*>(ids.data()), DType::i32, {n}), index);
  backend_.gather_rows(table, index, rows);
  std::vector<uint16_t> half;
  std::vector<float> out(static_cast<size_t>(n * H));
  if (table.dtype == DType::f32) {
    backend_.copy(rows, Tensor(out.data(), DType::f32, {n, H}));
  } else {
    half.resize(out.size());
    backend_.copy(rows, Tensor(half.data(), table.dtype, {n, H}));
    for (size_t i = 0; i < out.size(); ++i)
      out[i] = table.dtype == DType::bf16 ? bf16_to_f32(half[i]) : f16_to_f32(half[i]);
  }
  backend_.synchronize();
  return out;
}

void Eagle3Head::use_target_rows(const Weight& lm_head, int rows) {
  const ModelConfig& l = config_.layer;
  const int64_t V = l.vocab_size, H = l.hidden_size, Vd = config_.draft_vocab;
  if (Vd >= V || rows <= 0 || lm_head.quantized() || lm_head.rows() != V || lm_head.cols() != H) return;
  const DType dt = lm_head_.data.dtype;

  // The scale: the head's row norms over the target's, on up to 1,024 draft ids spread evenly.
  const int64_t sample = std::min<int64_t>(Vd, 1024);
  std::vector<int32_t> draft_ids, target_ids;
  for (int64_t j = 0; j < sample; ++j) {
    draft_ids.push_back(static_cast<int32_t>(j * Vd / sample));
    target_ids.push_back(draft_to_target_[static_cast<size_t>(draft_ids.back())]);
  }
  const auto norm_sum = [&](const std::vector<float>& rows) {
    double total = 0;
    for (int64_t j = 0; j < sample; ++j) {
      double sum = 0;
      for (int64_t k = 0; k < H; ++k) {
        const double x = rows[static_cast<size_t>(j * H + k)];
        sum += x * x;
      }
      total += std::sqrt(sum);
    }
    return total;
  };
  const double head_sum = norm_sum(host_rows(lm_head_, draft_ids));
  const double target_sum = norm_sum(host_rows(lm_head, target_ids));
  const double scale = head_sum / target_sum;
  if (!(target_sum > 0) || !std::isfinite(scale) || !(scale > 0)) return;
  context_scale_ = static_cast<float>(scale);

  // lm_head_ grows by the context rows, each a copy of draft id 0's row until taken.
  const int K = static_cast<int>(std::min<int64_t>(rows, V - Vd));
  const int64_t N = Vd + K;
  Buffer grown = backend_.allocate(static_cast<size_t>(N * H) * dtype_size(dt));
  const Tensor all = grown.view(dt, {N, H});
  backend_.copy(lm_head_.data.rows(0, Vd), all.rows(0, Vd));
  const std::vector<int32_t> zeros(static_cast<size_t>(K), 0);
  Buffer index = backend_.allocate(zeros.size() * sizeof(int32_t));
  const Tensor zero_index = index.view(DType::i32, {K});
  backend_.copy(Tensor(const_cast<int32_t*>(zeros.data()), DType::i32, {K}), zero_index);
  backend_.gather_rows(lm_head_.data, zero_index, all.rows(Vd, K));
  backend_.synchronize();
  lm_head_rows_ = std::move(grown);
  lm_head_ = Weight(all);
  context_rows_ = K;
  context_used_ = 0;
  draft_to_target_.resize(static_cast<size_t>(Vd));
  draft_to_target_.resize(static_cast<size_t>(N), draft_to_target_.front());
  draft_to_target_device_ = upload(DType::i32, {N, 1}, draft_to_target_.data());
  in_draft_.assign(static_cast<size_t>(V), 0);
  for (int64_t i = 0; i < Vd; ++i) in_draft_[static_cast<size_t>(draft_to_target_[static_cast<size_t>(i)])] = 1;
  context_column_.assign(static_cast<size_t>(V), -1);
  context_seen_.assign(static_cast<size_t>(K), 0);
  // The recordings read the old buffers and the narrower logits.
  chain_replays_.clear();
  whole_replays_.clear();
}

void Eagle3Head::note_context(std::span<const int32_t> tokens, const Weight& lm_head) {
  if (context_rows_ == 0) return;
  const int64_t V = config_.layer.vocab_size, H = config_.layer.hidden_size, Vd = config_.draft_vocab;
  std::vector<int32_t> taken;  // columns (from draft id 0) given a new token by this call
  for (const int32_t t : tokens) {
    if (t < 0 || t >= V || in_draft_[static_cast<size_t>(t)]) continue;
    ++context_tick_;
    if (const int32_t c = context_column_[static_cast<size_t>(t)]; c >= 0) {
      context_seen_[static_cast<size_t>(c - Vd)] = context_tick_;
      continue;
    }
    int slot = context_used_;
    if (context_used_ < context_rows_) {
      ++context_used_;
    } else {
      slot = static_cast<int>(std::min_element(context_seen_.begin(), context_seen_.end()) - context_seen_.begin());
      context_column_[static_cast<size_t>(draft_to_target_[static_cast<size_t>(Vd + slot)])] = -1;
    }
    const int32_t column = static_cast<int32_t>(Vd + slot);
    context_column_[static_cast<size_t>(t)] = column;
    context_seen_[static_cast<size_t>(slot)] = context_tick_;
    draft_to_target_[static_cast<size_t>(column)] = t;
    if (std::find(taken.begin(), taken.end(), column) == taken.end()) taken.push_back(column);
  }
  if (taken.empty()) return;
  // Columns in order, so that a run of neighbours (a prompt filling fresh columns) is one copy.
  std::sort(taken.begin(), taken.end());
  std::vector<int32_t> ids;
  for (const int32_t c : taken) ids.push_back(draft_to_target_[static_cast<size_t>(c)]);
  std::vector<float> rows = host_rows(lm_head, ids);
  for (float& x : rows) x *= context_scale_;
  const DType dt = lm_head_.data.dtype;
  std::vector<uint16_t> half;
  if (dt != DType::f32) {
    half.resize(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) half[i] = dt == DType::bf16 ? f32_to_bf16(rows[i]) : f32_to_f16(rows[i]);
  }
  for (size_t j = 0; j < taken.size();) {
    size_t end = j + 1;
    while (end < taken.size() && taken[end] == taken[end - 1] + 1) ++end;
    const int64_t n = static_cast<int64_t>(end - j), first = taken[j];
    void* src = dt == DType::f32 ? static_cast<void*>(rows.data() + j * static_cast<size_t>(H))
                                 : static_cast<void*>(half.data() + j * static_cast<size_t>(H));
    backend_.copy(Tensor(src, dt, {n, H}), lm_head_.data.rows(first, n));
    backend_.copy(Tensor(&draft_to_target_[static_cast<size_t>(first)], DType::i32, {n, 1}),
                  draft_to_target_device_.rows(first, n));
    j = end;
  }
}

}  // namespace specdec
