// Input validation, linear's threading, and the element-wise kernels of the CPU backend
// (embedding, rms_norm, rope, silu_mul, add, gather_rows, argmax, sample). These are memory-bound and
// row-local, so one portable implementation serves every instruction set.
#include "backend/cpu/cpu_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "sampling/sampling.h"

namespace specdec::cpu {
namespace {

void for_rows(ThreadPool& pool, int64_t rows, int64_t work_per_row, const std::function<void(size_t, size_t)>& fn) {
  parallel_units(pool, rows, work_per_row, kMinChunkWork, 1, fn);
}

float load_f32(const void* p, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::f32:
      return static_cast<const float*>(p)[i];
    case DType::bf16:
      return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::f16:
      return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::i32:
      break;
  }
  return 0.0f;
}

void check_float(const Tensor& t, const char* op, const char* name) {
  check_host(t, op, name);
  SPECDEC_CHECK(t.dtype == DType::f32 || t.dtype == DType::bf16 || t.dtype == DType::f16, op, ": ", name,
                " must be f32, bf16 or f16, got ", t.shape_string());
}

void check_same_shape(const Tensor& a, const Tensor& b, const char* op, const char* an, const char* bn) {
  bool same = a.rank == b.rank;
  for (int i = 0; same && i < a.rank; ++i) same = a.dim(i) == b.dim(i);
  SPECDEC_CHECK(same, op, ": ", an, " ", a.shape_string(), " and ", bn, " ", b.shape_string(),
                " must have the same shape");
}

// out[i] = weight[i] * (x[i] * inv), the weight's element type resolved once per row.
void scale_row(const float* x, float inv, const Tensor& weight, float* out, int64_t D) {
  switch (weight.dtype) {
    case DType::bf16: {
      const auto* w = static_cast<const uint16_t*>(weight.data);
      for (int64_t i = 0; i < D; ++i) out[i] = bf16_to_f32(w[i]) * (x[i] * inv);
      return;
    }
    case DType::f16: {
      const auto* w = static_cast<const uint16_t*>(weight.data);
      for (int64_t i = 0; i < D; ++i) out[i] = f16_to_f32(w[i]) * (x[i] * inv);
      return;
    }
    default:
      for (int64_t i = 0; i < D; ++i) out[i] = load_f32(weight.data, weight.dtype, i) * (x[i] * inv);
  }
}

}  // namespace

void parallel_units(ThreadPool& pool, int64_t units, int64_t work_per_unit, int64_t min_work, int64_t align,
                    const std::function<void(size_t, size_t)>& fn) {
  if (units <= 0) return;
  const int64_t per = std::max<int64_t>(work_per_unit, 1);
  int64_t grain = std::max<int64_t>((min_work + per - 1) / per, 1);
  grain = (grain + align - 1) / align * align;
  if (grain >= units) return fn(0, static_cast<size_t>(units));
  // As many chunks as the minimum allows, up to one per thread, of equal size: chunks of the
  // minimum grain split e.g. three grains' worth 1:2, and the thread with one waited for the other.
  parallel_parts(pool, units, std::min<int64_t>(static_cast<int64_t>(pool.size()), (units + grain - 1) / grain), align,
                 fn);
}

void parallel_parts(ThreadPool& pool, int64_t units, int64_t parts, int64_t align,
                    const std::function<void(size_t, size_t)>& fn) {
  if (units <= 0) return;
  if (parts <= 1 || pool.size() == 1) return fn(0, static_cast<size_t>(units));
  const int64_t grain = ((units + parts - 1) / parts + align - 1) / align * align;
  pool.parallel_for(static_cast<size_t>(units), static_cast<size_t>(grain), fn);
}

void check_host(const Tensor& t, const char* op, const char* name) {
  SPECDEC_CHECK(t.data != nullptr || t.numel() == 0, op, ": ", name, " is empty");
  SPECDEC_CHECK(t.rank >= 1, op, ": ", name, " has rank 0");
  SPECDEC_CHECK(t.device == Device::cpu, op, ": ", name, " ", t.shape_string(), " is in ", device_name(t.device),
                " memory, the cpu backend needs host memory");
}

