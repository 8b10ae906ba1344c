#ifndef BIGMAC_CORE_OPTIM_ADAMW_H_
#define BIGMAC_CORE_OPTIM_ADAMW_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/layer/layer.h"

namespace bigmac::optim {

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;  // decoupled; only for params with weight_decay set
};

// AdamW (Loshchilov & Hutter) with bias correction:
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   p -= lr * ( (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps) + wd * p )
// State tensors come from the parameters' allocator, so they count against device memory.
class AdamW {
 public:
  explicit AdamW(const AdamWOptions& options) : options_(options) {}

  // `step` is 1-based. Tied copies must not be passed (their owner is updated instead). Each
  // parameter's compute copy is refreshed from the updated master. The arithmetic runs on the
  // parameters' device.
  void Step(const std::vector<layer::Param*>& params, double lr, int64_t step);

  // Creates zero moments for every parameter that has none yet: the persistent buffers are then
  // allocated before the first step, which leaves the steps themselves to the allocator's cache.
  void InitState(const std::vector<layer::Param*>& params);

  // Restores `param`'s moments (from a checkpoint); they must have the parameter's shape.
  void SetState(const layer::Param* param, memory::Tensor m, memory::Tensor v);

  // The moment tensors of `param` (for checkpoints and tests); null before its first step.
  const memory::Tensor* FirstMoment(const layer::Param* param) const;
  const memory::Tensor* SecondMoment(const layer::Param* param) const;

 private:
  struct State {
    memory::Tensor m;
    memory::Tensor v;
  };
  AdamWOptions options_;
  std::map<const layer::Param*, State> state_;
};

struct LrSchedule {
  double lr = 1e-3;
  double min_lr = 1e-4;
  int64_t warmup_steps = 0;
  int64_t max_steps = 1;
};

// Linear warm-up from lr/warmup to lr over `warmup_steps`, then cosine decay to min_lr at
// max_steps. `step` is 0-based.
double LearningRate(const LrSchedule& schedule, int64_t step);

// sqrt(sum of squared gradients), accumulated in double in a fixed order.
double GlobalGradNorm(const std::vector<layer::Param*>& params);
void ScaleGradients(const std::vector<layer::Param*>& params, double factor);
// Whether every gradient element is finite.
bool AllFinite(const memory::Tensor& tensor);

}  // namespace bigmac::optim

#endif  // BIGMAC_CORE_OPTIM_ADAMW_H_
