// `specdec info`: what a model folder holds.
#include <cstdio>

#include "cli/commands.h"
#include "core/error.h"
#include "model/family.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"

namespace specdec::cli {

void add_info(CLI::App& app) {
  auto o = std::make_shared<ModelOptions>();
  CLI::App* cmd = app.add_subcommand("info", "describe a model folder");
  o->model_dir = SPECDEC_DEFAULT_MODEL_DIR;
  cmd->add_option("--model", o->model_dir, "model folder")->capture_default_str();
  cmd->callback([o] {
    const ModelConfig c = load_model_config(o->model_dir);
    const WeightStore weights = WeightStore::open(o->model_dir);
    weights.validate(weight_specs(c));
    const Tokenizer tok = Tokenizer::load(o->model_dir);
    std::map<std::string, size_t> dtypes;
    for (const auto& [name, t] : weights.all())
      dtypes[std::string(dtype_name(t.dtype))] += static_cast<size_t>(t.numel());
    std::printf("model          %s\n", o->model_dir.c_str());
    std::printf("architecture   %s (%s)\n", c.architecture.c_str(), c.model_type.c_str());
    std::printf("parameters     %zu (%.1f M), %.1f MB of weights\n", weights.parameter_count(),
                weights.parameter_count() / 1e6, weights.total_bytes() / 1e6);
    std::printf("dtypes        ");
    for (const auto& [d, n] : dtypes) std::printf(" %s: %zu", d.c_str(), n);
    std::printf("\n");
    std::printf("layers         %d, hidden %d, MLP %d, heads %d, KV heads %d, head dim %d\n", c.num_layers,
                c.hidden_size, c.intermediate_size, c.num_heads, c.num_kv_heads, c.head_dim);
    std::printf("context        %d tokens, RoPE %s theta %g\n", c.max_position, c.rope.type.c_str(), c.rope.theta);
    std::printf("tied embedding %s, attention bias %s, q/k norm %s\n", c.tie_word_embeddings ? "yes" : "no",
                c.attention_bias ? "yes" : "no", c.qk_norm ? "yes" : "no");
    std::printf("vocabulary     %d (model), %d (tokenizer)\n", c.vocab_size, tok.vocab_size());
    std::printf("special tokens");
    for (int32_t id : tok.special_ids()) std::printf(" %s=%d", tok.id_to_token(id).c_str(), id);
    std::printf("\n");
    std::printf("eos            ");
    for (int32_t id : c.eos_token_ids) std::printf(" %d", id);
    std::printf("\n");
  });
}

}  // namespace specdec::cli
