// UTF-8 helpers shared by the tokenizer: code point iteration, validation, Rust-compatible lossy
// decoding (String::from_utf8_lossy), Unicode whitespace and the GPT-2 byte <-> char map.
// One home for byte-level text rules so normalisers, pre-tokenisers and decoders agree.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace specdec::utf8 {

inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Byte length of the character whose lead byte is `lead` (1 for invalid lead bytes).
size_t char_len(unsigned char lead);

// Decodes the character at s[i]; `s` must be valid UTF-8 there. Sets *len to its byte length.
char32_t decode_at(std::string_view s, size_t i, size_t* len);

void append(std::string& out, char32_t cp);

// Returns the byte offset of the first invalid sequence, or nullopt if `s` is valid UTF-8.
std::optional<size_t> first_invalid(std::string_view s);

// Exactly Rust's String::from_utf8_lossy: each maximal invalid subsequence (per the Unicode
// "maximal subpart" rule) becomes one U+FFFD.
std::string from_bytes_lossy(std::string_view bytes);

bool ends_with_replacement(std::string_view s);
bool is_ascii(std::string_view s);

// Unicode White_Space property (Rust's char::is_whitespace).
bool is_whitespace(char32_t cp);

// The GPT-2 byte-level alphabet: every byte maps to one printable code point.
struct ByteLevelAlphabet {
  std::array<std::string, 256> byte_to_utf8;  // byte -> UTF-8 of its printable stand-in
  std::array<char32_t, 256> byte_to_char;     // byte -> its stand-in code point (all < 0x800)
  std::array<int16_t, 512> char_to_byte;      // code point (< 512) -> byte, -1 if none
};
const ByteLevelAlphabet& byte_level_alphabet();

}  // namespace specdec::utf8
