// BoundWeights: binding a checkpoint tensor to the backend, by view or by upload.
#include "model/bound_weights.h"

namespace specdec {

Tensor BoundWeights::tensor(const std::string& name) {
  const Tensor& host = store_.get(name);
  parameter_count_ += static_cast<size_t>(host.numel());
  bytes_ += host.bytes();
  if (host.device == backend_.device()) return host;  // zero copy: the backend reads host memory
  uploads_.push_back(backend_.allocate(host.bytes()));
  Tensor dev = host;
  dev.data = uploads_.back().data();
  dev.device = uploads_.back().device();
  backend_.copy(host, dev);
  return dev;
}

}  // namespace specdec
