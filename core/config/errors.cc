#include "core/config/errors.h"

#include <utility>

#include "core/util/format.h"

namespace bigmac::config {

namespace {

// Messages quote what the user wrote, which may be binary garbage.
std::vector<std::string> Printable(std::vector<std::string> problems) {
  for (std::string& problem : problems) problem = util::Printable(problem);
  return problems;
}

}  // namespace

ConfigError::ConfigError(std::vector<std::string> problems)
    : std::runtime_error(util::Join(Printable(problems), "\n")),
      problems_(Printable(std::move(problems))) {}

}  // namespace bigmac::config
