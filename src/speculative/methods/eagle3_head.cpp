// The EAGLE-3 head: its config and checkpoint read and checked (the checkpoint holds int64 and
// bool tensors, d2t and t2d, that model checkpoints never do, so it has its own small reader),
// and its forward as a composition of Backend kernels, the same ones the target's layers use.
#include "speculative/methods/eagle3_head.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <set>

#include "core/error.h"
#include "model/config_json.h"
#include "model/model_batch.h"
#include "model/scratch.h"

namespace specdec {

namespace {

using config_json::Json;

constexpr const char* kArchitecture = "LlamaForCausalLMEagle3";

// One tensor of the head's safetensors file, as stored.
struct RawTensor {
  std::string dtype;  // safetensors' name: F32, BF16, F16, I64, BOOL, ...
  std::vector<int64_t> shape;
  const char* bytes = nullptr;
  size_t size = 0;
};

size_t raw_dtype_size(const std::string& dtype) {
  if (dtype == "F32" || dtype == "I32") return 4;
  if (dtype == "BF16" || dtype == "F16") return 2;
  if (dtype == "I64") return 8;
  if (dtype == "BOOL" || dtype == "U8") return 1;
  return 0;
}

// The whole file read into `storage`; every entry's span and shape checked against its dtype.
std::map<std::string, RawTensor> read_safetensors(const std::filesystem::path& path, std::vector<char>& storage) {
  const std::string file = path.string();
  std::ifstream in(path, std::ios::binary);
  SPECDEC_CHECK(in.good(), file, ": cannot open (an EAGLE-3 head is one model.safetensors)");
  storage.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  SPECDEC_CHECK(storage.size() >= 8, file, ": too short for a safetensors header");
  uint64_t header_len = 0;
  std::memcpy(&header_len, storage.data(), 8);
  SPECDEC_CHECK(header_len <= storage.size() - 8, file, ": header length ", header_len, " exceeds the file");
  const Json header = config_json::parse(std::string(storage.data() + 8, header_len), file);
  SPECDEC_CHECK(header.is_object(), file, ": header is not a JSON object");
  const char* data = storage.data() + 8 + header_len;
  const uint64_t data_bytes = storage.size() - 8 - header_len;
  std::map<std::string, RawTensor> out;
  for (const auto& [name, e] : header.items()) {
    if (name == "__metadata__") continue;
    const std::string where = str_cat(file, ": tensor \"", name, "\"");
    SPECDEC_CHECK(e.is_object() && e.contains("dtype") && e.contains("shape") && e.contains("data_offsets"), where,
                  ": header entry needs dtype, shape and data_offsets");
    RawTensor t;
    t.dtype = e["dtype"].get<std::string>();
    const size_t elem = raw_dtype_size(t.dtype);
    SPECDEC_CHECK(elem > 0, where, ": dtype \"", t.dtype, "\" is not supported (F32, BF16, F16, I32, I64, BOOL)");
    uint64_t numel = 1;
    for (const auto& d : e["shape"]) {
      SPECDEC_CHECK(d.is_number_integer() && d.get<int64_t>() >= 0 && d.get<int64_t>() < (int64_t{1} << 40), where,
                    ": bad shape ", e["shape"].dump());
      t.shape.push_back(d.get<int64_t>());
      numel *= static_cast<uint64_t>(d.get<int64_t>());
    }
    const auto& off = e["data_offsets"];
    SPECDEC_CHECK(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() && off[1].is_number_unsigned(),
                  where, ": data_offsets must be two non-negative integers");
    const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    SPECDEC_CHECK(begin <= end && end <= data_bytes, where, ": data_offsets [", begin, ", ", end,
                  ") outside the data section of ", data_bytes, " bytes");
    SPECDEC_CHECK(end - begin == numel * elem, where, ": ", end - begin, " bytes do not hold shape ", e["shape"].dump(),
                  " of ", t.dtype);
    t.bytes = data + begin;
    t.size = end - begin;
    out.emplace(name, std::move(t));
  }
  return out;
}

// The tensor `name`, checked against `shape`; a float dtype the backend reads.
const RawTensor& float_tensor(const std::map<std::string, RawTensor>& all, const std::string& name,
                              const std::vector<int64_t>& shape, const std::string& dir) {
  auto it = all.find(name);
  SPECDEC_CHECK(it != all.end(), dir, ": the EAGLE-3 head has no tensor \"", name, "\"");
  const RawTensor& t = it->second;
  const auto show = [](const std::vector<int64_t>& s) {
    std::string o = "[";
    for (size_t i = 0; i < s.size(); ++i) o += (i ? ", " : "") + std::to_string(s[i]);
    return o + "]";
  };
  SPECDEC_CHECK(t.shape == shape, dir, ": tensor \"", name, "\" has shape ", show(t.shape), ", expected ", show(shape));
  SPECDEC_CHECK(t.dtype == "F32" || t.dtype == "BF16" || t.dtype == "F16", dir, ": tensor \"", name, "\" is ", t.dtype,
                ", expected F32, BF16 or F16");
  return t;
}

DType float_dtype(const std::string& name) {
  return name == "F32" ? DType::f32 : name == "BF16" ? DType::bf16 : DType::f16;
}

// Some heads store the layer under midlayer., others under the Llama names of layer 0.
std::string layer_tensor(const std::map<std::string, RawTensor>& all, const std::string& suffix) {
  for (const char* prefix : {"midlayer.", "model.layers.0.", "layers.0.", "model.midlayer."})
    if (all.count(prefix + suffix)) return prefix + suffix;
  return "midlayer." + suffix;
}

std::string top_tensor(const std::map<std::string, RawTensor>& all, const std::string& name) {
  if (!all.count(name) && all.count("model." + name)) return "model." + name;
  return name;
}

}  // namespace

std::vector<int> Eagle3Config::tap_layers(int target_layers) const {
  if (!aux_layer_ids.empty()) return aux_layer_ids;
  // The loaders' default captures the inputs of layers 2, L/2 and L-3: the outputs of the
  // layers before them.
  return {1, target_layers / 2 - 1, target_layers - 4};
}

bool is_eagle3_dir(const std::filesystem::path& dir) {
  const auto path = dir / "config.json";
  if (!std::filesystem::is_regular_file(path)) return false;
  const Json j = config_json::read_file(path);
  auto it = j.find("architectures");
  if (it == j.end() || !it->is_array()) return false;
  return std::any_of(it->begin(), it->end(), [](const Json& a) { return a.is_string() && a == kArchitecture; });
}

Eagle3Config load_eagle3_config(const std::filesystem::path& dir) {
  const std::string src = (dir / "config.json").string();
  Json j = config_json::read_file(dir / "config.json");
  SPECDEC_CHECK(j.is_object(), src, ": expected a JSON object at the top level");
  SPECDEC_CHECK(is_eagle3_dir(dir), src, ": architectures does not name ", kArchitecture);
  Eagle3Config c;
  c.draft_vocab = static_cast<int>(config_json::get_int(j, "draft_vocab_size", src).value_or(0));
  c.target_hidden = static_cast<int>(config_json::get_int(j, "target_hidden_size", src).value_or(0));
  c.norm_before_residual = config_json::get_bool(j, "norm_before_residual", src).value_or(false);
  // The layer ids live in eagle_config (the EAGLE trainers) or at the top level (converted heads).
  const Json* ids = nullptr;
  if (auto e = j.find("eagle_config"); e != j.end() && e->is_object()) {
    SPECDEC_CHECK(config_json::get_bool(*e, "use_aux_hidden_state", src).value_or(true), src,
                  ": eagle_config.use_aux_hidden_state = false is not supported (a head fed the last hidden only)");
    if (auto i = e->find("eagle_aux_hidden_state_layer_ids"); i != e->end() && !i->is_null()) ids = &*i;
  }
  if (auto i = j.find("eagle_aux_hidden_state_layer_ids"); !ids && i != j.end() && !i->is_null()) ids = &*i;
  if (ids) {
    SPECDEC_CHECK(ids->is_array() && ids->size() == 3, src,
                  ": eagle_aux_hidden_state_layer_ids must list three target ", "layers, got ", ids->dump());
    for (const auto& v : *ids) {
      SPECDEC_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0, src,
                    ": eagle_aux_hidden_state_layer_ids must be non-negative integers, got ", ids->dump());
      c.aux_layer_ids.push_back(v.get<int>());
    }
  }
  // The layer itself is a Llama layer: read its shape with the shared Llama config reader.
  j["architectures"] = Json::array({"LlamaForCausalLM"});
  if (!j.contains("model_type")) j["model_type"] = "llama";
  SPECDEC_CHECK(j["model_type"] == "llama", src, ": model_type ", j["model_type"].dump(),
                " is not supported for an EAGLE-3 head (llama)");
  c.layer = parse_model_config(j.dump(), src);
  SPECDEC_CHECK(c.layer.num_layers == 1, src, ": num_hidden_layers = ", c.layer.num_layers,
                " is not supported (an EAGLE-3 head has one decoder layer)");
  SPECDEC_CHECK(!c.layer.attention_bias && !c.layer.o_proj_bias, src,
                ": attention_bias = true is not supported for an EAGLE-3 head");
  if (c.draft_vocab == 0) c.draft_vocab = c.layer.vocab_size;
  if (c.target_hidden == 0) c.target_hidden = c.layer.hidden_size;
  SPECDEC_CHECK(c.draft_vocab > 0 && c.draft_vocab <= c.layer.vocab_size, src, ": draft_vocab_size = ", c.draft_vocab,
                " must lie in [1, vocab_size = ", c.layer.vocab_size, "]");
  SPECDEC_CHECK(c.target_hidden > 0, src, ": target_hidden_size must be positive");
  return c;
}

