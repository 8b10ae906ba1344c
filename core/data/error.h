#ifndef BIGMAC_CORE_DATA_ERROR_H_
#define BIGMAC_CORE_DATA_ERROR_H_

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include "core/util/files.h"

namespace bigmac::data {

// A data file that cannot be used; the message names the file and the problem (exit code 5).
class DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The checked opener (util::OpenUserFile) for data files, whose problems are DataErrors: an open
// descriptor of the regular file `path` (the caller closes it), of at most `max_bytes`; *size
// its size. `what` names its role ("token file").
inline int OpenDataFile(const std::string& path, const std::string& what, uint64_t* size,
                        uint64_t max_bytes = std::numeric_limits<uint64_t>::max()) {
  int fd = -1;
  if (std::string problem = util::OpenUserFile(path, max_bytes, what, &fd, size);
      !problem.empty()) {
    throw DataError(problem);
  }
  return fd;
}

// The whole of the data file `path`, read through the checked opener. Throws DataError.
inline std::string ReadDataFile(const std::string& path, const std::string& what,
                                uint64_t max_bytes) {
  std::string bytes;
  if (std::string problem = util::ReadUserFile(path, max_bytes, what, &bytes); !problem.empty())
    throw DataError(problem);
  return bytes;
}

}  // namespace bigmac::data

#endif  // BIGMAC_CORE_DATA_ERROR_H_
