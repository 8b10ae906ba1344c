#include "core/config/errors.h"

#include <utility>

#include "core/util/format.h"

namespace bigmac::config {

ConfigError::ConfigError(std::vector<std::string> problems)
    : std::runtime_error(util::Join(problems, "\n")), problems_(std::move(problems)) {}

}  // namespace bigmac::config
