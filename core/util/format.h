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

}  // namespace bigmac::util

#endif  // BIGMAC_CORE_UTIL_FORMAT_H_
