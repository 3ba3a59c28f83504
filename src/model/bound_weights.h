// BoundWeights: a checkpoint's tensors bound to one backend. Zero-copy views where the backend
// reads host memory (CPU), otherwise uploaded copies owned here; it keeps the mappings alive
// and counts what the model binds (parameters, bytes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/weight.h"
#include "model/weights.h"

namespace specdec {

class BoundWeights {
 public:
  BoundWeights(WeightStore store, Backend& backend) : store_(std::move(store)), backend_(backend) {}
  BoundWeights(const BoundWeights&) = delete;
  BoundWeights& operator=(const BoundWeights&) = delete;

  // The backend-side view of one checkpoint tensor (norm weights, biases, embedding tables).
  Tensor tensor(const std::string& name);
  // A linear layer's weight, packed where the backend reads its own layout faster
  // (Backend::pack_weight).
  Weight weight(const std::string& name);
  // A tensor bound by tensor() read as a linear weight too (a tied LM head), packed likewise.
  Weight weight_of(const Tensor& bound);
  // Linear weights that read the same input (q/k/v, gate/up), in order. Uploaded into one
  // buffer, each right after the one before, when they share a dtype and K: a backend may then
  // run them as one product over the stacked rows. Otherwise (and where the backend reads host
  // memory) each as weight() gives it.
  std::vector<Weight> adjacent(const std::vector<std::string>& names);

  // Of every tensor bound so far (a tensor bound once and used twice, e.g. a tied LM head,
  // counts once).
  size_t parameter_count() const { return parameter_count_; }
  size_t bytes() const { return bytes_; }

 private:
  // Adds host to the counts of what the model binds.
  void count(const Tensor& host);
  // host copied to `at` (backend memory from one of uploads_).
  Tensor place(const Tensor& host, void* at);

  WeightStore store_;  // keeps the mappings the CPU views point into alive
  Backend& backend_;
  std::vector<Buffer> uploads_;  // copies, and packed layouts
  size_t parameter_count_ = 0;
  size_t bytes_ = 0;
};

}  // namespace specdec
