// Capture of a fixed sequence of CUDA backend calls (e.g. one decode step of a fixed batch shape)
// as a CUDA graph, replayed with one launch instead of hundreds.
// Contract of the captured function: it only enqueues kernels on the backend (no copies from or
// to host memory, no synchronize(), no allocation); every tensor it touches stays allocated while
// the graph lives, and new inputs are written into those same buffers before replay(). Run it
// once eagerly before capture so lazily created state (cuBLASLt plans, scratch) already exists.
#pragma once

#include <functional>
#include <memory>

#include "backend/backend.h"

namespace specdec {

class CudaGraphRunner {
 public:
  // Throws specdec::Error when `backend` is not a CUDA backend.
  explicit CudaGraphRunner(Backend& backend);
  ~CudaGraphRunner();
  CudaGraphRunner(const CudaGraphRunner&) = delete;
  CudaGraphRunner& operator=(const CudaGraphRunner&) = delete;

  // Records what `enqueue` launches on the backend's stream (replacing an earlier capture).
  // If `enqueue` throws, the capture is abandoned and the error propagates.
  void capture(const std::function<void()>& enqueue);
  // Launches the captured graph on the backend's stream (ordered with its other work).
  void replay();
  bool captured() const;

 private:
  struct Graph;
  Backend& backend_;
  std::unique_ptr<Graph> graph_;
};

}  // namespace specdec
