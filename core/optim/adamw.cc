#include "core/optim/adamw.h"

#include <cmath>

namespace bigmac::optim {

void AdamW::InitState(const std::vector<layer::Param*>& params) {
  for (layer::Param* param : params) {
    State& state = state_[param];
    if (state.m.empty()) {
      state.m = param->value.Clone();
      state.m.Zero();
      state.v = state.m.Clone();
    }
  }
}

void AdamW::Step(const std::vector<layer::Param*>& params, double lr, int64_t step) {
  const double bias1 = 1 - std::pow(options_.beta1, double(step));
  const double bias2 = 1 - std::pow(options_.beta2, double(step));
  InitState(params);
  for (layer::Param* param : params) {
    State& state = state_[param];
    device::AdamWArgs args;
    args.p = param->value.raw();
    args.g = param->grad.raw();
    args.m = state.m.raw();
    args.v = state.v.raw();
    args.n = param->value.numel();
    args.dtype = param->value.dtype();
    args.lr = lr;
    args.beta1 = options_.beta1;
    args.beta2 = options_.beta2;
    args.eps = options_.eps;
    args.weight_decay = param->weight_decay ? options_.weight_decay : 0.0;
    args.bias_correction1 = bias1;
    args.bias_correction2 = bias2;
    // The bf16 compute copy is written in the same pass (what RefreshComputeCopy would write).
    const bool fused_copy = !param->compute.empty() && args.dtype == memory::DType::kF32;
    if (fused_copy) args.compute_bf16 = param->compute.raw();
    param->value.device()->AdamWUpdate(args);
    if (fused_copy) {
      ++param->compute_version;
    } else {
      layer::RefreshComputeCopy(param);
    }
  }
}

void AdamW::SetState(const layer::Param* param, memory::Tensor m, memory::Tensor v) {
  State& state = state_[param];
  state.m = std::move(m);
  state.v = std::move(v);
}

const memory::Tensor* AdamW::FirstMoment(const layer::Param* param) const {
  auto it = state_.find(param);
  return it == state_.end() ? nullptr : &it->second.m;
}

const memory::Tensor* AdamW::SecondMoment(const layer::Param* param) const {
  auto it = state_.find(param);
  return it == state_.end() ? nullptr : &it->second.v;
}

double LearningRate(const LrSchedule& s, int64_t step) {
  if (step < s.warmup_steps) return s.lr * double(step + 1) / double(s.warmup_steps);
  const double span = double(std::max<int64_t>(1, s.max_steps - s.warmup_steps));
  const double progress = std::min(1.0, double(step - s.warmup_steps) / span);
  return s.min_lr + 0.5 * (1.0 + std::cos(M_PI * progress)) * (s.lr - s.min_lr);
}

double GlobalGradNorm(const std::vector<layer::Param*>& params) {
  double sum = 0;
  for (const layer::Param* param : params) {
    sum += param->grad.device()->SumSquares(param->grad.raw(), param->grad.dtype(),
                                            param->grad.numel());
  }
  return std::sqrt(sum);
}

void ScaleGradients(const std::vector<layer::Param*>& params, double factor) {
  for (layer::Param* param : params) {
    param->grad.device()->Scale(param->grad.raw(), param->grad.dtype(), param->grad.numel(),
                                factor);
  }
}

bool AllFinite(const memory::Tensor& tensor) {
  return tensor.device()->AllFinite(tensor.raw(), tensor.dtype(), tensor.numel());
}

}  // namespace bigmac::optim
