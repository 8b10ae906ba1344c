#include "core/optim/adamw.h"

#include <cmath>

#include "core/util/simd.h"

namespace bigmac::optim {
namespace {

// The arithmetic is in T (float for training, as PyTorch's AdamW; double for the checks), with
// the step's scalars rounded to T once, so the loop vectorises fully.
template <typename T>
BIGMAC_SIMD_CLONES void UpdateTyped(T* p, const T* g, T* m, T* v, int64_t n, double lr, double b1,
                                    double b2, double eps, double wd, double bias1, double bias2) {
  const T beta1 = static_cast<T>(b1), one_minus_beta1 = static_cast<T>(1 - b1);
  const T beta2 = static_cast<T>(b2), one_minus_beta2 = static_cast<T>(1 - b2);
  const T inv_bias1 = static_cast<T>(1 / bias1), inv_bias2 = static_cast<T>(1 / bias2);
  const T step = static_cast<T>(lr), decay = static_cast<T>(wd), epsilon = static_cast<T>(eps);
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    m[i] = beta1 * m[i] + one_minus_beta1 * g[i];
    v[i] = beta2 * v[i] + one_minus_beta2 * g[i] * g[i];
    const T m_hat = m[i] * inv_bias1;
    const T v_hat = v[i] * inv_bias2;
    p[i] = p[i] - step * (m_hat / (std::sqrt(v_hat) + epsilon) + decay * p[i]);
  }
}

template <typename T>
double SumSquares(const T* g, int64_t n) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += double(g[i]) * g[i];
  return sum;
}

}  // namespace

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
    const double wd = param->weight_decay ? options_.weight_decay : 0.0;
    const int64_t n = param->value.numel();
    if (param->value.dtype() == memory::DType::kF64) {
      UpdateTyped(param->value.data<double>(), param->grad.data<double>(), state.m.data<double>(),
                  state.v.data<double>(), n, lr, options_.beta1, options_.beta2, options_.eps, wd,
                  bias1, bias2);
    } else {
      UpdateTyped(param->value.data<float>(), param->grad.data<float>(), state.m.data<float>(),
                  state.v.data<float>(), n, lr, options_.beta1, options_.beta2, options_.eps, wd,
                  bias1, bias2);
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
    sum += param->grad.dtype() == memory::DType::kF64
               ? SumSquares(param->grad.data<double>(), param->grad.numel())
               : SumSquares(param->grad.data<float>(), param->grad.numel());
  }
  return std::sqrt(sum);
}

void ScaleGradients(const std::vector<layer::Param*>& params, double factor) {
  for (layer::Param* param : params) {
    const int64_t n = param->grad.numel();
    if (param->grad.dtype() == memory::DType::kF64) {
      double* g = param->grad.data<double>();
      for (int64_t i = 0; i < n; ++i) g[i] *= factor;
    } else {
      float* g = param->grad.data<float>();
      const float f = static_cast<float>(factor);
      for (int64_t i = 0; i < n; ++i) g[i] *= f;
    }
  }
}

bool AllFinite(const memory::Tensor& tensor) {
  if (tensor.dtype() == memory::DType::kF64) {
    const double* v = tensor.data<double>();
    for (int64_t i = 0; i < tensor.numel(); ++i) {
      if (!std::isfinite(v[i])) return false;
    }
  } else {
    const float* v = tensor.data<float>();
    for (int64_t i = 0; i < tensor.numel(); ++i) {
      if (!std::isfinite(v[i])) return false;
    }
  }
  return true;
}

}  // namespace bigmac::optim