void check_dtype(const Tensor& t, DType dtype, const char* op, const char* name) {
  check_host(t, op, name);
  SPECDEC_CHECK(t.dtype == dtype, op, ": ", name, " must be ", dtype_name(dtype), ", got ", t.shape_string());
}

int64_t row_length(const Tensor& t) { return t.rank == 0 ? 0 : t.dim(-1); }
int64_t row_count(const Tensor& t) {
  const int64_t len = row_length(t);
  return len == 0 ? 0 : t.numel() / len;
}

LinearArgs linear_args(const Kernels& k, const Tensor& x, const Weight& w, const Tensor* bias, const Tensor& out,
                       const char* op, Buffer& x_bf16) {
  const Tensor& weight = w.dense(op);
  check_dtype(x, DType::f32, op, "x");
  check_float(weight, op, "weight");
  check_dtype(out, DType::f32, op, "out");
  SPECDEC_CHECK(weight.rank == 2, op, ": weight must be [N, K], got ", weight.shape_string());
  LinearArgs a;
  a.M = row_count(x);
  a.K = row_length(x);
  a.N = weight.dim(0);
  SPECDEC_CHECK(weight.dim(1) == a.K, op, ": x ", x.shape_string(), " has K = ", a.K, " but weight is ",
                weight.shape_string());
  SPECDEC_CHECK(row_count(out) == a.M && row_length(out) == a.N, op, ": out ", out.shape_string(), " must be [", a.M,
                ", ", a.N, "] for x ", x.shape_string(), " and weight ", weight.shape_string());
  if (bias) {
    check_dtype(*bias, DType::f32, op, "bias");
    SPECDEC_CHECK(bias->numel() == a.N, op, ": bias ", bias->shape_string(), " must have ", a.N, " elements");
  }
  SPECDEC_CHECK(!overlaps(x, out), op, ": out must not alias x");
  a.x = x.ptr<float>();
  a.w = weight.data;
  a.wdtype = weight.dtype;
  a.bias = bias ? bias->ptr<float>() : nullptr;
  a.out = out.ptr<float>();
  if (k.packed_weights && !w.packed.empty() && a.wdtype == DType::bf16) {
    SPECDEC_CHECK(w.packed.dtype == DType::bf16 && w.packed.rank == 2 && w.packed.dim(0) == packed_rows(a.N) &&
                      w.packed.dim(1) == a.K && a.K % kPackK == 0,
                  op, ": packed weight ", w.packed.shape_string(), " does not pack ", weight.shape_string());
    a.w_packed = w.packed.ptr<uint16_t>();
  }
  if (k.bf16_activations && a.wdtype == DType::bf16 && a.M * a.K > 0) {
    // The tile layout follows the row-major copy in the same buffer; it depends on K only, never
    // on M, whether a kernel gets it.
    const bool tiles = k.pack_bf16 != nullptr && a.K % kTileK == 0;
    // The tiles start on a 64-byte boundary after the rows.
    const int64_t tiles_at = (a.M * a.K + 31) / 32 * 32;
    const int64_t elements = tiles ? tiles_at + tile_activation_elements(a.M, a.K) : a.M * a.K;
    if (x_bf16.bytes() == 0) {
      // Several projections of one x share the rounded copy: callers pass an empty buffer per x.
      x_bf16 = Buffer::host(static_cast<size_t>(elements) * sizeof(uint16_t));
      auto* dst = static_cast<uint16_t*>(x_bf16.data());
      if (k.pack_bf16) {
        k.pack_bf16(a.x, a.M, a.K, dst, tiles ? dst + tiles_at : nullptr);
      } else {
        for (int64_t i = 0; i < a.M * a.K; ++i) dst[i] = f32_to_bf16(a.x[i]);
      }
    }
    a.x_bf16 = static_cast<const uint16_t*>(x_bf16.data());
    if (tiles) a.x_tiles = a.x_bf16 + tiles_at;
  }
  return a;
}

