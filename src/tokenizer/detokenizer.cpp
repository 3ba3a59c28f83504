// IncrementalDecoder: streams text as ids arrive. Each push decodes a short window — the ids of
// the previous emission (context, so decoders that look at neighbours or strip the first space
// behave as in a full decode) plus the ids since — and emits the part beyond the context's text,
// unless it ends in U+FFFD (an unfinished UTF-8 character, held back until completed or flushed).
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace specdec {
namespace {

size_t common_prefix(std::string_view a, std::string_view b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

}  // namespace

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special)
    : tokenizer_(tokenizer), skip_special_(skip_special) {}

std::string IncrementalDecoder::push(int32_t id) {
  // A skipped special token adds no text and changes nothing the ids around it decode to (the
  // decoder drops it first): it is not kept, or a run of them would be decoded again at every
  // push. (An id that decodes to nothing alone, like a leading metaspace, may still count.)
  if (skip_special_ && tokenizer_.is_special(id)) return {};
  ids_.push_back(id);
  const std::span<const int32_t> all(ids_);
  const std::string context = tokenizer_.decode(all.subspan(prefix_, read_ - prefix_), skip_special_);
  const std::string text = tokenizer_.decode(all.subspan(prefix_), skip_special_);
  if (text.size() <= context.size() || utf8::ends_with_replacement(text) || !text.starts_with(context)) return {};
  std::string out = text.substr(context.size());
  // The new ids become the next context; older ids are no longer needed.
  ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(read_));
  prefix_ = 0;
  read_ = ids_.size();
  return out;
}

std::string IncrementalDecoder::flush() {
  const std::span<const int32_t> all(ids_);
  const std::string context = tokenizer_.decode(all.subspan(prefix_, read_ - prefix_), skip_special_);
  const std::string text = tokenizer_.decode(all.subspan(prefix_), skip_special_);
  std::string out = text.substr(common_prefix(context, text));
  ids_.clear();
  prefix_ = 0;
  read_ = 0;
  return out;
}

}  // namespace specdec
