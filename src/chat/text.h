// Python's str operations on UTF-8 text, shared by string methods and filters.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace specdec::chat {

// str.strip/lstrip/rstrip: `chars` unset strips whitespace.
std::string strip(const std::string& s, const std::optional<std::string>& chars, bool left, bool right);
// str.split: without `sep`, runs of whitespace separate and empty parts are dropped.
std::vector<std::string> split(const std::string& s, const std::optional<std::string>& sep, int64_t maxsplit,
                               bool from_right = false);
std::string replace_all(const std::string& s, const std::string& from, const std::string& to, int64_t count = -1);
std::string to_upper(std::string s);
std::string to_lower(std::string s);
std::string title_case(const std::string& s);
std::string capitalize(const std::string& s);
std::string html_escape(const std::string& s);

}  // namespace specdec::chat
