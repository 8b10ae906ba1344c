#ifndef BIGMAC_CORE_DATA_ERROR_H_
#define BIGMAC_CORE_DATA_ERROR_H_

#include <stdexcept>

namespace bigmac::data {

// A data file that cannot be used; the message names the file and the problem (exit code 5).
class DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace bigmac::data

#endif  // BIGMAC_CORE_DATA_ERROR_H_