void pack_bf16_rows(const uint16_t* w, int64_t N, int64_t K, uint16_t* packed) {
  const int64_t rows = packed_rows(N);
  for (int64_t g = 0; g < rows; g += kPackRows) {
    for (int64_t c = 0; c < K; c += kPackK) {
      uint16_t* dst = packed + g * K + c * kPackRows;
      for (int64_t j = 0; j < kPackRows; ++j, dst += kPackK) {
        if (g + j < N) {
          std::memcpy(dst, w + (g + j) * K + c, kPackK * sizeof(uint16_t));
        } else {
          std::memset(dst, 0, kPackK * sizeof(uint16_t));
        }
      }
    }
  }
}

void linear(ThreadPool& pool, const Kernels& k, const Tensor& x, const Weight& weight, const Tensor* bias,
            const Tensor& out) {
  Buffer x_bf16;
  const LinearArgs a = linear_args(k, x, weight, bias, out, "linear", x_bf16);
  if (a.M == 0 || a.N == 0) return;
  const auto run = [&](size_t b, size_t e) { k.linear(a, static_cast<int64_t>(b), static_cast<int64_t>(e)); };
  // Threads split N only (each output is computed whole by one thread); chunks are multiples of
  // 16 rows so every thread starts on a full register tile.
  parallel_units(pool, a.N, a.M * a.K, kMinChunkWork, 16, run);
}

void embedding(ThreadPool& pool, const Tensor& table, const Tensor& ids, const Tensor& out) {
  check_float(table, "embedding", "table");
  check_dtype(ids, DType::i32, "embedding", "ids");
  check_dtype(out, DType::f32, "embedding", "out");
  SPECDEC_CHECK(table.rank == 2, "embedding: table must be [V, H], got ", table.shape_string());
  const int64_t V = table.dim(0), H = table.dim(1), T = ids.numel();
  SPECDEC_CHECK(row_count(out) == T && row_length(out) == H, "embedding: out ", out.shape_string(), " must be [", T,
                ", ", H, "]");
  const int32_t* id = ids.ptr<int32_t>();
  for (int64_t t = 0; t < T; ++t) {
    SPECDEC_CHECK(id[t] >= 0 && id[t] < V, "embedding: id ", id[t], " at ", t, " outside vocabulary of ", V);
  }
  float* o = out.ptr<float>();
  for_rows(pool, T, H, [&](size_t b, size_t e) {
    for (size_t t = b; t < e; ++t) {
      const int64_t base = static_cast<int64_t>(id[t]) * H;
      for (int64_t i = 0; i < H; ++i) o[static_cast<int64_t>(t) * H + i] = load_f32(table.data, table.dtype, base + i);
    }
  });
}

void rms_norm(ThreadPool& pool, const Tensor& x, const Tensor& weight, float eps, const Tensor& out) {
  check_dtype(x, DType::f32, "rms_norm", "x");
  check_float(weight, "rms_norm", "weight");
  check_dtype(out, DType::f32, "rms_norm", "out");
  check_same_shape(x, out, "rms_norm", "x", "out");
  const int64_t D = row_length(x), rows = row_count(x);
  SPECDEC_CHECK(weight.numel() == D, "rms_norm: weight ", weight.shape_string(), " must have ", D, " elements");
  const float* in = x.ptr<float>();
  float* o = out.ptr<float>();
  for_rows(pool, rows, D, [&](size_t b, size_t e) {
    for (size_t r = b; r < e; ++r) {
      const float* xr = in + static_cast<int64_t>(r) * D;
      float* orow = o + static_cast<int64_t>(r) * D;
      // Sum of squares in double: element i goes to partial sum i mod 8 in index order, and the
      // partial sums fold in a fixed tree. Accurate, independent of the ISA, and eight
      // independent chains instead of one (a 512-element row took ~0.6 µs as one chain).
      double part[8] = {};
      for (int64_t i = 0; i < D; ++i) part[i % 8] += static_cast<double>(xr[i]) * xr[i];
      const double ss = ((part[0] + part[4]) + (part[2] + part[6])) + ((part[1] + part[5]) + (part[3] + part[7]));
      const float mean = static_cast<float>(ss / static_cast<double>(D));
      const float inv = 1.0f / std::sqrt(mean + eps);
      // As transformers: weight * (x * rsqrt(var + eps)).
      scale_row(xr, inv, weight, orow, D);
    }
  });
}

