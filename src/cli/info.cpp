// `specdec info`: what a model folder holds, from the public inspect_model.
#include <cstdio>

#include "cli/commands.h"

namespace specdec::cli {

void run_info(const InfoCommand& command) {
  const ModelInfo m = inspect_model(command.model_dir);
  std::printf("model          %s\n", m.model_dir.c_str());
  std::printf("architecture   %s (%s)\n", m.architecture.c_str(), m.model_type.c_str());
  std::printf("parameters     %zu (%.1f M), %.1f MB of weights\n", m.parameter_count, m.parameter_count / 1e6,
              m.weight_bytes / 1e6);
  std::printf("dtypes        ");
  for (const auto& [d, n] : m.parameters_by_dtype) std::printf(" %s: %zu", d.c_str(), n);
  std::printf("\n");
  std::printf("layers         %d, hidden %d, MLP %d, heads %d, KV heads %d, head dim %d\n", m.num_layers, m.hidden_size,
              m.intermediate_size, m.num_heads, m.num_kv_heads, m.head_dim);
  std::printf("context        %d tokens, RoPE %s theta %g\n", m.context_length, m.rope_type.c_str(), m.rope_theta);
  std::printf("tied embedding %s, attention bias %s, q/k norm %s\n", m.tied_embedding ? "yes" : "no",
              m.attention_bias ? "yes" : "no", m.qk_norm ? "yes" : "no");
  std::printf("vocabulary     %d (model), %d (tokenizer)\n", m.vocab_size, m.tokenizer_vocab_size);
  std::printf("special tokens");
  for (const SpecialToken& t : m.special_tokens) std::printf(" %s=%d", t.text.c_str(), t.id);
  std::printf("\n");
  std::printf("eos            ");
  for (int32_t id : m.eos_token_ids) std::printf(" %d", id);
  std::printf("\n");
}

}  // namespace specdec::cli
