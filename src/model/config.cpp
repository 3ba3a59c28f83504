// config.json → ModelConfig (the fields every family shares; the family reads its own, family.h)
// and generation_config.json → GenerationDefaults. Every option we do not implement is refused by
// name: a silently ignored option gives wrong text.
#include "model/config.h"

#include "core/error.h"
#include "model/config_json.h"
#include "model/config_rope.h"
#include "model/family.h"

namespace specdec {

namespace {

using config_json::Json;

int require_positive(const Json& j, const std::string& key, const std::string& src) {
  const auto v = config_json::get_int(j, key, src);
  SPECDEC_CHECK(v.has_value(), src, ": required field \"", key, "\" is missing");
  SPECDEC_CHECK(*v > 0 && *v <= (int64_t{1} << 30), src, ": field \"", key, "\" = ", *v,
                " must be positive (and below 2^30)");
  return static_cast<int>(*v);
}

// Reads "architectures" and "model_type" and checks they name one registered family.
const ModelFamily& parse_family(const Json& j, const std::string& src, ModelConfig& c) {
  std::string arch;
  if (auto it = j.find("architectures"); it != j.end() && !it->is_null()) {
    SPECDEC_CHECK(it->is_array() && !it->empty() && (*it)[0].is_string(), src,
                  ": field \"architectures\" must be a non-empty list of strings");
    SPECDEC_CHECK(it->size() == 1, src, ": field \"architectures\" lists ", it->size(),
                  " architectures; expected exactly one");
    arch = (*it)[0].get<std::string>();
    SPECDEC_CHECK(find_family_by_architecture(arch), src, ": unsupported architecture \"", arch,
                  "\" (supported: ", supported_families(), ")");
  }
  const auto type = config_json::get_string(j, "model_type", src);
  SPECDEC_CHECK(type.has_value(), src, ": required field \"model_type\" is missing");
  const ModelFamily* fam = find_family_by_type(*type);
  SPECDEC_CHECK(fam, src, ": unsupported model_type \"", *type, "\" (supported: ", supported_families(), ")");
  if (arch.empty()) arch = std::string(fam->architecture);
  SPECDEC_CHECK(fam->architecture == arch, src, ": architecture \"", arch,
                "\" does not match model_type \"", *type, "\" (expected \"", fam->architecture,
                "\")");
  c.architecture = arch;
  c.model_type = *type;
  return *fam;
}

void parse_sizes(const Json& j, const std::string& src, ModelConfig& c) {
  c.vocab_size = require_positive(j, "vocab_size", src);
  c.hidden_size = require_positive(j, "hidden_size", src);
  c.intermediate_size = require_positive(j, "intermediate_size", src);
  c.num_layers = require_positive(j, "num_hidden_layers", src);
  c.num_heads = require_positive(j, "num_attention_heads", src);
  c.max_position = require_positive(j, "max_position_embeddings", src);
  // The engine's warm-up forward before the first request holds 8 positions; a context smaller
  // than that holds no useful prompt either.
  constexpr int kMinContext = 8;
  SPECDEC_CHECK(c.max_position >= kMinContext, src, ": max_position_embeddings = ", c.max_position,
                " is below the ", kMinContext, " positions specdec needs as a context");
  // Hugging Face: num_key_value_heads absent means plain multi-head attention.
  c.num_kv_heads = config_json::get_int(j, "num_key_value_heads", src).has_value()
                       ? require_positive(j, "num_key_value_heads", src)
                       : c.num_heads;
  SPECDEC_CHECK(c.num_heads % c.num_kv_heads == 0, src, ": num_attention_heads = ", c.num_heads,
                " is not a multiple of num_key_value_heads = ", c.num_kv_heads);
  if (config_json::get_int(j, "head_dim", src).has_value()) {
    c.head_dim = require_positive(j, "head_dim", src);
  } else {
    SPECDEC_CHECK(c.hidden_size % c.num_heads == 0, src, ": hidden_size = ", c.hidden_size,
                  " is not a multiple of num_attention_heads = ", c.num_heads,
                  " and no head_dim is given");
    c.head_dim = c.hidden_size / c.num_heads;
  }
  SPECDEC_CHECK(c.head_dim % 2 == 0, src, ": head_dim = ", c.head_dim,
                " must be even (rotary embedding rotates pairs)");
  const double eps = config_json::get_number(j, "rms_norm_eps", src).value_or(1e-6);
  // An epsilon as large as the activations' mean square drowns them (1e300 becomes inf as a
  // float, and every hidden state 0): checkpoints use 1e-5 or 1e-6.
  SPECDEC_CHECK(eps > 0.0 && eps <= 1.0, src, ": field \"rms_norm_eps\" = ", eps, " must be in (0, 1]");
  c.rms_norm_eps = static_cast<float>(eps);
}

// Options of every family that change the computation and that we do not implement.
void refuse_unsupported(const Json& j, const std::string& src) {
  SPECDEC_CHECK(j.find("quantization_config") == j.end() || j["quantization_config"].is_null(), src,
                ": quantized checkpoints (quantization_config) are not supported");
  const double partial = config_json::get_number(j, "partial_rotary_factor", src).value_or(1.0);
  SPECDEC_CHECK(partial == 1.0, src, ": partial_rotary_factor = ", partial,
                " is not supported (rotary embedding over the whole head only)");
  if (auto it = j.find("layer_types"); it != j.end() && it->is_array()) {
    for (const Json& t : *it)
      SPECDEC_CHECK(t.is_string() && t.get<std::string>() == "full_attention", src,
                    ": layer_types entry ", t.dump(),
                    " is not supported (only full_attention layers)");
  }
}

DType parse_dtype(const Json& j, const std::string& src) {
  std::optional<std::string> name = config_json::get_string(j, "dtype", src);
  if (!name) name = config_json::get_string(j, "torch_dtype", src);
  if (!name) return DType::bf16;
  if (*name == "float32") return DType::f32;
  if (*name == "float16") return DType::f16;
  // bfloat16 and anything else (e.g. "auto"): informational only, the weights carry their dtype.
  return DType::bf16;
}

}  // namespace

ModelConfig parse_model_config(const std::string& json_text, const std::string& source_name) {
  const Json j = config_json::parse(json_text, source_name);
  SPECDEC_CHECK(j.is_object(), source_name, ": expected a JSON object at the top level");
  ModelConfig c;
  const ModelFamily& family = parse_family(j, source_name, c);
  parse_sizes(j, source_name, c);
  family.read_config(j, source_name, c);
  refuse_unsupported(j, source_name);
  c.rope = parse_rope_config(j, source_name);
  c.tie_word_embeddings = config_json::get_bool(j, "tie_word_embeddings", source_name).value_or(false);
  c.dtype = parse_dtype(j, source_name);
  if (auto bos = config_json::get_int_list(j, "bos_token_id", source_name); bos && !bos->empty())
    c.bos_token_id = bos->front();
  c.eos_token_ids = config_json::get_int_list(j, "eos_token_id", source_name).value_or(std::vector<int32_t>{});
  return c;
}

ModelConfig load_model_config(const std::filesystem::path& dir) {
  const std::filesystem::path path = dir / "config.json";
  SPECDEC_CHECK(std::filesystem::is_regular_file(path), path.string(),
                ": not found (a model folder needs config.json)");
  return parse_model_config(config_json::read_text(path), path.string());
}

GenerationDefaults load_generation_config(const std::filesystem::path& dir) {
  GenerationDefaults g;
  const std::filesystem::path path = dir / "generation_config.json";
  if (!std::filesystem::exists(path)) return g;
  const Json j = config_json::read_file(path);
  const std::string src = path.string();
  SPECDEC_CHECK(j.is_object(), src, ": expected a JSON object at the top level");
  g.do_sample = config_json::get_bool(j, "do_sample", src).value_or(g.do_sample);
  g.temperature = static_cast<float>(config_json::get_number(j, "temperature", src).value_or(g.temperature));
  g.top_p = static_cast<float>(config_json::get_number(j, "top_p", src).value_or(g.top_p));
  // Stored as written; absent stays 0 (off) rather than transformers' implicit 50.
  const int64_t top_k = config_json::get_int(j, "top_k", src).value_or(0);
  SPECDEC_CHECK(top_k >= 0 && top_k <= (int64_t{1} << 30), src, ": top_k = ", top_k, " is out of range");
  g.top_k = static_cast<int>(top_k);
  g.min_p = static_cast<float>(config_json::get_number(j, "min_p", src).value_or(g.min_p));
  g.repetition_penalty =
      static_cast<float>(config_json::get_number(j, "repetition_penalty", src).value_or(g.repetition_penalty));
  SPECDEC_CHECK(g.temperature >= 0.0f, src, ": temperature = ", g.temperature, " must not be negative");
  // As for --temperature: logits divided by a smaller one overflow; 0 is greedy decoding.
  SPECDEC_CHECK(g.temperature == 0.0f || g.temperature >= 1e-6f, src, ": temperature = ", g.temperature,
                " is too small to sample at (the logits divided by it overflow): use 0 for greedy decoding or at "
                "least 1e-06");
  SPECDEC_CHECK(g.top_p > 0.0f && g.top_p <= 1.0f, src, ": top_p = ", g.top_p, " must lie in (0, 1]");
  SPECDEC_CHECK(g.min_p >= 0.0f && g.min_p <= 1.0f, src, ": min_p = ", g.min_p, " must lie in [0, 1]");
  SPECDEC_CHECK(g.repetition_penalty > 0.0f, src, ": repetition_penalty = ", g.repetition_penalty,
                " must be positive");
  g.eos_token_ids = config_json::get_int_list(j, "eos_token_id", src).value_or(std::vector<int32_t>{});
  return g;
}

}  // namespace specdec