void check_rope(const Tensor& x, const Tensor& positions, const Tensor& inv_freq, const char* op, const char* name) {
  check_dtype(x, DType::f32, op, name);
  check_dtype(positions, DType::i32, op, "positions");
  check_dtype(inv_freq, DType::f32, op, "inv_freq");
  SPECDEC_CHECK(x.rank == 3, op, ": ", name, " must be [T, heads, head_dim], got ", x.shape_string());
  const int64_t T = x.dim(0), d = x.dim(2), half = d / 2;
  SPECDEC_CHECK(d % 2 == 0, op, ": head_dim ", d, " must be even");
  SPECDEC_CHECK(positions.numel() == T, op, ": positions ", positions.shape_string(), " must have ", T, " elements");
  SPECDEC_CHECK(inv_freq.numel() == half, op, ": inv_freq ", inv_freq.shape_string(), " must have ", half,
                " elements (head_dim / 2)");
}

void rope(ThreadPool& pool, const Tensor& x, const Tensor& positions, const Tensor& inv_freq, float scaling) {
  check_rope(x, positions, inv_freq, "rope", "x");
  const int64_t T = x.dim(0), heads = x.dim(1), d = x.dim(2), half = d / 2;
  const int32_t* pos = positions.ptr<int32_t>();
  float* data = x.ptr<float>();
  for_rows(pool, T, heads * d * 8, [&](size_t b, size_t e) {
    std::vector<float> c(static_cast<size_t>(half)), s(static_cast<size_t>(half));
    for (size_t t = b; t < e; ++t) {
      rope_angles(pos[t], inv_freq.ptr<float>(), half, scaling, c.data(), s.data());
      rope_rotate(data + static_cast<int64_t>(t) * heads * d, heads, d, c.data(), s.data());
    }
  });
}

void rope_angles(int32_t position, const float* inv_freq, int64_t half, float scaling, float* c, float* s) {
  for (int64_t i = 0; i < half; ++i) {
    const float angle = static_cast<float>(position) * inv_freq[i];
    c[i] = static_cast<float>(std::cos(static_cast<double>(angle))) * scaling;
    s[i] = static_cast<float>(std::sin(static_cast<double>(angle))) * scaling;
  }
}

void rope_rotate(float* x, int64_t heads, int64_t d, const float* c, const float* s) {
  const int64_t half = d / 2;
  for (int64_t h = 0; h < heads; ++h) {
    float* v = x + h * d;
    for (int64_t i = 0; i < half; ++i) {
      const float x1 = v[i], x2 = v[i + half];
      const float ci = c[i], si = s[i];
      // x * cos + rotate_half(x) * sin, rotate_half(x) = (-x2, x1).
      const float a1 = x1 * ci, b1 = x2 * si, a2 = x2 * ci, b2 = x1 * si;
      v[i] = a1 - b1;
      v[i + half] = a2 + b2;
    }
  }
}

