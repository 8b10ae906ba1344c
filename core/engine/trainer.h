#ifndef BIGMAC_CORE_ENGINE_TRAINER_H_
#define BIGMAC_CORE_ENGINE_TRAINER_H_

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/config/resolve.h"

namespace bigmac::engine {

// A non-finite loss or gradient; the message names the step and the layer.
class NumericalError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct TrainResult {
  std::vector<double> train_losses;                // per step, mean per token
  std::vector<std::pair<int, double>> val_losses;  // (step, mean per token)
  std::vector<double> final_parameters;            // every owned parameter, flattened (tests)
  int64_t peak_bytes = 0;
  int64_t parameter_count = 0;
};

// Single-rank training (pp = 1, dp = 1) with the CPU backend: AdamW with warm-up and cosine decay,
// global-norm clipping, NaN/Inf detection, validation every train.eval_interval steps. Prints a
// progress line every train.log_interval steps through `log`. Throws memory::OutOfMemoryError,
// data::DataError, NumericalError.
TrainResult TrainSingleRank(const config::ResolvedConfig& config,
                            const std::function<void(const std::string&)>& log);

}  // namespace bigmac::engine

#endif  // BIGMAC_CORE_ENGINE_TRAINER_H_
