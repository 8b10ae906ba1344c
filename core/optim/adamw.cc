#include "core/optim/adamw.h"

#include <cmath>
#include <stdexcept>
#include <utility>

namespace bigmac::optim {

void AdamW::InitState(const std::vector<layer::Param*>& params) {
  for (layer::Param* param : params) {
    State& state = state_[param];
    if (state.m.empty() && !state.slice) {
      state.m = param->value.Clone();
      state.m.Zero();
      state.v = state.m.Clone();
    }
  }
}

void AdamW::Step(const std::vector<layer::Param*>& params, double lr, int64_t step,
                 double grad_scale) {
  const double bias1 = 1 - std::pow(options_.beta1, double(step));
  const double bias2 = 1 - std::pow(options_.beta2, double(step));
  InitState(params);
  for (layer::Param* param : params) {
    State& state = state_[param];
    if (state.slice && state.m.empty()) continue;  // another rank's elements only
    // The elements [begin, begin + n) the moments cover: all of them unless a slice.
    const int64_t begin = state.begin;
    auto at = [begin](auto* data, memory::DType dtype) {
      return static_cast<char*>(data) + begin * memory::DTypeSize(dtype);
    };
    device::AdamWArgs args;
    args.p = at(param->value.raw(), param->value.dtype());
    args.g = at(param->grad.raw(), param->grad.dtype());
    args.m = state.m.raw();
    args.v = state.v.raw();
    args.n = state.m.numel();
    args.dtype = param->value.dtype();
    args.lr = lr;
    args.beta1 = options_.beta1;
    args.beta2 = options_.beta2;
    args.eps = options_.eps;
    args.weight_decay = param->weight_decay ? options_.weight_decay : 0.0;
    args.bias_correction1 = bias1;
    args.bias_correction2 = bias2;
    args.grad_scale = grad_scale;
    // The bf16 compute copy is written in the same pass (what RefreshComputeCopy would write).
    // (For a slice, the whole compute copy is refreshed after the all-gather: ZeroShards.)
    const bool fused_copy =
        !state.slice && !param->compute.empty() && args.dtype == memory::DType::kF32;
    if (fused_copy) args.compute_bf16 = param->compute.raw();
    param->value.device()->AdamWUpdate(args);
    if (state.slice) continue;
    if (fused_copy) {
      ++param->compute_version;
    } else {
      layer::RefreshComputeCopy(param);
    }
  }
}

void AdamW::InitSliceState(const layer::Param* param, int64_t begin, int64_t length) {
  if (state_.count(param))
    throw std::logic_error("AdamW: " + param->name + " already has optimizer state");
  State& state = state_[param];
  state.slice = true;
  state.begin = begin;
  if (length == 0) return;
  state.m = memory::Tensor(param->value.device(), {length}, param->value.dtype());
  state.m.Zero();
  state.v = state.m.Clone();
}

std::pair<memory::Tensor*, memory::Tensor*> AdamW::MomentsToLoad(layer::Param* param) {
  InitState({param});
  State& state = state_[param];
  if (state.m.empty()) return {nullptr, nullptr};  // an empty slice
  return {&state.m, &state.v};
}

bool AdamW::HasSliceState(const layer::Param* param) const {
  auto it = state_.find(param);
  return it != state_.end() && it->second.slice;
}

int64_t AdamW::StateBegin(const layer::Param* param) const {
  auto it = state_.find(param);
  return it == state_.end() ? 0 : it->second.begin;
}

int64_t AdamW::StateElements() const {
  int64_t count = 0;
  for (const auto& [param, state] : state_) count += state.m.numel();
  return count;
}

const memory::Tensor* AdamW::FirstMoment(const layer::Param* param) const {
  auto it = state_.find(param);
  return it == state_.end() || it->second.m.empty() ? nullptr : &it->second.m;
}

const memory::Tensor* AdamW::SecondMoment(const layer::Param* param) const {
  auto it = state_.find(param);
  return it == state_.end() || it->second.v.empty() ? nullptr : &it->second.v;
}

double LearningRate(const LrSchedule& s, int64_t step) {
  if (step < s.warmup_steps) return s.lr * double(step + 1) / double(s.warmup_steps);
  const double span = double(std::max<int64_t>(1, s.max_steps - s.warmup_steps));
  const double progress = std::min(1.0, double(step - s.warmup_steps) / span);
  return s.min_lr + 0.5 * (1.0 + std::cos(M_PI * progress)) * (s.lr - s.min_lr);
}

double GlobalGradNorm(const std::vector<layer::Param*>& params) {
  if (params.empty()) return 0;
  std::vector<device::Device::Region> regions;
  for (const layer::Param* param : params) {
    regions.push_back({param->grad.raw(), param->grad.dtype(), param->grad.numel()});
  }
  // A rank's parameters share its device. Added in parameter order, as before.
  double sum = 0;
  for (double part : params.front()->grad.device()->SumSquaresEach(regions)) sum += part;
  return std::sqrt(sum);
}

bool AllFinite(const memory::Tensor& tensor) {
  return tensor.device()->AllFinite(tensor.raw(), tensor.dtype(), tensor.numel());
}

}  // namespace bigmac::optim
