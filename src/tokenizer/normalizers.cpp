// Normaliser implementations. The Unicode normal forms (NFC/NFKC/NFD/NFKD) come from utf8proc,
// whose tables follow the Unicode standard as the `tokenizers` library's do.
#include "tokenizer/normalizers.h"

#include <utf8proc.h>

#include <cstdlib>

#include <clocale>
#include <cwctype>
#include <locale.h>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "core/error.h"
#include "tokenizer/json_util.h"
#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

namespace specdec {
namespace {

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts) : parts_(std::move(parts)) {}
  void normalize(std::string& text) const override {
    for (const auto& p : parts_) p->normalize(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  void normalize(std::string& text) const override {
    if (!text.empty()) text.insert(0, prefix_);  // the library leaves empty text alone
  }

 private:
  std::string prefix_;
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(Regex pattern, std::string content) : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void normalize(std::string& text) const override { text = replace_all(pattern_, text, content_); }

 private:
  Regex pattern_;
  std::string content_;
};

class LowercaseNormalizer final : public Normalizer {
 public:
  void normalize(std::string& text) const override {
    if (utf8::is_ascii(text)) {
      for (char& c : text) {
        if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
      }
      return;
    }
    // Simple (one-to-one) Unicode case mapping from the C library's UTF-8 locale.
    static const locale_t loc = newlocale(LC_CTYPE_MASK, "C.UTF-8", static_cast<locale_t>(nullptr));
    SPECDEC_CHECK(loc != static_cast<locale_t>(nullptr),
                  "normalizer Lowercase: the C.UTF-8 locale is unavailable for non-ASCII text");
    std::string out;
    out.reserve(text.size());
    size_t i = 0;
    while (i < text.size()) {
      size_t len = 0;
      const char32_t cp = utf8::decode_at(text, i, &len);
      utf8::append(out, static_cast<char32_t>(towlower_l(static_cast<wint_t>(cp), loc)));
      i += len;
    }
    text = std::move(out);
  }
};

class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& text) const override {
    size_t begin = 0;
    size_t end = text.size();
    if (left_) {
      while (begin < end) {
        size_t len = 0;
        if (!utf8::is_whitespace(utf8::decode_at(text, begin, &len))) break;
        begin += len;
      }
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
        size_t len = 0;
        if (!utf8::is_whitespace(utf8::decode_at(text, start, &len))) break;
        end = start;
      }
    }
    text = text.substr(begin, end - begin);
  }

 private:
  bool left_;
  bool right_;
};

// One of the four Unicode normal forms. ASCII text is its own normal form under all four, so
// the common case skips the library entirely.
class UnicodeNormalForm final : public Normalizer {
 public:
  UnicodeNormalForm(std::string name, utf8proc_option_t options) : name_(std::move(name)), options_(options) {}
  void normalize(std::string& text) const override {
    if (utf8::is_ascii(text)) return;
    utf8proc_uint8_t* mapped = nullptr;
    const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                            static_cast<utf8proc_ssize_t>(text.size()), &mapped, options_);
    // The text was checked as UTF-8 before encoding; what remains is running out of memory.
    if (n < 0) fail("normalizer ", name_, ": ", utf8proc_errmsg(n), " (", text.size(), " bytes of input)");
    text.assign(reinterpret_cast<const char*>(mapped), static_cast<size_t>(n));
    std::free(mapped);
  }

 private:
  std::string name_;
  utf8proc_option_t options_;
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& spec, const std::string& where) {
  if (spec.is_null()) return nullptr;
  const std::string type = json_type(spec, where, "normalizer");
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> parts;
    for (const auto& sub : json_array(spec, "normalizers", where)) {
      if (auto n = make_normalizer(sub, where)) parts.push_back(std::move(n));
    }
    return std::make_unique<SequenceNormalizer>(std::move(parts));
  }
  if (type == "Prepend") return std::make_unique<PrependNormalizer>(json_string(spec, "prepend", where));
  if (type == "Replace") {
    return std::make_unique<ReplaceNormalizer>(json_pattern(spec, where + ": normalizer Replace"),
                                               json_string(spec, "content", where));
  }
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "Strip") {
    return std::make_unique<StripNormalizer>(json_bool(spec, "strip_left", where, true),
                                             json_bool(spec, "strip_right", where, true));
  }
  // The same flags as utf8proc's own utf8proc_NFC/NFD/NFKC/NFKD, on a length instead of a NUL.
  const auto stable = static_cast<int>(UTF8PROC_STABLE);
  if (type == "NFC") return std::make_unique<UnicodeNormalForm>(type, utf8proc_option_t(stable | UTF8PROC_COMPOSE));
  if (type == "NFD") return std::make_unique<UnicodeNormalForm>(type, utf8proc_option_t(stable | UTF8PROC_DECOMPOSE));
  if (type == "NFKC") {
    return std::make_unique<UnicodeNormalForm>(type, utf8proc_option_t(stable | UTF8PROC_COMPOSE | UTF8PROC_COMPAT));
  }
  if (type == "NFKD") {
    return std::make_unique<UnicodeNormalForm>(type, utf8proc_option_t(stable | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT));
  }
  fail(where, ": unsupported normalizer type '", type, "'");
}

}  // namespace specdec