void silu_mul(ThreadPool& pool, const Kernels& k, const Tensor& gate, const Tensor& up, const Tensor& out) {
  check_dtype(gate, DType::f32, "silu_mul", "gate");
  check_dtype(up, DType::f32, "silu_mul", "up");
  check_dtype(out, DType::f32, "silu_mul", "out");
  check_same_shape(gate, up, "silu_mul", "gate", "up");
  check_same_shape(gate, out, "silu_mul", "gate", "out");
  const int64_t D = row_length(gate);
  const float* g = gate.ptr<float>();
  const float* u = up.ptr<float>();
  float* o = out.ptr<float>();
  for_rows(pool, row_count(gate), D * 8, [&](size_t b, size_t e) {
    const int64_t begin = static_cast<int64_t>(b) * D;
    k.silu_mul(g + begin, u + begin, o + begin, static_cast<int64_t>(e - b) * D);
  });
}

void add(ThreadPool& pool, const Tensor& a, const Tensor& b, const Tensor& out) {
  check_dtype(a, DType::f32, "add", "a");
  check_dtype(b, DType::f32, "add", "b");
  check_dtype(out, DType::f32, "add", "out");
  check_same_shape(a, b, "add", "a", "b");
  check_same_shape(a, out, "add", "a", "out");
  const int64_t D = row_length(a);
  const float* x = a.ptr<float>();
  const float* y = b.ptr<float>();
  float* o = out.ptr<float>();
  for_rows(pool, row_count(a), D, [&](size_t lo, size_t hi) {
    for (int64_t i = static_cast<int64_t>(lo) * D; i < static_cast<int64_t>(hi) * D; ++i) o[i] = x[i] + y[i];
  });
}

void gather_rows(ThreadPool& pool, const Tensor& x, const Tensor& indices, const Tensor& out) {
  check_host(x, "gather_rows", "x");
  check_dtype(indices, DType::i32, "gather_rows", "indices");
  check_dtype(out, x.dtype, "gather_rows", "out");
  const int64_t rows = x.dim(0), n = indices.numel();
  const int64_t row_elems = rows == 0 ? 0 : x.numel() / rows;
  SPECDEC_CHECK(out.dim(0) == n && out.numel() == n * row_elems, "gather_rows: out ", out.shape_string(), " must hold ",
                n, " rows of ", row_elems, " elements");
  SPECDEC_CHECK(!overlaps(x, out) || n == 0, "gather_rows: out must not alias x");
  const int32_t* idx = indices.ptr<int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    SPECDEC_CHECK(idx[i] >= 0 && idx[i] < rows, "gather_rows: index ", idx[i], " at ", i, " outside ", rows, " rows");
  }
  const size_t row_bytes = static_cast<size_t>(row_elems) * dtype_size(x.dtype);
  for_rows(pool, n, row_elems, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) {
      std::memcpy(static_cast<char*>(out.data) + i * row_bytes,
                  static_cast<const char*>(x.data) + static_cast<size_t>(idx[i]) * row_bytes, row_bytes);
    }
  });
}

void scatter_columns(ThreadPool& pool, const Tensor& x, const Tensor& index, float fill, const Tensor& out) {
  check_host(x, "scatter_columns", "x");
  check_dtype(x, DType::f32, "scatter_columns", "x");
  check_dtype(index, DType::i32, "scatter_columns", "index");
  check_dtype(out, DType::f32, "scatter_columns", "out");
  const int64_t C = x.dim(-1), n = C == 0 ? 0 : x.numel() / C, V = out.dim(-1);
  SPECDEC_CHECK(index.numel() == C, "scatter_columns: index ", index.shape_string(),
                " must have one entry per column of x ", x.shape_string());
  SPECDEC_CHECK(out.numel() == n * V, "scatter_columns: out ", out.shape_string(), " must hold ", n, " rows");
  SPECDEC_CHECK(!overlaps(x, out) || n == 0, "scatter_columns: out must not alias x");
  const int32_t* idx = index.ptr<int32_t>();
  for_rows(pool, n, V, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) {
      const float* src = x.ptr<float>() + static_cast<int64_t>(i) * C;
      float* dst = out.ptr<float>() + static_cast<int64_t>(i) * V;
      std::fill(dst, dst + V, fill);
      for (int64_t c = 0; c < C; ++c)
        if (idx[c] >= 0 && idx[c] < V) dst[idx[c]] = src[c];
    }
  });
}

