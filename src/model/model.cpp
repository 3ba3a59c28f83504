// Model: loading (config + weights validated against the family's list) and the public forward,
// which checks the request into a ForwardPlan, runs it, then advances the sequences' KV lengths.
#include "model/model.h"

#include "model/family.h"
#include "model/model_batch.h"
#include "model/runner.h"
#include "model/weights.h"

namespace specdec {

Model::Model(std::unique_ptr<ModelRunner> impl) : impl_(std::move(impl)) {}
Model::~Model() = default;

std::unique_ptr<Model> Model::load(const std::filesystem::path& dir, Backend& backend) {
  ModelConfig config = load_model_config(dir);
  WeightStore store = WeightStore::open(dir);
  store.validate(weight_specs(config));
  auto impl = std::make_unique<ModelRunner>(std::move(config), std::move(store), backend);
  return std::unique_ptr<Model>(new Model(std::move(impl)));
}

const ModelConfig& Model::config() const { return impl_->config(); }
Backend& Model::backend() const { return impl_->backend(); }
size_t Model::parameter_count() const { return impl_->parameter_count(); }
size_t Model::weight_bytes() const { return impl_->weight_bytes(); }
size_t Model::step_weight_bytes(int tokens) const { return impl_->step_weight_bytes(tokens); }
size_t Model::matmul_parameters() const { return impl_->matmul_parameters(); }
const Tensor& Model::embedding() const { return impl_->embedding(); }
const Weight& Model::lm_head() const { return impl_->lm_head(); }
bool Model::replays_windows() const { return impl_->replays_windows(); }

std::unique_ptr<KvCache> Model::make_cache(int num_blocks) const {
  const ModelConfig& c = config();
  return std::make_unique<KvCache>(backend(), c.num_layers, c.num_kv_heads, c.head_dim, num_blocks);
}

ForwardResult Model::forward(const ForwardRequest& request, KvCache& cache) { return wait(launch(request, cache)); }

Model::Ticket Model::launch(const ForwardRequest& request, KvCache& cache) {
  const ForwardPlan plan = plan_forward(request, cache, config());
  const Ticket ticket = impl_->launch(plan, request.tap_layers, request.sampling, cache);
  for (size_t r = 0; r < request.rows.size(); ++r)
    cache.set_length(request.rows[r].seq, plan.row_lens[r]);
  return ticket;
}

ForwardResult Model::wait(Ticket ticket) { return impl_->wait(ticket); }

}  // namespace specdec
