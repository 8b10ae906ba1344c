#ifndef BIGMAC_CORE_OPTIM_ADAMW_H_
#define BIGMAC_CORE_OPTIM_ADAMW_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
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
  // parameters' device. Each gradient is read as grad * grad_scale (the gradient clip's factor;
  // device::AdamWArgs) and is left as it was.
  void Step(const std::vector<layer::Param*>& params, double lr, int64_t step,
            double grad_scale = 1);

  // Creates zero moments for every parameter that has none yet: the persistent buffers are then
  // allocated before the first step, which leaves the steps themselves to the allocator's cache.
  void InitState(const std::vector<layer::Param*>& params);

  // ZeRO-1 (docs/zero.md): `param` gets zero moments for its elements [begin, begin + length)
  // only (none if length is 0), and Step updates those elements only; the rest of its master and
  // compute copy are another rank's to update. Call before any other state exists for it.
  void InitSliceState(const layer::Param* param, int64_t begin, int64_t length);

  // The moment tensors a checkpoint is read into: `param`'s own, created (zero) as InitState
  // would if it has none yet. With slice state they hold elements [StateBegin, StateBegin + numel)
  // of the parameter, and are null for an empty slice. Owned by this object.
  std::pair<memory::Tensor*, memory::Tensor*> MomentsToLoad(layer::Param* param);

  // The moment tensors of `param` (for checkpoints and tests); null before its first step. For
  // slice state they hold elements [StateBegin, StateBegin + numel) of the parameter (and are
  // null for an empty slice).
  const memory::Tensor* FirstMoment(const layer::Param* param) const;
  const memory::Tensor* SecondMoment(const layer::Param* param) const;
  bool HasSliceState(const layer::Param* param) const;
  int64_t StateBegin(const layer::Param* param) const;
  // Elements with moments on this rank (each has two fp32 moments).
  int64_t StateElements() const;

 private:
  struct State {
    memory::Tensor m;
    memory::Tensor v;
    int64_t begin = 0;   // the first element the moments cover
    bool slice = false;  // ZeRO-1: m and v cover a slice of the parameter (maybe empty)
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
// Whether every gradient element is finite.
bool AllFinite(const memory::Tensor& tensor);

}  // namespace bigmac::optim

#endif  // BIGMAC_CORE_OPTIM_ADAMW_H_
