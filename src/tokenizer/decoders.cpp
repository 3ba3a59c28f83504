// Decoder implementations. ByteLevel turns the GPT-2 alphabet back into bytes and decodes them
// lossily (one U+FFFD per maximal invalid subsequence); ByteFallback instead gives one U+FFFD per
// byte of an invalid <0xXX> run, as the library does.
#include "tokenizer/decoders.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/json_util.h"
#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

namespace specdec {
namespace {

class ByteLevelDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const auto& t : tokens) append_token_bytes(t, bytes);
    tokens.assign(1, utf8::from_bytes_lossy(bytes));
  }
  bool concatenates_bytes() const override { return true; }
  void append_token_bytes(std::string_view t, std::string& bytes) const override {
    const auto& alphabet = utf8::byte_level_alphabet();
    const size_t mark = bytes.size();
    size_t i = 0;
    while (i < t.size()) {
      size_t len = 0;
      const char32_t cp = utf8::decode_at(t, i, &len);
      const int b = cp < alphabet.char_to_byte.size() ? alphabet.char_to_byte[cp] : -1;
      if (b < 0) {  // a token outside the alphabet (an added token) contributes its own bytes
        bytes.resize(mark);
        bytes += t;
        return;
      }
      bytes.push_back(static_cast<char>(b));
      i += len;
    }
  }
};

class MetaspaceDecoder final : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool strip_first) : replacement_(std::move(replacement)), strip_first_(strip_first) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string out;
      const std::string& t = tokens[i];
      size_t pos = 0;
      while (pos < t.size()) {
        if (t.compare(pos, replacement_.size(), replacement_) == 0) {
          if (!(i == 0 && strip_first_)) out.push_back(' ');
          pos += replacement_.size();
        } else {
          out.push_back(t[pos++]);
        }
      }
      tokens[i] = std::move(out);
    }
  }

 private:
  std::string replacement_;
  bool strip_first_;  // the first token's replacement characters vanish unless prepend_scheme is "never"
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(Regex pattern, std::string content) : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens) t = replace_all(pattern_, t, content_);
  }

 private:
  Regex pattern_;
  std::string content_;
};

// "<0xAB>" -> 0xAB, or -1.
int byte_token_value(const std::string& t) {
  if (t.size() != 6 || !t.starts_with("<0x") || t[5] != '>') return -1;
  int v = 0;
  for (size_t i = 3; i < 5; ++i) {
    const char c = t[i];
    int d = -1;
    if (c >= '0' && c <= '9') d = c - '0';
    if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
    if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

class ByteFallbackDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens.size());
    std::string pending;
    auto flush = [&] {
      if (pending.empty()) return;
      if (!utf8::first_invalid(pending)) {
        out.push_back(pending);
      } else {
        for (size_t i = 0; i < pending.size(); ++i) out.emplace_back(utf8::kReplacement);
      }
      pending.clear();
    };
    for (auto& t : tokens) {
      const int b = byte_token_value(t);
      if (b >= 0) {
        pending.push_back(static_cast<char>(b));
        continue;
      }
      flush();
      out.push_back(std::move(t));
    }
    flush();
    tokens = std::move(out);
  }
};

class FuseDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string joined;
    for (const auto& t : tokens) joined += t;
    tokens.assign(1, std::move(joined));
  }
};

class StripDecoder final : public Decoder {
 public:
  StripDecoder(char32_t content, size_t start, size_t stop) : content_(content), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens) {
      // Character boundaries of t.
      std::vector<size_t> bounds{0};
      std::vector<char32_t> chars;
      size_t i = 0;
      while (i < t.size()) {
        size_t len = 0;
        chars.push_back(utf8::decode_at(t, i, &len));
        i += len;
        bounds.push_back(i);
      }
      size_t start_cut = 0;
      for (size_t k = 0; k < chars.size() && k < start_; ++k) {
        if (chars[k] != content_) break;
        start_cut = k + 1;
      }
      size_t stop_cut = chars.size();
      for (size_t k = 0; k < chars.size() && k < stop_; ++k) {
        if (chars[chars.size() - 1 - k] != content_) break;
        stop_cut = chars.size() - 1 - k;
      }
      t = stop_cut > start_cut ? t.substr(bounds[start_cut], bounds[stop_cut] - bounds[start_cut]) : std::string();
    }
  }

 private:
  char32_t content_;
  size_t start_;
  size_t stop_;
};

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> parts) : parts_(std::move(parts)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& p : parts_) p->decode_chain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

char32_t single_char(const std::string& s, const std::string& where, const char* what) {
  SPECDEC_CHECK(!s.empty() && !utf8::first_invalid(s), where, ": ", what, " must be one character");
  size_t len = 0;
  const char32_t cp = utf8::decode_at(s, 0, &len);
  SPECDEC_CHECK(len == s.size(), where, ": ", what, " must be one character, got '", s, "'");
  return cp;
}

}  // namespace

std::unique_ptr<Decoder> make_decoder(const nlohmann::json& spec, const std::string& where) {
  if (spec.is_null()) return nullptr;
  const std::string type = json_type(spec, where, "decoder");
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Decoder>> parts;
    for (const auto& sub : json_array(spec, "decoders", where)) {
      if (auto d = make_decoder(sub, where)) parts.push_back(std::move(d));
    }
    return std::make_unique<SequenceDecoder>(std::move(parts));
  }
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Metaspace") {
    std::string replacement = json_string(spec, "replacement", where);
    single_char(replacement, where, "Metaspace decoder replacement");
    bool strip_first = true;
    if (auto it = spec.find("prepend_scheme"); it != spec.end() && it->is_string()) {
      strip_first = it->get<std::string>() != "never";
    } else {
      strip_first = json_bool(spec, "add_prefix_space", where, true);
    }
    return std::make_unique<MetaspaceDecoder>(std::move(replacement), strip_first);
  }
  if (type == "Replace") {
    return std::make_unique<ReplaceDecoder>(json_pattern(spec, where + ": decoder Replace"),
                                            json_string(spec, "content", where));
  }
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") {
    const char32_t content = single_char(json_string(spec, "content", where), where, "Strip decoder content");
    const int64_t start = json_int(spec, "start", where, 0);
    const int64_t stop = json_int(spec, "stop", where, 0);
    SPECDEC_CHECK(start >= 0 && stop >= 0, where, ": Strip decoder start/stop must be >= 0");
    return std::make_unique<StripDecoder>(content, static_cast<size_t>(start), static_cast<size_t>(stop));
  }
  fail(where, ": unsupported decoder type '", type, "'");
}

}  // namespace specdec