Eagle3Head::Eagle3Head(Eagle3Config config, Backend& backend) : config_(std::move(config)), backend_(backend) {}
Eagle3Head::~Eagle3Head() = default;

Tensor Eagle3Head::upload(DType dtype, std::initializer_list<int64_t> shape, const void* bytes) {
  Tensor host(const_cast<void*>(bytes), dtype, shape);
  Buffer b = backend_.allocate(host.bytes());
  Tensor dev = b.view(dtype, shape);
  backend_.copy(host, dev);
  weights_.push_back(std::move(b));
  return dev;
}

Weight Eagle3Head::linear_weight(const Tensor& uploaded) { return with_packed(backend_, Weight(uploaded), weights_); }

std::unique_ptr<Eagle3Head> Eagle3Head::load(const std::filesystem::path& dir, Backend& backend) {
  const std::string where = dir.string();
  std::unique_ptr<Eagle3Head> head(new Eagle3Head(load_eagle3_config(dir), backend));
  const Eagle3Config& c = head->config_;
  const ModelConfig& l = c.layer;
  std::vector<char> storage;
  const auto all = read_safetensors(dir / "model.safetensors", storage);
  const int64_t H = l.hidden_size, I = l.intermediate_size, hd = l.head_dim, Vd = c.draft_vocab, V = l.vocab_size;
  const int64_t q_out = int64_t{l.num_heads} * hd, kv_out = int64_t{l.num_kv_heads} * hd;
  const auto weight = [&](const std::string& name, std::initializer_list<int64_t> shape) {
    const std::vector<int64_t> want(shape);
    const RawTensor& t = float_tensor(all, name, want, where);
    return head->upload(float_dtype(t.dtype), shape, t.bytes);
  };
  const auto layer = [&](const std::string& suffix, std::initializer_list<int64_t> shape) {
    return weight(layer_tensor(all, suffix), shape);
  };
  head->fc_ = head->linear_weight(weight(top_tensor(all, "fc.weight"), {H, 3 * int64_t{c.target_hidden}}));
  head->hidden_norm_ = layer("hidden_norm.weight", {H});
  head->input_norm_ = layer("input_layernorm.weight", {H});
  head->q_proj_ = head->linear_weight(layer("self_attn.q_proj.weight", {q_out, 2 * H}));
  head->k_proj_ = head->linear_weight(layer("self_attn.k_proj.weight", {kv_out, 2 * H}));
  head->v_proj_ = head->linear_weight(layer("self_attn.v_proj.weight", {kv_out, 2 * H}));
  head->o_proj_ = head->linear_weight(layer("self_attn.o_proj.weight", {H, q_out}));
  head->post_norm_ = layer("post_attention_layernorm.weight", {H});
  head->gate_proj_ = head->linear_weight(layer("mlp.gate_proj.weight", {I, H}));
  head->up_proj_ = head->linear_weight(layer("mlp.up_proj.weight", {I, H}));
  head->down_proj_ = head->linear_weight(layer("mlp.down_proj.weight", {H, I}));
  head->final_norm_ = weight(top_tensor(all, "norm.weight"), {H});
  head->lm_head_ = head->linear_weight(weight("lm_head.weight", {Vd, H}));
  if (const std::string e = top_tensor(all, "embed_tokens.weight"); all.count(e)) head->own_embed_ = weight(e, {V, H});

  // d2t[i]: target id of draft id i minus i.
  auto& map = head->draft_to_target_;
  map.resize(static_cast<size_t>(Vd));
  if (auto it = all.find("d2t"); it != all.end()) {
    const RawTensor& t = it->second;
    SPECDEC_CHECK(t.shape == std::vector<int64_t>{Vd}, where, ": tensor \"d2t\" must have shape [", Vd,
                  "] (draft_vocab_size)");
    SPECDEC_CHECK(t.dtype == "I64" || t.dtype == "I32", where, ": tensor \"d2t\" is ", t.dtype,
                  ", expected I64 (or I32)");
    std::set<int32_t> seen;
    for (int64_t i = 0; i < Vd; ++i) {
      int64_t off = 0;
      if (t.dtype == "I64") {
        std::memcpy(&off, t.bytes + i * 8, 8);
      } else {
        int32_t o32 = 0;
        std::memcpy(&o32, t.bytes + i * 4, 4);
        off = o32;
      }
      const int64_t target = i + off;
      SPECDEC_CHECK(target >= 0 && target < V, where, ": d2t maps draft id ", i, " to target id ", target,
                    ", outside the target vocabulary of ", V);
      SPECDEC_CHECK(seen.insert(static_cast<int32_t>(target)).second, where, ": d2t maps two draft ids to target id ",
                    target);
      map[static_cast<size_t>(i)] = static_cast<int32_t>(target);
    }
  } else {
    SPECDEC_CHECK(Vd == V, where, ": the head has a reduced draft vocabulary (", Vd, " of ", V,
                  ") but no \"d2t\" tensor mapping it to target ids");
    for (int64_t i = 0; i < Vd; ++i) map[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  }
  if (auto it = all.find("t2d"); it != all.end()) {
    const RawTensor& t = it->second;
    SPECDEC_CHECK(t.shape == std::vector<int64_t>{V} && (t.dtype == "BOOL" || t.dtype == "U8"), where,
                  ": tensor \"t2d\" must be BOOL of shape [", V, "] (vocab_size)");
    std::vector<char> in_draft(static_cast<size_t>(V), 0);
    for (int32_t id : map) in_draft[static_cast<size_t>(id)] = 1;
    for (int64_t i = 0; i < V; ++i)
      SPECDEC_CHECK((t.bytes[i] != 0) == (in_draft[static_cast<size_t>(i)] != 0), where, ": t2d marks target id ", i,
                    t.bytes[i] ? " as in" : " as not in", " the draft vocabulary, which d2t contradicts");
  }

  head->draft_to_target_device_ = head->upload(DType::i32, {Vd, 1}, map.data());

  const std::vector<float> inv_freq = rope_inv_freq(l);
  head->inv_freq_ = head->upload(DType::f32, {static_cast<int64_t>(inv_freq.size())}, inv_freq.data());
  head->rope_scaling_ = rope_attention_scaling(l);
  head->attn_scale_ = 1.0f / std::sqrt(static_cast<float>(hd));
  backend.synchronize();  // the file's bytes die with this scope
  return head;
}

std::unique_ptr<KvCache> Eagle3Head::make_cache(int num_blocks) const {
  const ModelConfig& l = config_.layer;
  return std::make_unique<KvCache>(backend_, 1, l.num_kv_heads, l.head_dim, num_blocks);
}

void Eagle3Head::ensure(Buffer& buffer, size_t bytes) {
  if (buffer.bytes() >= bytes && buffer.data()) return;
  // Queued kernels may still read the old buffer: a device backend frees it in stream order,
  // after them, so there is nothing to wait for.
  buffer = Buffer();
  buffer = backend_.allocate(std::max(bytes, buffer.bytes() + buffer.bytes() / 2));
}

namespace {

// The plan's i32 arrays plus the row order that interleaves [embedding; hidden] (cat_index).
struct Meta {
  Tensor ids, positions, slots, row_starts, row_lens, block_table, out_index, cat_index;
  Meta(Carver& m, const ForwardPlan& p)
      : ids(m.take(DType::i32, {p.tokens})),
        positions(m.take(DType::i32, {p.tokens})),
        slots(m.take(DType::i32, {p.tokens})),
        row_starts(m.take(DType::i32, {p.rows + 1})),
        row_lens(m.take(DType::i32, {p.rows})),
        block_table(m.take(DType::i32, {p.rows, p.max_blocks})),
        out_index(m.take(DType::i32, {std::max(p.outputs, 1)})),
        cat_index(m.take(DType::i32, {2 * int64_t{p.tokens}})) {}
};

struct Activations {
  Tensor input, x;
  Eagle3Head::Scratch layer;
  Tensor out_hidden, out_normed, logits;
  Activations(Carver& a, const Eagle3Config& c, int64_t T, int64_t N, int64_t in_width, int64_t columns)
      : input(a.take(DType::f32, {T, std::max<int64_t>(in_width, 1)})),
        x(a.take(DType::f32, {T, c.layer.hidden_size})),
        layer(Eagle3Head::scratch_of(a, c, T)),
        out_hidden(a.take(DType::f32, {N, c.layer.hidden_size})),
        out_normed(a.take(DType::f32, {N, c.layer.hidden_size})),
        logits(a.take(DType::f32, {N, columns})) {}
};

void put(const std::vector<int32_t>& src, const Tensor& dst) { std::copy(src.begin(), src.end(), dst.ptr<int32_t>()); }

// cat row 2t is the normed embedding of token t (parts row t), row 2t+1 its normed hidden
// (parts row T + t): [T, 2H] read as [2T, H].
void put_cat_index(const Tensor& dst, int64_t T) {
  for (int64_t t = 0; t < T; ++t) {
    dst.ptr<int32_t>()[2 * t] = static_cast<int32_t>(t);
    dst.ptr<int32_t>()[2 * t + 1] = static_cast<int32_t>(T + t);
  }
}

}  // namespace

Eagle3Head::Scratch Eagle3Head::scratch_of(Carver& a, const Eagle3Config& c, int64_t T) {
  const ModelConfig& l = c.layer;
  Scratch s;
  s.parts = a.take(DType::f32, {2 * T, l.hidden_size});
  s.cat = a.take(DType::f32, {T, 2 * int64_t{l.hidden_size}});
  s.q = a.take(DType::f32, {T, int64_t{l.num_heads} * l.head_dim});
  s.k = a.take(DType::f32, {T, int64_t{l.num_kv_heads} * l.head_dim});
  s.v = a.take(DType::f32, {T, int64_t{l.num_kv_heads} * l.head_dim});
  s.attn = a.take(DType::f32, {T, int64_t{l.num_heads} * l.head_dim});
  s.normed = a.take(DType::f32, {T, l.hidden_size});
  s.gate = a.take(DType::f32, {T, l.intermediate_size});
  return s;
}

void Eagle3Head::layer(const Tensor& embed, const Tensor& ids, const Tensor& x, const Tensor& positions,
                       const Tensor& cat_index, const AttentionBatch& batch, const Scratch& s, int64_t T,
                       KvCache& cache) {
  const ModelConfig& l = config_.layer;
  const float eps = l.rms_norm_eps;
  const int64_t nh = l.num_heads, nkv = l.num_kv_heads, hd = l.head_dim, H = l.hidden_size;
  const Tensor embeds = s.parts.rows(0, T), hiddens = s.parts.rows(T, T);
  backend_.embedding(embed, ids, embeds);
  backend_.rms_norm(embeds, input_norm_, eps, embeds);
  backend_.rms_norm(x, hidden_norm_, eps, hiddens);
  if (config_.norm_before_residual) backend_.rms_norm(x, hidden_norm_, eps, x);
  backend_.gather_rows(s.parts, cat_index, s.cat.reshape({2 * T, H}));
  const std::array<Projection, 3> qkv = {Projection{q_proj_, {}, s.q}, Projection{k_proj_, {}, s.k},
                                         Projection{v_proj_, {}, s.v}};
  backend_.linear_many(s.cat, qkv);
  backend_.rope_kv_write_attention(s.q.reshape({T, nh, hd}), s.k.reshape({T, nkv, hd}), s.v.reshape({T, nkv, hd}),
                                   positions, inv_freq_, rope_scaling_, cache.k_pool(0), cache.v_pool(0), batch,
                                   attn_scale_, s.attn.reshape({T, nh, hd}));
  backend_.linear_add(s.attn, o_proj_, nullptr, x);
  backend_.norm_mlp_add(x, post_norm_, eps, s.normed, gate_proj_, up_proj_, s.gate, down_proj_);
}

Eagle3Head::Output Eagle3Head::forward(std::span<const Row> rows, std::span<const float> inputs, bool fused,
                                       const Tensor* embedding, KvCache& cache) {
  const int64_t width = fused ? 3 * int64_t{config_.target_hidden} : config_.layer.hidden_size;
  SPECDEC_CHECK(static_cast<int64_t>(inputs.size()) % width == 0, "EAGLE-3 head forward: ", inputs.size(),
                " input floats are no whole number of rows of width ", width);
  const Tensor host(const_cast<float*>(inputs.data()), DType::f32,
                    {static_cast<int64_t>(inputs.size()) / width, width});
  return forward(rows, host, fused, embedding, cache);
}

Eagle3Head::Output Eagle3Head::forward(std::span<const Row> rows, const Tensor& inputs, bool fused,
                                       const Tensor* embedding, KvCache& cache) {
  return run(rows, inputs, fused, embedding, cache, nullptr);
}

Eagle3Head::Output Eagle3Head::run(std::span<const Row> rows, const Tensor& inputs, bool fused, const Tensor* embedding,
                                   KvCache& cache, const Tensor* keep_hidden) {
  const ModelConfig& l = config_.layer;
  const Tensor& embed = has_embedding() ? own_embed_ : (embedding ? *embedding : own_embed_);
  SPECDEC_CHECK(!embed.empty(), "the EAGLE-3 head has no embed_tokens and was given no target embedding");
  ForwardRequest request;
  for (const Row& r : rows) request.rows.push_back(SequenceInput{r.seq, r.tokens, r.outputs_at});
  const ForwardPlan plan = plan_forward(request, cache, l);
  const int64_t T = plan.tokens, N = plan.outputs, H = l.hidden_size;
  const int64_t width = fused ? 3 * int64_t{config_.target_hidden} : H;
  SPECDEC_CHECK(inputs.dtype == DType::f32 && inputs.numel() == T * width, "EAGLE-3 head forward: inputs ",
                inputs.shape_string(), " for ", T, " tokens of width ", width);

  // Metadata, staged on the host in the device layout, uploaded in one copy.
  const auto meta_of = [&](Carver& m) { return Meta(m, plan); };
  Carver measure = Carver::measure();
  meta_of(measure);
  ensure(meta_, measure.size());
  // Only this plan's bytes: the buffer keeps the size of the largest plan seen (a prompt's
  // catch-up), which every later round would otherwise copy.
  std::vector<int32_t> staging(measure.size() / sizeof(int32_t), 0);
  Carver host_carver(staging.data(), staging.size() * sizeof(int32_t), Device::cpu);
  const Meta host = meta_of(host_carver);
  put(plan.ids, host.ids);
  put(plan.positions, host.positions);
  put(plan.slots, host.slots);
  put(plan.row_starts, host.row_starts);
  put(plan.row_lens, host.row_lens);
  put(plan.block_table, host.block_table);
  put(plan.out_index, host.out_index);
  put_cat_index(host.cat_index, T);
  Carver dev_carver = Carver::of(meta_);
  const Meta m = meta_of(dev_carver);
  const int64_t words = static_cast<int64_t>(staging.size());
  backend_.copy(Tensor(staging.data(), DType::i32, {words}), Tensor(meta_.data(), DType::i32, {words}, meta_.device()));

  const auto acts_of = [&](Carver& a) {
    return Activations(a, config_, T, std::max<int64_t>(N, 1), width, logit_columns());
  };
  Carver measure_acts = Carver::measure();
  acts_of(measure_acts);
  ensure(activations_, measure_acts.size());
  Carver acts_carver = Carver::of(activations_);
  const Activations s = acts_of(acts_carver);

  AttentionBatch batch;
  batch.positions = m.positions;
  batch.slots = m.slots;
  batch.row_starts = m.row_starts;
  batch.row_lens = m.row_lens;
  batch.block_table = m.block_table;
  batch.rows = plan.rows;
  batch.tokens = plan.tokens;
  batch.max_blocks = plan.max_blocks;
  batch.block_size = plan.block_size;
  batch.max_row_len = plan.max_row_len;
  batch.max_row_tokens = plan.max_row_tokens;

  const float eps = l.rms_norm_eps;
  // x: the hidden the layer's residual starts from (fc of the taps, or the head's own output).
  // Inputs already in the backend's memory are read where they are.
  const Tensor in = inputs.reshape({T, width});
  if (fused) {
    const bool here = in.device == backend_.device();
    if (!here) backend_.copy(in, s.input);
    backend_.linear(here ? in : s.input, fc_, nullptr, s.x);
  } else {
    backend_.copy(in, s.x);
  }
  layer(embed, m.ids, s.x, m.positions, m.cat_index, batch, s.layer, T, cache);

  Output out;
  if (keep_hidden) {
    SPECDEC_CHECK(keep_hidden->numel() == N * H, "EAGLE-3 head: ", N, " outputs do not fit ",
                  keep_hidden->shape_string());
    if (N > 0) backend_.gather_rows(s.x, m.out_index.rows(0, N), *keep_hidden);
  } else if (N > 0) {
    const Tensor g = s.out_hidden.rows(0, N), gn = s.out_normed.rows(0, N), logits = s.logits.rows(0, N);
    backend_.gather_rows(s.x, m.out_index.rows(0, N), g);
    const std::array<Projection, 1> head = {Projection{lm_head_, {}, logits}};
    backend_.norm_linear_many(g, final_norm_, eps, gn, head);
    out.hidden.resize(static_cast<size_t>(N * H));
    out.logits.resize(static_cast<size_t>(N) * static_cast<size_t>(logit_columns()));
    backend_.copy(g, Tensor(out.hidden.data(), DType::f32, {N, H}));
    backend_.copy(logits, Tensor(out.logits.data(), DType::f32, {N, logit_columns()}));
  }
  for (size_t r = 0; r < rows.size(); ++r) cache.set_length(rows[r].seq, plan.row_lens[r]);
  return out;
}

int Eagle3Head::step0_width(std::span<const Row> rows) const {
  if (!replays_chains() || rows.empty()) return 0;
  int longest = 1;
  for (const Row& r : rows) longest = std::max(longest, static_cast<int>(r.tokens.size()));
  const int width = ReplayCache::window_width(longest);
  const bool fits = width <= 16 && static_cast<int64_t>(rows.size()) * width <= ReplayCache::kMaxPaddedWindowTokens;
  return fits ? width : 0;
}

Eagle3Head::Drafts Eagle3Head::draft_chain(std::span<const Row> rows, const Tensor& fused_inputs, int depth,
                                           const Tensor* embedding, KvCache& cache, std::span<const SampleRow> draws) {
  const ModelConfig& l = config_.layer;
  SPECDEC_CHECK(depth >= 1, "EAGLE-3 head: a chain of depth ", depth);
  const Tensor& embed = has_embedding() ? own_embed_ : (embedding ? *embedding : own_embed_);
  SPECDEC_CHECK(!embed.empty(), "the EAGLE-3 head has no embed_tokens and was given no target embedding");
  const int64_t R = static_cast<int64_t>(rows.size()), H = l.hidden_size, Vd = logit_columns();
  const int64_t V = l.vocab_size;
  const int64_t fused_width = 3 * int64_t{config_.target_hidden};
  const int steps = depth - 1;
  const bool sampled = !draws.empty();
  SPECDEC_CHECK(!sampled || static_cast<int64_t>(draws.size()) == int64_t{depth} * R, "EAGLE-3 head: ", draws.size(),
                " draws for a chain of ", depth, " over ", R, " rows");
  Drafts out;
  if (R == 0) return out;
  // Step 0 writes each row's positions [start, len); chained step j (1..steps) writes position
  // len + j - 1. The attention bounds are rounded up as the target's decode steps round theirs,
  // so that rounds of one shape share a recording.
  const int width = step0_width(rows);
  const int64_t T0 = R * width;
  const int bs = cache.block_size();
  std::vector<int> start(static_cast<size_t>(R)), len(static_cast<size_t>(R));
  int longest = 0, widest = 1;
  for (int64_t r = 0; r < R; ++r) {
    const Row& row = rows[static_cast<size_t>(r)];
    SPECDEC_CHECK(row.outputs_at.size() == 1, "EAGLE-3 head: a chain returns one position a row");
    SPECDEC_CHECK(
        !row.tokens.empty() && row.outputs_at[0] >= 0 && row.outputs_at[0] < static_cast<int32_t>(row.tokens.size()),
        "EAGLE-3 head: a chain row returns position ", row.outputs_at[0], " of its ", row.tokens.size(), " tokens");
    start[static_cast<size_t>(r)] = cache.length(row.seq);
    len[static_cast<size_t>(r)] = start[static_cast<size_t>(r)] + static_cast<int>(row.tokens.size());
    longest = std::max(longest, len[static_cast<size_t>(r)] + steps);
    widest = std::max(widest, static_cast<int>(cache.block_table(row.seq).size()));
    SPECDEC_CHECK(static_cast<int>(cache.block_table(row.seq).size()) * bs >= len[static_cast<size_t>(r)] + steps,
                  "EAGLE-3 head: a row's KV is not reserved for its chain of ", depth);
  }
  if (width > 0)
    SPECDEC_CHECK(fused_inputs.dtype == DType::f32 && fused_inputs.numel() == T0 * fused_width,
                  "EAGLE-3 head: padded step-0 inputs ", fused_inputs.shape_string(), " for ", R, " rows of ", width,
                  " positions");
  const ReplayCache::Bounds bounds = ReplayCache::padded_bounds(longest, widest, bs);
  const int mb = bounds.max_blocks;

  // The i32 arrays of a step: positions, slots, row starts, row lengths, block tables; for a
  // padded step 0 also token ids, the returned position of each row and its cat order; a
  // sampled chain's SampleRows. Every step's arrays are staged on the host and uploaded in one
  // copy.
  struct StepMeta {
    Tensor positions, slots, row_starts, row_lens, table, ids, out_index, cat;
  };
  const auto step_meta = [&](Carver& m, int64_t tokens) {
    StepMeta t;
    t.positions = m.take(DType::i32, {tokens});
    t.slots = m.take(DType::i32, {tokens});
    t.row_starts = m.take(DType::i32, {R + 1});
    t.row_lens = m.take(DType::i32, {R});
    t.table = m.take(DType::i32, {R, mb});
    return t;
  };
  const auto meta_of = [&](Carver& m, StepMeta& first, std::vector<StepMeta>& per_step, Tensor& cat, Tensor& keys) {
    if (width > 0) {
      first = step_meta(m, T0);
      first.ids = m.take(DType::i32, {T0});
      first.out_index = m.take(DType::i32, {R});
      first.cat = m.take(DType::i32, {2 * T0});
    }
    per_step.clear();
    for (int j = 1; j <= steps; ++j) per_step.push_back(step_meta(m, R));
    cat = m.take(DType::i32, {2 * R});
    if (sampled) keys = m.take(DType::i32, {int64_t{depth} * R, kSampleRowWords});
  };
  StepMeta host_first, dev_first;
  std::vector<StepMeta> host_steps, dev_steps;
  Tensor host_cat, dev_cat, host_keys, dev_keys;
  Carver measure = Carver::measure();
  meta_of(measure, host_first, host_steps, host_cat, host_keys);
  const auto grow = [&](Buffer& buffer, size_t bytes) {
    if (buffer.bytes() >= bytes && buffer.data()) return false;
    buffer = Buffer();
    buffer = backend_.allocate(bytes + bytes / 2);
    chain_replays_.clear();  // the recordings point into the old buffer
    whole_replays_.clear();
    return true;
  };
  bool one_off = grow(chain_meta_, measure.size());
  std::vector<int32_t> staging(measure.size() / sizeof(int32_t), 0);  // this chain's bytes only
  Carver host_carver(staging.data(), staging.size() * sizeof(int32_t), Device::cpu);
  meta_of(host_carver, host_first, host_steps, host_cat, host_keys);
  const auto slot_of = [&](const std::vector<int>& table, int p) {
    return table.at(static_cast<size_t>(p / bs)) * bs + p % bs;
  };
  const auto put_table = [&](const Tensor& dst, int64_t r, const std::vector<int>& table) {
    for (size_t b = 0; b < table.size(); ++b) dst.ptr<int32_t>()[r * mb + static_cast<int64_t>(b)] = table[b];
  };
  if (width > 0) {
    // Each row's positions padded to `width` as a batch of verify windows is: a padding position
    // repeats the row's last token at its position and writes no K/V (slot -1), so it attends as
    // that token does and changes nothing.
    const StepMeta& h = host_first;
    for (int64_t r = 0; r < R; ++r) {
      const Row& row = rows[static_cast<size_t>(r)];
      const auto& table = cache.block_table(row.seq);
      const int n = static_cast<int>(row.tokens.size());
      for (int j = 0; j < width; ++j) {
        const int k = std::min(j, n - 1), p = start[static_cast<size_t>(r)] + k;
        const int64_t t = r * width + j;
        h.ids.ptr<int32_t>()[t] = row.tokens[static_cast<size_t>(k)];
        h.positions.ptr<int32_t>()[t] = p;
        h.slots.ptr<int32_t>()[t] = j < n ? slot_of(table, p) : -1;
      }
      h.row_starts.ptr<int32_t>()[r] = static_cast<int32_t>(r * width);
      h.row_lens.ptr<int32_t>()[r] = len[static_cast<size_t>(r)];
      h.out_index.ptr<int32_t>()[r] = static_cast<int32_t>(r * width + row.outputs_at[0]);
      put_table(h.table, r, table);
    }
    h.row_starts.ptr<int32_t>()[R] = static_cast<int32_t>(T0);
    put_cat_index(h.cat, T0);
  }
  for (int j = 1; j <= steps; ++j) {
    const StepMeta& h = host_steps[static_cast<size_t>(j - 1)];
    for (int64_t r = 0; r < R; ++r) {
      const auto& table = cache.block_table(rows[static_cast<size_t>(r)].seq);
      const int p = len[static_cast<size_t>(r)] + j - 1;
      h.positions.ptr<int32_t>()[r] = p;
      h.slots.ptr<int32_t>()[r] = slot_of(table, p);
      h.row_starts.ptr<int32_t>()[r] = static_cast<int32_t>(r);
      h.row_lens.ptr<int32_t>()[r] = p + 1;
      put_table(h.table, r, table);
    }
    h.row_starts.ptr<int32_t>()[R] = static_cast<int32_t>(R);
  }
  put_cat_index(host_cat, R);
  if (sampled) std::memcpy(host_keys.data, draws.data(), draws.size_bytes());
  Carver dev_carver = Carver::of(chain_meta_);
  meta_of(dev_carver, dev_first, dev_steps, dev_cat, dev_keys);
  const int64_t words = static_cast<int64_t>(staging.size());
  backend_.copy(Tensor(staging.data(), DType::i32, {words}),
                Tensor(chain_meta_.data(), DType::i32, {words}, chain_meta_.device()));

  // The chain's activations: the hidden carried from step to step, the layer's scratch, the
  // normed hidden and logits, and the drafts (draft ids) with their target ids (the next inputs);
  // for a sampled chain the logits over the target vocabulary; for a padded step 0 its fused
  // inputs, hiddens and scratch.
  struct Acts {
    Tensor x, normed, logits, full, drafts, inputs, input0, x0;
    Scratch layer, layer0;
  };
  const auto acts_of = [&](Carver& a) {
    Acts s;
    s.x = a.take(DType::f32, {R, H});
    s.normed = a.take(DType::f32, {R, H});
    s.logits = a.take(DType::f32, {R, Vd});
    if (sampled) s.full = a.take(DType::f32, {R, V});
    s.drafts = a.take(DType::i32, {depth, R});
    s.inputs = a.take(DType::i32, {depth, R});
    s.layer = scratch_of(a, config_, R);
    if (width > 0) {
      s.input0 = a.take(DType::f32, {T0, fused_width});
      s.x0 = a.take(DType::f32, {T0, H});
      s.layer0 = scratch_of(a, config_, T0);
    }
    return s;
  };
  Carver measure_acts = Carver::measure();
  acts_of(measure_acts);
  one_off = grow(chain_acts_, measure_acts.size()) || one_off;
  Carver acts_carver = Carver::of(chain_acts_);
  const Acts s = acts_of(acts_carver);
  const float eps = l.rms_norm_eps;
  // Exact-mode drafts decide only how many tokens a round verifies: what the chain computes and
  // no row keeps (every step's logits, the chained steps' KV, cut back after the round) may run
  // on a backend's fast kernels. Step 0's KV, at the verified positions, stays batch invariant.
  const auto logits_of_x = [&] {
    const FastKernelScope fast(backend_, true);
    const std::array<Projection, 1> head = {Projection{lm_head_, {}, s.logits}};
    backend_.norm_linear_many(s.x, final_norm_, eps, s.normed, head);
  };
  const auto batch_of = [&](const StepMeta& m, int64_t tokens, int row_tokens) {
    AttentionBatch batch;
    batch.positions = m.positions;
    batch.slots = m.slots;
    batch.row_starts = m.row_starts;
    batch.row_lens = m.row_lens;
    batch.block_table = m.table;
    batch.rows = static_cast<int>(R);
    batch.tokens = static_cast<int>(tokens);
    batch.max_blocks = mb;
    batch.block_size = bs;
    batch.max_row_len = bounds.max_row_len;
    batch.max_row_tokens = row_tokens;
    return batch;
  };
  const auto step0 = [&] {
    backend_.linear(s.input0, fc_, nullptr, s.x0);
    layer(embed, dev_first.ids, s.x0, dev_first.positions, dev_first.cat, batch_of(dev_first, T0, width), s.layer0, T0,
          cache);
    backend_.gather_rows(s.x0, dev_first.out_index, s.x);
    logits_of_x();
  };
  // Draft k of every row: a sampled chain's target ids into inputs row k, a greedy one's draft
  // ids into drafts row k (and their target ids into inputs row k when a step follows).
  const auto choose = [&](int k) {
    const Tensor ids = s.inputs.rows(k, 1).reshape({R});
    if (sampled) {
      backend_.scatter_columns(s.logits, draft_to_target_device_, -std::numeric_limits<float>::infinity(), s.full);
      backend_.sample(s.full, dev_keys.rows(k * R, R), ids);
      return;
    }
    const Tensor drafted = s.drafts.rows(k, 1).reshape({R});
    backend_.argmax(s.logits, drafted);
    if (k < steps) backend_.gather_rows(draft_to_target_device_, drafted, ids.reshape({R, 1}));
  };
  const auto chain = [&] {
    const FastKernelScope fast(backend_, true);
    for (int j = 1; j <= steps; ++j) {
      const StepMeta& m = dev_steps[static_cast<size_t>(j - 1)];
      choose(j - 1);
      layer(embed, s.inputs.rows(j - 1, 1).reshape({R}), s.x, m.positions, dev_cat, batch_of(m, R, 1), s.layer, R,
            cache);
      logits_of_x();
    }
    choose(steps);
  };
  ReplayKey key;
  key.rows = static_cast<int>(R);
  key.tokens = static_cast<int>(T0 + R * steps);
  key.max_row_tokens = std::max(width, 1);
  key.max_blocks = mb;
  key.max_row_len = bounds.max_row_len;
  key.outputs = depth;
  key.selection = sampled ? Selection::sample : Selection::argmax;
  key.pool_blocks = cache.total_blocks();
  key.pools = {cache.k_pool(0).data, cache.v_pool(0).data};
  key.fast_kernels = true;
  // On a backend that records, a chain that does not replay paid one-off costs (a new shape, or
  // step 0 called one by one); on one that records nothing, none is one-off.
  const bool records = replays_chains();
  bool replayed = false;
  if (width > 0) {
    // The inputs come from the caller's buffer; the recording reads its own copy of them.
    backend_.copy(fused_inputs.reshape({T0, fused_width}), s.input0);
    replayed = !whole_replays_.replay_or_run(key, [&] {
      step0();
      chain();
    });
    chain_stats_.step0_replayed += replayed ? 1 : 0;
  } else {
    // Step 0 (a row catching up on many positions, or a backend that records nothing): call by
    // call, then the chain.
    run(rows, fused_inputs, true, embedding, cache, &s.x);
    logits_of_x();
    if (steps > 0 && records)
      replayed = !chain_replays_.replay_or_run(key, chain);
    else
      chain();
  }
  one_off = one_off || (records && !replayed);
  chain_stats_.chains += 1;
  chain_stats_.replayed += replayed ? 1 : 0;
  out.ids.resize(static_cast<size_t>(depth * R));
  backend_.copy(sampled ? s.inputs : s.drafts, Tensor(out.ids.data(), DType::i32, {depth, R}));
  if (!sampled)
    for (int32_t& id : out.ids)
      if (id >= 0) id = draft_to_target_[static_cast<size_t>(id)];
  for (int64_t r = 0; r < R; ++r)
    cache.set_length(rows[static_cast<size_t>(r)].seq, len[static_cast<size_t>(r)] + steps);
  out.one_off = one_off;
  return out;
}

}  // namespace specdec
