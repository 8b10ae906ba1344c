#ifndef BIGMAC_CORE_CONFIG_ERRORS_H_
#define BIGMAC_CORE_CONFIG_ERRORS_H_

#include <stdexcept>
#include <string>
#include <vector>

namespace bigmac::config {

// A configuration the program refuses to run with. It carries every problem found, each one
// naming the fields, their values and the rule, so the user can fix them all in one go.
// The command-line entry turns it into exit code 2 (docs/exit_codes.md).
class ConfigError : public std::runtime_error {
 public:
  explicit ConfigError(std::vector<std::string> problems);
  const std::vector<std::string>& problems() const { return problems_; }

 private:
  std::vector<std::string> problems_;
};

}  // namespace bigmac::config

#endif  // BIGMAC_CORE_CONFIG_ERRORS_H_
