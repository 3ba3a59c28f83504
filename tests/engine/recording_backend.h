// A backend that records the way a graph-capturing device backend does, over any other backend:
// record() keeps each kernel call with its arguments as they were (tensor views and every scalar,
// the AttentionBatch's bounds included) and replay() makes those calls again, reading whatever
// the buffers hold by then. So the CPU can run the replayed forwards a GPU runs, and a test can
// see a recording that bakes in something a later replay needs changed.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"

namespace specdec::testing {

class RecordingBackend : public Backend {
 public:
  explicit RecordingBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}

  int recordings() const { return recordings_; }
  int replays() const { return replays_; }

  Device device() const override { return inner_->device(); }
  std::string name() const override { return "recording " + inner_->name(); }
  DType kv_dtype() const override { return inner_->kv_dtype(); }
  Buffer allocate(size_t bytes) override { return inner_->allocate(bytes); }
  size_t memory_available() const override { return inner_->memory_available(); }
  // A recording holds kernel calls only (Backend::record's contract): a copy while recording
  // fails the recording, as it fails a device's capture.
  void copy(const Tensor& src, const Tensor& dst) override {
    SPECDEC_CHECK(calls_ == nullptr, "copy while recording");
    inner_->copy(src, dst);
  }
  void synchronize() override {
    SPECDEC_CHECK(calls_ == nullptr, "synchronize while recording");
    inner_->synchronize();
  }
  bool queues_calls() const override { return inner_->queues_calls(); }
  Buffer allocate_staging(size_t bytes) override { return inner_->allocate_staging(bytes); }
  void copy_to_staging(const Tensor& src, const Tensor& dst) override {
    SPECDEC_CHECK(calls_ == nullptr, "copy while recording");
    inner_->copy_to_staging(src, dst);
  }
  uint64_t fence() override {
    SPECDEC_CHECK(calls_ == nullptr, "fence while recording");
    return inner_->fence();
  }
  void wait_for(uint64_t fence) override { inner_->wait_for(fence); }

  void embedding(const Tensor& table, const Tensor& ids, const Tensor& out) override {
    call([=, this] { inner_->embedding(table, ids, out); });
  }
  void rms_norm(const Tensor& x, const Tensor& weight, float eps, const Tensor& out) override {
    call([=, this] { inner_->rms_norm(x, weight, eps, out); });
  }
  void linear(const Tensor& x, const Weight& weight, const Tensor* bias, const Tensor& out) override {
    const std::optional<Tensor> b = bias ? std::optional<Tensor>(*bias) : std::nullopt;
    call([=, this] { inner_->linear(x, weight, b ? &*b : nullptr, out); });
  }
  void rope(const Tensor& x, const Tensor& positions, const Tensor& inv_freq, float attention_scaling) override {
    call([=, this] { inner_->rope(x, positions, inv_freq, attention_scaling); });
  }
  void silu_mul(const Tensor& gate, const Tensor& up, const Tensor& out) override {
    call([=, this] { inner_->silu_mul(gate, up, out); });
  }
  void add(const Tensor& a, const Tensor& b, const Tensor& out) override {
    call([=, this] { inner_->add(a, b, out); });
  }
  void gather_rows(const Tensor& x, const Tensor& indices, const Tensor& out) override {
    call([=, this] { inner_->gather_rows(x, indices, out); });
  }
  void scatter_columns(const Tensor& x, const Tensor& index, float fill, const Tensor& out) override {
    call([=, this] { inner_->scatter_columns(x, index, fill, out); });
  }
  void kv_write(const Tensor& k, const Tensor& v, const Tensor& k_pool, const Tensor& v_pool,
                const AttentionBatch& batch) override {
    call([=, this] { inner_->kv_write(k, v, k_pool, v_pool, batch); });
  }
  void attention(const Tensor& q, const Tensor& k_pool, const Tensor& v_pool, const AttentionBatch& batch, float scale,
                 const Tensor& out) override {
    call([=, this] { inner_->attention(q, k_pool, v_pool, batch, scale, out); });
  }
  void argmax(const Tensor& logits, const Tensor& out) override {
    call([=, this] { inner_->argmax(logits, out); });
  }
  void top_logprob(const Tensor& logits, const Tensor& out) override {
    call([=, this] { inner_->top_logprob(logits, out); });
  }
  void sample(const Tensor& logits, const Tensor& rows, const Tensor& out) override {
    call([=, this] { inner_->sample(logits, rows, out); });
  }
  void linear_many(const Tensor& x, std::span<const Projection> projections) override {
    const std::vector<Projection> p(projections.begin(), projections.end());
    call([=, this] { inner_->linear_many(x, p); });
  }
  void gated_linear(const Tensor& x, const Weight& w_gate, const Weight& w_up, const Tensor& out) override {
    call([=, this] { inner_->gated_linear(x, w_gate, w_up, out); });
  }
  void linear_add(const Tensor& x, const Weight& weight, const Tensor* bias, const Tensor& out) override {
    const std::optional<Tensor> b = bias ? std::optional<Tensor>(*bias) : std::nullopt;
    call([=, this] { inner_->linear_add(x, weight, b ? &*b : nullptr, out); });
  }
  void norm_linear_many(const Tensor& x, const Tensor& norm_weight, float eps, const Tensor& normed,
                        std::span<const Projection> projections) override {
    const std::vector<Projection> p(projections.begin(), projections.end());
    call([=, this] { inner_->norm_linear_many(x, norm_weight, eps, normed, p); });
  }
  void norm_gated_linear(const Tensor& x, const Tensor& norm_weight, float eps, const Tensor& normed,
                         const Weight& w_gate, const Weight& w_up, const Tensor& out) override {
    call([=, this] { inner_->norm_gated_linear(x, norm_weight, eps, normed, w_gate, w_up, out); });
  }
  void rope_kv_write(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& positions, const Tensor& inv_freq,
                     float attention_scaling, const Tensor& k_pool, const Tensor& v_pool,
                     const AttentionBatch& batch) override {
    call([=, this] { inner_->rope_kv_write(q, k, v, positions, inv_freq, attention_scaling, k_pool, v_pool, batch); });
  }
  void rope_kv_write_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& positions,
                               const Tensor& inv_freq, float attention_scaling, const Tensor& k_pool,
                               const Tensor& v_pool, const AttentionBatch& batch, float scale,
                               const Tensor& out) override {
    call([=, this] {
      inner_->rope_kv_write_attention(q, k, v, positions, inv_freq, attention_scaling, k_pool, v_pool, batch, scale,
                                      out);
    });
  }

  std::unique_ptr<RecordedCalls> record(const std::function<void()>& enqueue) override {
    auto recording = std::make_unique<Recording>(*this);
    calls_ = &recording->calls;
    try {
      enqueue();
    } catch (...) {
      calls_ = nullptr;
      throw;
    }
    calls_ = nullptr;
    ++recordings_;
    return recording;
  }

 private:
  struct Recording : RecordedCalls {
    explicit Recording(RecordingBackend& b) : backend(b) {}
    bool replay() override {
      ++backend.replays_;
      for (const auto& c : calls) c();
      return true;
    }
    RecordingBackend& backend;
    std::vector<std::function<void()>> calls;
  };

  // Runs the call now, or keeps it when recording.
  template <typename Call>
  void call(Call&& c) {
    if (calls_)
      calls_->push_back(std::forward<Call>(c));
    else
      c();
  }

  std::unique_ptr<Backend> inner_;
  std::vector<std::function<void()>>* calls_ = nullptr;  // the recording in progress
  int recordings_ = 0, replays_ = 0;
};

}  // namespace specdec::testing
