// Reading a DFlash drafter checkpoint: config.json (dflash_config, Qwen3 layer sizes, the
// optional dspark object) and its safetensors, validated and bound to a backend.
#include "speculative/methods/dflash_format.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "core/error.h"
#include "model/bound_weights.h"
#include "model/config_json.h"
#include "model/config_rope.h"
#include "model/weights.h"

namespace specdec {

namespace cj = config_json;

namespace {

// A DFlash setting lives in dflash_config or, in the first releases, at the top level.
const cj::Json* setting(const cj::Json& j, const char* key) {
  if (auto d = j.find("dflash_config"); d != j.end() && d->is_object())
    if (auto it = d->find(key); it != d->end() && !it->is_null()) return &*it;
  if (auto it = j.find(key); it != j.end() && !it->is_null()) return &*it;
  return nullptr;
}

int required_int(const cj::Json& j, const char* key, const std::string& src, int min) {
  const auto v = cj::get_int(j, key, src);
  SPECDEC_CHECK(v.has_value(), src, ": required field \"", key, "\" is missing");
  SPECDEC_CHECK(*v >= min && *v <= (1 << 30), src, ": field \"", key, "\" is ", *v, ", expected at least ", min);
  return static_cast<int>(*v);
}

int setting_int(const cj::Json& j, const char* key, const std::string& src, int min) {
  const cj::Json* v = setting(j, key);
  SPECDEC_CHECK(v != nullptr, src, ": the DFlash setting \"", key,
                "\" (in dflash_config or at the top level) is missing");
  SPECDEC_CHECK(v->is_number_integer(), src, ": the DFlash setting \"", key, "\" must be an integer");
  const int64_t x = v->get<int64_t>();
  SPECDEC_CHECK(x >= min && x <= (1 << 30), src, ": the DFlash setting \"", key, "\" is ", x, ", expected at least ",
                min);
  return static_cast<int>(x);
}

// Options of the published format (or its DFlash2 successor) this implementation does not run:
// refused by name rather than ignored, since ignoring them would draft from another model.
void refuse_unsupported(const cj::Json& j, const std::string& src) {
  if (auto a = j.find("architectures"); a != j.end() && a->is_array() && !a->empty() && (*a)[0].is_string()) {
    const std::string arch = (*a)[0].get<std::string>();
    SPECDEC_CHECK(arch == "DFlashDraftModel", src, ": architecture \"", arch,
                  "\" is not supported (DFlashDraftModel is; DFlash2's convolutions and candidate selector are not)");
  }
  for (const char* key : {"conv_kernel_size", "selector_rank", "selector_top_k"})
    SPECDEC_CHECK(setting(j, key) == nullptr, src, ": \"", key, "\" belongs to DFlash2, which is not supported");
  if (const cj::Json* c = setting(j, "is_causal"))
    SPECDEC_CHECK(c->is_boolean() && !c->get<bool>(), src, ": \"is_causal\": true (causal blocks) is not supported");
  if (auto t = j.find("layer_types"); t != j.end() && t->is_array())
    for (const auto& v : *t)
      SPECDEC_CHECK(v.is_string() && v.get<std::string>() == "full_attention", src, ": layer type ", v.dump(),
                    " is not supported (full_attention is)");
  if (auto s = cj::get_bool(j, "use_sliding_window", src)) {
    SPECDEC_CHECK(!*s, src, ": \"use_sliding_window\": true is not supported");
  }
  for (const char* key : {"input_embedding_scale", "output_multiplier"}) {
    if (const cj::Json* v = setting(j, key))
      SPECDEC_CHECK(v->is_number() && v->get<double>() == 1.0, src, ": \"", key, "\" ", v->dump(),
                    " is not supported (1.0 is)");
  }
  if (const cj::Json* v = setting(j, "final_logit_softcapping"))
    SPECDEC_CHECK(v->is_number() && v->get<double>() <= 0, src, ": \"final_logit_softcapping\" is not supported");
  if (auto b = cj::get_bool(j, "attention_bias", src)) {
    SPECDEC_CHECK(!*b, src, ": \"attention_bias\": true is not supported");
  }
  if (auto act = cj::get_string(j, "hidden_act", src)) {
    SPECDEC_CHECK(*act == "silu", src, ": hidden_act \"", *act, "\" is not supported (silu is)");
  }
}

std::optional<DsparkHead> parse_dspark(const cj::Json& j, const std::string& src, int hidden, int block) {
  auto d = j.find("dspark");
  if (d == j.end() || d->is_null()) return std::nullopt;
  const std::string at = src + ": dspark";
  SPECDEC_CHECK(d->is_object(), at, " must be an object");
  const auto version = cj::get_int(*d, "version", at);
  SPECDEC_CHECK(version == 1, at, ": version ", version ? std::to_string(*version) : "(missing)",
                " is not supported (1 is)");
  DsparkHead h;
  auto w = d->find("confidence_weight");
  SPECDEC_CHECK(w != d->end() && w->is_array() && static_cast<int>(w->size()) == hidden, at,
                ": confidence_weight must be a list of hidden_size (", hidden, ") numbers");
  for (const auto& x : *w) {
    SPECDEC_CHECK(x.is_number(), at, ": confidence_weight holds a non-number ", x.dump());
    h.weight.push_back(x.get<float>());
  }
  const auto b = cj::get_number(*d, "confidence_bias", at);
  SPECDEC_CHECK(b.has_value(), at, ": confidence_bias is missing");
  h.bias = static_cast<float>(*b);
  auto c = d->find("calibration");
  SPECDEC_CHECK(c != d->end() && c->is_array() && static_cast<int>(c->size()) == block - 1, at,
                ": calibration must hold one [w_score, w_log_max_q, bias] per mask row (", block - 1, ")");
  for (const auto& row : *c) {
    SPECDEC_CHECK(row.is_array() && row.size() == 3 &&
                      std::all_of(row.begin(), row.end(), [](const cj::Json& x) { return x.is_number(); }),
                  at, ": calibration row ", row.dump(), " is not three numbers");
    h.calibration.push_back({row[0].get<double>(), row[1].get<double>(), row[2].get<double>()});
  }
  return h;
}

}  // namespace

ModelConfig DflashConfig::rope_config() const {
  ModelConfig c;
  c.head_dim = head_dim;
  c.rope = rope;
  c.max_position = max_position;
  c.hidden_size = hidden_size;
  c.num_heads = num_heads;
  return c;
}

bool is_dflash_checkpoint(const std::filesystem::path& dir) {
  const auto path = dir / "config.json";
  if (!std::filesystem::exists(path)) return false;
  try {
    const cj::Json j = cj::read_file(path);
    if (!j.is_object()) return false;
    if (auto a = j.find("architectures"); a != j.end() && a->is_array())
      for (const auto& v : *a)
        if (v.is_string() && v.get<std::string>().rfind("DFlash", 0) == 0) return true;
    return j.contains("dflash_config");
  } catch (const Error&) {
    return false;  // the draft-model loader reports what is wrong with it
  }
}

DflashConfig load_dflash_config(const std::filesystem::path& dir) {
  const auto path = dir / "config.json";
  const std::string src = path.string();
  const cj::Json j = cj::read_file(path);
  SPECDEC_CHECK(j.is_object(), src, ": expected a JSON object");
  refuse_unsupported(j, src);
  DflashConfig c;
  c.hidden_size = required_int(j, "hidden_size", src, 1);
  c.num_layers = required_int(j, "num_hidden_layers", src, 1);
  c.num_heads = required_int(j, "num_attention_heads", src, 1);
  c.num_kv_heads =
      cj::get_int(j, "num_key_value_heads", src) ? required_int(j, "num_key_value_heads", src, 1) : c.num_heads;
  c.head_dim = cj::get_int(j, "head_dim", src) ? required_int(j, "head_dim", src, 2) : c.hidden_size / c.num_heads;
  SPECDEC_CHECK(c.head_dim % 2 == 0, src, ": head_dim ", c.head_dim, " must be even (RoPE)");
  SPECDEC_CHECK(c.num_heads % c.num_kv_heads == 0, src, ": num_attention_heads ", c.num_heads,
                " is not a multiple of num_key_value_heads ", c.num_kv_heads);
  c.intermediate_size = required_int(j, "intermediate_size", src, 1);
  c.vocab_size = required_int(j, "vocab_size", src, 1);
  c.max_position =
      cj::get_int(j, "max_position_embeddings", src) ? required_int(j, "max_position_embeddings", src, 1) : 1 << 20;
  c.rms_norm_eps = static_cast<float>(cj::get_number(j, "rms_norm_eps", src).value_or(1e-6));
  c.rope = parse_rope_config(j, src);
  c.block_size = setting_int(j, "block_size", src, 2);
  c.mask_token_id = setting_int(j, "mask_token_id", src, 0);
  c.num_target_layers = cj::get_int(j, "num_target_layers", src) ? required_int(j, "num_target_layers", src, 1) : 0;
  const cj::Json* ids = setting(j, "target_layer_ids");
  SPECDEC_CHECK(
      ids != nullptr && ids->is_array() && !ids->empty(), src,
      ": dflash_config.target_layer_ids (the target layers whose hidden states the drafter reads) is missing");
  std::set<int> seen;
  for (const auto& v : *ids) {
    SPECDEC_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < (1 << 20), src,
                  ": target_layer_ids holds ", v.dump(), ", not a layer index");
    const int id = v.get<int>();
    SPECDEC_CHECK(seen.insert(id).second, src, ": target_layer_ids names layer ", id, " twice");
    SPECDEC_CHECK(c.num_target_layers == 0 || id < c.num_target_layers, src, ": target layer ", id,
                  " is past num_target_layers ", c.num_target_layers);
    c.target_layer_ids.push_back(id);
    // Hugging Face's hidden_states[id + 1]: the output of decoder layer id, except that the last
    // entry is the final normed hidden (specdec's tap L).
    c.tap_layers.push_back(c.num_target_layers > 0 && id == c.num_target_layers - 1 ? c.num_target_layers : id);
  }
  c.dspark = parse_dspark(j, src, c.hidden_size, c.block_size);
  return c;
}

