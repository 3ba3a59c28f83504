// RoPE settings and inverse frequencies, computed as transformers' modeling_rope_utils does
// (float32 arithmetic, same operation order), so positions rotate exactly as in the reference.
#include "model/config_rope.h"

#include <cmath>
#include <numbers>

#include "core/error.h"

namespace specdec {

namespace {

using config_json::Json;

double require_number(const Json& obj, const std::string& key, const std::string& where) {
  const auto v = config_json::get_number(obj, key, where);
  SPECDEC_CHECK(v.has_value(), where, ": required field \"", key, "\" is missing");
  return *v;
}

}  // namespace

RopeConfig parse_rope_config(const Json& j, const std::string& src) {
  RopeConfig r;
  const Json* params = nullptr;
  std::string where = src;
  // transformers 5 writes rope_parameters (theta inside); older configs rope_theta + rope_scaling.
  if (auto it = j.find("rope_parameters"); it != j.end() && !it->is_null()) {
    params = &*it;
    where = src + " (rope_parameters)";
  } else if (auto sc = j.find("rope_scaling"); sc != j.end() && !sc->is_null()) {
    params = &*sc;
    where = src + " (rope_scaling)";
  }
  SPECDEC_CHECK(!params || params->is_object(), where, ": expected a JSON object");
  std::optional<double> theta;
  if (params) theta = config_json::get_number(*params, "rope_theta", where);
  if (!theta) theta = config_json::get_number(j, "rope_theta", src);
  r.theta = theta.value_or(10000.0);
  SPECDEC_CHECK(r.theta > 1.0, where, ": rope_theta = ", r.theta, " must be greater than 1");
  if (!params) return r;

  std::optional<std::string> type = config_json::get_string(*params, "rope_type", where);
  if (!type) type = config_json::get_string(*params, "type", where);
  r.type = type.value_or("default");
  const double partial = config_json::get_number(*params, "partial_rotary_factor", where).value_or(1.0);
  SPECDEC_CHECK(partial == 1.0, where, ": partial_rotary_factor = ", partial, " is not supported");
  if (r.type == "default") return r;
  if (r.type == "linear") {
    r.factor = require_number(*params, "factor", where);
    SPECDEC_CHECK(r.factor >= 1.0, where, ": linear rope factor = ", r.factor, " must be >= 1");
    return r;
  }
  if (r.type == "llama3") {
    r.factor = require_number(*params, "factor", where);
    r.low_freq_factor = require_number(*params, "low_freq_factor", where);
    r.high_freq_factor = require_number(*params, "high_freq_factor", where);
    const double orig = require_number(*params, "original_max_position_embeddings", where);
    SPECDEC_CHECK(r.factor >= 1.0, where, ": llama3 rope factor = ", r.factor, " must be >= 1");
    SPECDEC_CHECK(r.low_freq_factor > 0.0 && r.high_freq_factor > r.low_freq_factor, where,
                  ": llama3 rope needs 0 < low_freq_factor < high_freq_factor, got ", r.low_freq_factor,
                  " and ", r.high_freq_factor);
    SPECDEC_CHECK(orig >= 1.0 && orig <= double(1 << 30) && orig == std::floor(orig), where,
                  ": original_max_position_embeddings = ", orig, " must be a positive integer");
    r.original_max_position = static_cast<int>(orig);
    return r;
  }
  fail(where, ": rope type \"", r.type, "\" is not supported (supported: default, linear, llama3)");
}

std::vector<float> rope_inv_freq(const ModelConfig& config) {
  const int dim = config.head_dim;
  SPECDEC_CHECK(dim > 0 && dim % 2 == 0, "rope_inv_freq: head_dim = ", dim, " must be positive and even");
  const RopeConfig& r = config.rope;
  // Default: 1 / base ** (arange(0, dim, 2).float() / dim), all in float32 as torch does.
  std::vector<float> inv(static_cast<size_t>(dim / 2));
  const float base = static_cast<float>(r.theta);
  for (int i = 0; i < dim / 2; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
    inv[static_cast<size_t>(i)] = 1.0f / std::pow(base, exponent);
  }
  if (r.type == "default") return inv;
  const float factor = static_cast<float>(r.factor);
  if (r.type == "linear") {
    for (float& f : inv) f /= factor;
    return inv;
  }
  SPECDEC_CHECK(r.type == "llama3", "rope_inv_freq: rope type \"", r.type, "\" is not supported");
  // Long wavelengths are slowed by factor, short ones kept, the band between blended smoothly.
  const double old_len = r.original_max_position;
  const float low_wavelen = static_cast<float>(old_len / r.low_freq_factor);
  const float high_wavelen = static_cast<float>(old_len / r.high_freq_factor);
  const float two_pi = static_cast<float>(2.0 * std::numbers::pi);
  const float low = static_cast<float>(r.low_freq_factor);
  const float band = static_cast<float>(r.high_freq_factor - r.low_freq_factor);
  for (float& f : inv) {
    const float wavelen = two_pi / f;
    const float scaled = wavelen > low_wavelen ? f / factor : f;
    const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
    if (medium) {
      const float smooth = (static_cast<float>(old_len) / wavelen - low) / band;
      f = (1.0f - smooth) * scaled / factor + smooth * scaled;
    } else {
      f = scaled;
    }
  }
  return inv;
}

float rope_attention_scaling(const ModelConfig& config) {
  // default, linear and llama3 leave cos/sin unscaled; other types are refused when parsed.
  SPECDEC_CHECK(config.rope.type == "default" || config.rope.type == "linear" || config.rope.type == "llama3",
                "rope_attention_scaling: rope type \"", config.rope.type, "\" is not supported");
  return 1.0f;
}

}  // namespace specdec
