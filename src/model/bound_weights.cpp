// BoundWeights: binding a checkpoint tensor to the backend, by view or by upload.
#include "model/bound_weights.h"

#include <algorithm>

namespace specdec {

Tensor BoundWeights::tensor(const std::string& name) {
  const Tensor& host = store_.get(name);
  count(host);
  if (host.device == backend_.device()) {
    // Zero copy (the backend reads host memory), unless the tensor starts where the backend's
    // kernels read it slower than memory of its own.
    const size_t align = backend_.weight_alignment();
    if (align == 0 || reinterpret_cast<uintptr_t>(host.data) % align == 0) return host;
  }
  uploads_.push_back(backend_.allocate(host.bytes()));
  return place(host, uploads_.back().data());
}

Weight BoundWeights::weight(const std::string& name) {
  const Tensor& host = store_.get(name);
  if (host.device == backend_.device()) {
    // A packed weight is read from its own copy, so the checkpoint's view serves the rest (row
    // gathers) unaligned as it is, without the aligned copy tensor() would make.
    if (Weight w = with_packed(backend_, Weight(host), uploads_); !w.packed.empty()) {
      count(host);
      // The linear reads the copy: the checkpoint's pages are read again only by a row gather,
      // which maps them back from the file, so the weights do not sit in memory twice.
      store_.evict(name);
      return w;
    }
  }
  return with_packed(backend_, Weight(tensor(name)), uploads_);
}

Weight BoundWeights::weight_of(const Tensor& bound) { return with_packed(backend_, Weight(bound), uploads_); }

std::vector<Weight> BoundWeights::adjacent(const std::vector<std::string>& names) {
  std::vector<const Tensor*> hosts;
  size_t total = 0;
  for (const std::string& name : names) {
    hosts.push_back(&store_.get(name));
    total += hosts.back()->bytes();
  }
  const auto stacks = [&](const Tensor* t) {
    return t->device != backend_.device() && t->rank == 2 && t->dtype == hosts[0]->dtype &&
           t->dim(1) == hosts[0]->dim(1);
  };
  std::vector<Weight> out;
  if (hosts.empty() || !std::all_of(hosts.begin(), hosts.end(), stacks)) {
    for (const std::string& name : names) out.push_back(weight(name));
    return out;
  }
  uploads_.push_back(backend_.allocate(total));
  auto* at = static_cast<uint8_t*>(uploads_.back().data());
  for (const Tensor* host : hosts) {
    count(*host);
    out.emplace_back(place(*host, at));
    at += host->bytes();
  }
  return out;
}

void BoundWeights::count(const Tensor& host) {
  parameter_count_ += static_cast<size_t>(host.numel());
  bytes_ += host.bytes();
}

Tensor BoundWeights::place(const Tensor& host, void* at) {
  Tensor dev = host;
  dev.data = at;
  dev.device = backend_.device();
  backend_.copy(host, dev);
  return dev;
}

}  // namespace specdec