void argmax(ThreadPool& pool, const Tensor& logits, const Tensor& out) {
  check_dtype(logits, DType::f32, "argmax", "logits");
  check_dtype(out, DType::i32, "argmax", "out");
  const int64_t V = row_length(logits), n = row_count(logits);
  SPECDEC_CHECK(V > 0, "argmax: logits ", logits.shape_string(), " has no columns");
  SPECDEC_CHECK(out.numel() == n, "argmax: out ", out.shape_string(), " must have ", n, " elements");
  const float* l = logits.ptr<float>();
  int32_t* o = out.ptr<int32_t>();
  for_rows(pool, n, V, [&](size_t b, size_t e) {
    for (size_t r = b; r < e; ++r) {
      const float* row = l + static_cast<int64_t>(r) * V;
      int64_t best = 0;
      bool nan = std::isnan(row[0]);
      // Strictly greater: the lowest index wins ties. A row with a NaN gets -1, as sample()
      // marks a row it cannot draw from: the caller reports it instead of emitting a token.
      for (int64_t i = 1; i < V; ++i) {
        if (row[i] > row[best]) best = i;
        nan |= std::isnan(row[i]);
      }
      o[r] = nan ? -1 : static_cast<int32_t>(best);
    }
  });
}

void top_logprob(ThreadPool& pool, const Kernels& k, const Tensor& logits, const Tensor& out) {
  check_dtype(logits, DType::f32, "top_logprob", "logits");
  check_dtype(out, DType::f32, "top_logprob", "out");
  const int64_t V = row_length(logits), n = row_count(logits);
  SPECDEC_CHECK(V > 0, "top_logprob: logits ", logits.shape_string(), " has no columns");
  SPECDEC_CHECK(out.numel() == n, "top_logprob: out ", out.shape_string(), " must have ", n, " elements");
  const float* l = logits.ptr<float>();
  float* o = out.ptr<float>();
  for_rows(pool, n, V, [&](size_t b, size_t e) {
    for (size_t r = b; r < e; ++r) {
      const float* row = l + static_cast<int64_t>(r) * V;
      float top = row[0];
      for (int64_t i = 1; i < V; ++i) top = std::max(top, row[i]);  // std::max keeps a leading NaN
      o[r] = static_cast<float>(-std::log(k.sum_exp(row, V, top)));  // NaN anywhere makes the sum NaN
    }
  });
}

void sample(ThreadPool& pool, const Tensor& logits, const Tensor& rows, const Tensor& out) {
  check_dtype(logits, DType::f32, "sample", "logits");
  check_dtype(rows, DType::i32, "sample", "rows");
  check_dtype(out, DType::i32, "sample", "out");
  const int64_t V = row_length(logits), n = row_count(logits);
  SPECDEC_CHECK(V > 0, "sample: logits ", logits.shape_string(), " has no columns");
  SPECDEC_CHECK(rows.numel() == n * kSampleRowWords, "sample: rows ", rows.shape_string(), " must be [", n, ", ",
                kSampleRowWords, "] (one SampleRow per logits row)");
  SPECDEC_CHECK(out.numel() == n, "sample: out ", out.shape_string(), " must have ", n, " elements");
  const float* l = logits.ptr<float>();
  int32_t* o = out.ptr<int32_t>();
  // A filtered row costs several passes over the vocabulary (softmaxes, selections).
  for_rows(pool, n, 8 * V, [&](size_t b, size_t e) {
    for (size_t r = b; r < e; ++r) {
      SampleRow row;  // copied out: an i32 tensor need not be 8-byte aligned
      std::memcpy(static_cast<void*>(&row), rows.ptr<int32_t>() + r * kSampleRowWords, sizeof(row));
      o[r] = specdec::sample(std::span<const float>(l + static_cast<int64_t>(r) * V, static_cast<size_t>(V)), row);
    }
  });
}

}  // namespace specdec::cpu
