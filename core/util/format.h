#ifndef BIGMAC_CORE_UTIL_FORMAT_H_
#define BIGMAC_CORE_UTIL_FORMAT_H_

#include <cstdio>
#include <string>
#include <vector>

namespace bigmac::util {

// printf-style formatting into a std::string (for log and report lines).
template <typename... Args>
std::string Format(const char* format, Args... args) {
  const int size = std::snprintf(nullptr, 0, format, args...);
  std::string text(size > 0 ? size : 0, '\0');
  std::snprintf(text.data(), text.size() + 1, format, args...);
  return text;
}

// The parts with `separator` between them.
inline std::string Join(const std::vector<std::string>& parts, const std::string& separator) {
  std::string text;
  for (size_t i = 0; i < parts.size(); ++i) text += (i ? separator : "") + parts[i];
  return text;
}

// `text` safe to print on a terminal: control bytes and bytes that are not UTF-8 become \xNN,
// so a message quoting a binary file cannot move the cursor or ring the bell.
inline std::string Printable(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    size_t length = c < 0x80           ? 1
                    : (c >> 5) == 0x6  ? 2
                    : (c >> 4) == 0xE  ? 3
                    : (c >> 3) == 0x1E ? 4
                                       : 0;
    for (size_t k = 1; k < length; ++k) {
      if (i + k >= text.size() || (static_cast<unsigned char>(text[i + k]) >> 6) != 0x2) length = 0;
    }
    if (length == 0 || (length == 1 && (c < 0x20 || c == 0x7f))) {
      out += Format("\\x%02x", c);
      ++i;
    } else {
      out.append(text, i, length);
      i += length;
    }
  }
  return out;
}

}  // namespace bigmac::util

#endif  // BIGMAC_CORE_UTIL_FORMAT_H_
