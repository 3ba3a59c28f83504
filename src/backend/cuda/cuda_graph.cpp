// CUDA graph capture and replay of backend calls (see cuda_graph.h).
#include "backend/cuda/cuda_graph.h"

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"

namespace specdec {

struct CudaGraphRunner::Graph {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ~Graph() {
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
  }
};

CudaGraphRunner::CudaGraphRunner(Backend& backend) : backend_(backend) {
  (void)cuda_stream_of(backend);  // throws for a non-CUDA backend
}

CudaGraphRunner::~CudaGraphRunner() = default;

bool CudaGraphRunner::captured() const { return graph_ && graph_->exec; }

void CudaGraphRunner::capture(const std::function<void()>& enqueue) {
  auto stream = static_cast<cudaStream_t>(cuda_stream_of(backend_));
  graph_.reset();
  auto g = std::make_unique<Graph>();
  // Thread-local mode: other threads' CUDA calls are not disturbed by this capture.
  SPECDEC_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "graph capture");
  try {
    enqueue();
  } catch (...) {
    cudaGraph_t abandoned = nullptr;
    cudaStreamEndCapture(stream, &abandoned);
    if (abandoned) cudaGraphDestroy(abandoned);
    cudaGetLastError();
    throw;
  }
  SPECDEC_CUDA_CHECK(cudaStreamEndCapture(stream, &g->graph),
                     "graph capture (a call inside synchronized, copied to the host or allocated?)");
  SPECDEC_CUDA_CHECK(cudaGraphInstantiate(&g->exec, g->graph, 0), "graph instantiation");
  graph_ = std::move(g);
}

void CudaGraphRunner::replay() {
  SPECDEC_CHECK(captured(), "CudaGraphRunner::replay: nothing captured");
  SPECDEC_CUDA_CHECK(cudaGraphLaunch(graph_->exec, static_cast<cudaStream_t>(cuda_stream_of(backend_))),
                     "graph replay");
}

}  // namespace specdec