DflashWeights load_dflash_weights(const std::filesystem::path& dir, const DflashConfig& c, Backend& backend) {
  WeightStore store = WeightStore::open(dir);
  const int64_t H = c.hidden_size, n = static_cast<int64_t>(c.target_layer_ids.size());
  const Tensor fc_host = store.get("fc.weight");
  SPECDEC_CHECK(fc_host.rank == 2 && fc_host.dim(0) == H && fc_host.dim(1) % n == 0,
                store.file_of("fc.weight").string(), ": fc.weight is ", fc_host.shape_string(), ", expected [", H, ", ",
                n, " x the target's hidden size] for ", n, " target layers");
  const int64_t Ht = fc_host.dim(1) / n;
  const int64_t nh = c.num_heads, nkv = c.num_kv_heads, hd = c.head_dim, I = c.intermediate_size;
  std::vector<WeightSpec> specs = {{"fc.weight", {H, n * Ht}}, {"hidden_norm.weight", {H}}, {"norm.weight", {H}}};
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = str_cat("layers.", i, ".");
    for (auto& s : std::vector<WeightSpec>{{p + "input_layernorm.weight", {H}},
                                           {p + "post_attention_layernorm.weight", {H}},
                                           {p + "self_attn.q_proj.weight", {nh * hd, H}},
                                           {p + "self_attn.k_proj.weight", {nkv * hd, H}},
                                           {p + "self_attn.v_proj.weight", {nkv * hd, H}},
                                           {p + "self_attn.o_proj.weight", {H, nh * hd}},
                                           {p + "self_attn.q_norm.weight", {hd}},
                                           {p + "self_attn.k_norm.weight", {hd}},
                                           {p + "mlp.gate_proj.weight", {I, H}},
                                           {p + "mlp.up_proj.weight", {I, H}},
                                           {p + "mlp.down_proj.weight", {H, I}}})
      specs.push_back(std::move(s));
  }
  store.validate(specs);

  DflashWeights w;
  // fc split by target layer: rows of fc_j are fc's columns [j*Ht, (j+1)*Ht), copied once.
  const size_t elt = dtype_size(fc_host.dtype), row_bytes = static_cast<size_t>(Ht) * elt;
  for (int64_t j = 0; j < n; ++j) {
    Buffer staging = Buffer::host(static_cast<size_t>(H) * row_bytes);
    for (int64_t h = 0; h < H; ++h)
      std::memcpy(static_cast<char*>(staging.data()) + static_cast<size_t>(h) * row_bytes,
                  static_cast<const char*>(fc_host.data) + (static_cast<size_t>(h * n + j)) * row_bytes, row_bytes);
    Buffer dst = backend.allocate(static_cast<size_t>(H) * row_bytes);
    const Tensor t = dst.view(fc_host.dtype, {H, Ht});
    backend.copy(staging.view(fc_host.dtype, {H, Ht}), t);
    backend.synchronize();  // the staging buffer dies at the end of this iteration
    w.owned.push_back(std::move(dst));
    w.fc.push_back(with_packed(backend, Weight(t), w.owned));
  }
  auto bound = std::make_shared<BoundWeights>(std::move(store), backend);
  w.hidden_norm = bound->tensor("hidden_norm.weight");
  w.norm = bound->tensor("norm.weight");
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = str_cat("layers.", i, ".");
    DflashWeights::Layer l;
    l.input_norm = bound->tensor(p + "input_layernorm.weight");
    l.post_norm = bound->tensor(p + "post_attention_layernorm.weight");
    l.q_norm = bound->tensor(p + "self_attn.q_norm.weight");
    l.k_norm = bound->tensor(p + "self_attn.k_norm.weight");
    l.q_proj = bound->weight(p + "self_attn.q_proj.weight");
    l.k_proj = bound->weight(p + "self_attn.k_proj.weight");
    l.v_proj = bound->weight(p + "self_attn.v_proj.weight");
    l.o_proj = bound->weight(p + "self_attn.o_proj.weight");
    l.gate_proj = bound->weight(p + "mlp.gate_proj.weight");
    l.up_proj = bound->weight(p + "mlp.up_proj.weight");
    l.down_proj = bound->weight(p + "mlp.down_proj.weight");
    w.layers.push_back(std::move(l));
  }
  w.parameters = bound->parameter_count() + static_cast<size_t>(H * n * Ht);
  w.keep_alive = bound;
  return w;
}

}  // namespace specdec
