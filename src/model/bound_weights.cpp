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

std::vector<Weight> BoundWeights::adjacent(const std::vector<std::string>& names) {
  std::vector<const Tensor*> hosts;
  size_t total = 0;
  bool stackable = !names.empty();
  for (const std::string& name : names) {
    const Tensor& host = store_.get(name);
    stackable = stackable && host.device != backend_.device() && host.rank == 2 &&
                host.dtype == store_.get(names[0]).dtype && host.dim(1) == store_.get(names[0]).dim(1);
    hosts.push_back(&host);
    total += host.bytes();
  }
  std::vector<Weight> out;
  if (!stackable) {
    for (const std::string& name : names) out.push_back(weight(name));
    return out;
  }
  uploads_.push_back(backend_.allocate(total));
  auto* at = static_cast<uint8_t*>(uploads_.back().data());
  for (const Tensor* host : hosts) {
    parameter_count_ += static_cast<size_t>(host->numel());
    bytes_ += host->bytes();
    Tensor dev = *host;
    dev.data = at;
    dev.device = uploads_.back().device();
    backend_.copy(*host, dev);
    out.emplace_back(dev);
    at += host->bytes();
  }
  return out;
}

}  // namespace specdec
