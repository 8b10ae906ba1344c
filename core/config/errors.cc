#include "core/config/errors.h"

#include <utility>

namespace bigmac::config {
namespace {

std::string JoinProblems(const std::vector<std::string>& problems) {
  std::string text;
  for (const std::string& problem : problems) {
    if (!text.empty()) text += "\n";
    text += problem;
  }
  return text;
}

}  // namespace

ConfigError::ConfigError(std::vector<std::string> problems)
    : std::runtime_error(JoinProblems(problems)), problems_(std::move(problems)) {}

}  // namespace bigmac::config
