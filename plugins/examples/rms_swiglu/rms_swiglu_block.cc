// An example layer plugin: a LLaMA-style transformer block, built as a shared library and loaded
// with `bigmac train --plugin librms_swiglu.so`. It registers `rms_swiglu_block`:
//   r = x + proj(attention(qkv(rmsnorm1(x))))        (no biases)
//   y = r + down(silu(gate(rmsnorm2(r))) * up(rmsnorm2(r)))
// It builds against the plugin headers and the SDK only (plugins/sdk: CpuLayer, FillNormal, the
// public CPU kernels for matmul and attention) and brings its own RMSNorm and SwiGLU kernels
// (rms_swiglu_kernels.h). docs/plugins.md walks through it.
#include <cmath>

#include "plugins/bigmac_plugin.h"
#include "plugins/examples/rms_swiglu/rms_swiglu_kernels.h"
#include "plugins/sdk/cpu_kernels.h"
#include "plugins/sdk/cpu_layer.h"
#include "plugins/sdk/init.h"

namespace rms_swiglu {
namespace {

using bigmac::sdk::LayerSpec;
using bigmac::sdk::MicroBatch;
using bigmac::sdk::Param;
using bigmac::sdk::Saved;
using bigmac::sdk::Tensor;
namespace cpu = bigmac::sdk::cpu;

// The SwiGLU width: two thirds of GPT's 4C (same parameter count as a GELU MLP), rounded up to 8.
int FfnWidth(int c) { return (8 * c / 3 + 7) / 8 * 8; }

template <typename T>
class RmsSwigluBlock : public bigmac::sdk::CpuLayer<T> {
  using Base = bigmac::sdk::CpuLayer<T>;
  enum SavedIndex {
    kX,
    kRstd1,
    kN1,
    kQkv,
    kAtt,
    kAtty,
    kR,
    kRstd2,
    kN2,
    kGate,
    kUp,
    kH,
    kForwardCount
  };
  // Appended by BackwardInput for BackwardWeight.
  enum GradIndex { kDy = kForwardCount, kDGate, kDUp, kDN2, kDR, kDQkv, kDN1 };

 public:
  explicit RmsSwigluBlock(const LayerSpec& spec) : Base(spec) {
    const int c = this->C();
    if (c % spec.dims.num_heads != 0) {
      throw std::invalid_argument("rms_swiglu_block: hidden_size " + std::to_string(c) +
                                  " not divisible by num_heads " +
                                  std::to_string(spec.dims.num_heads));
    }
    f_ = FfnWidth(c);
    norm1_ = this->AddParam("norm1.weight", {c}, false);
    qkv_ = this->AddParam("attn.qkv.weight", {3 * c, c}, true);
    proj_ = this->AddParam("attn.proj.weight", {c, c}, true);
    norm2_ = this->AddParam("norm2.weight", {c}, false);
    gate_ = this->AddParam("mlp.gate.weight", {f_, c}, true);
    up_ = this->AddParam("mlp.up.weight", {f_, c}, true);
    down_ = this->AddParam("mlp.down.weight", {c, f_}, true);
  }

  void InitParams(uint64_t seed) override {
    const double residual_std = 0.02 / std::sqrt(2.0 * this->spec_.dims.num_layers);
    for (Param& param : this->params_) {
      if (param.name.rfind("norm", 0) == 0) {
        bigmac::sdk::FillConstant(&param.value, 1.0);
      } else {
        const bool residual = param.name == "attn.proj.weight" || param.name == "mlp.down.weight";
        bigmac::sdk::FillNormal(&param.value, residual ? residual_std : 0.02, seed,
                                this->layer_id(), param.name);
      }
    }
  }

  void Forward(const MicroBatch& mb, const Tensor& x, Tensor* y, Saved* saved) override {
    const int n = mb.batch * mb.seq;
    const int c = this->C();
    const int h = this->spec_.dims.num_heads;
    auto& s = saved->tensors;
    saved->Clear();
    s.resize(kForwardCount);
    s[kX] = x.Clone();
    s[kRstd1] = this->New({n});
    s[kN1] = this->New({n, c});
    RmsNormForward(D(s[kN1]), D(s[kRstd1]), D(s[kX]), this->W(norm1_), n, c);
    s[kQkv] = this->New({n, 3 * c});
    cpu::MatmulForward<T>(D(s[kQkv]), D(s[kN1]), this->W(qkv_), nullptr, n, c, 3 * c);
    s[kAtt] = this->New({mb.batch, h, mb.seq, mb.seq});
    s[kAtty] = this->New({n, c});
    cpu::AttentionForward(D(s[kAtty]), D(s[kAtt]), D(s[kQkv]), mb.batch, mb.seq, c, h);
    s[kR] = this->New({n, c});
    cpu::MatmulForward<T>(D(s[kR]), D(s[kAtty]), this->W(proj_), nullptr, n, c, c);
    cpu::AddInPlace(D(s[kR]), D(s[kX]), int64_t{n} * c);
    s[kRstd2] = this->New({n});
    s[kN2] = this->New({n, c});
    RmsNormForward(D(s[kN2]), D(s[kRstd2]), D(s[kR]), this->W(norm2_), n, c);
    s[kGate] = this->New({n, f_});
    s[kUp] = this->New({n, f_});
    s[kH] = this->New({n, f_});
    cpu::MatmulForward<T>(D(s[kGate]), D(s[kN2]), this->W(gate_), nullptr, n, c, f_);
    cpu::MatmulForward<T>(D(s[kUp]), D(s[kN2]), this->W(up_), nullptr, n, c, f_);
    SwigluForward(D(s[kH]), D(s[kGate]), D(s[kUp]), int64_t{n} * f_);
    *y = this->NewActivation(mb.batch, mb.seq, c);
    cpu::MatmulForward<T>(D(*y), D(s[kH]), this->W(down_), nullptr, n, f_, c);
    cpu::AddInPlace(D(*y), D(s[kR]), int64_t{n} * c);
  }

  void BackwardInput(const MicroBatch& mb, const Tensor& dy, Tensor* dx, Saved* saved) override {
    const int n = mb.batch * mb.seq;
    const int c = this->C();
    auto& s = saved->tensors;
    s.resize(kDN1 + 1);
    s[kDy] = dy.Clone();
    // MLP.
    Tensor dh = this->New({n, f_});
    cpu::MatmulBackwardInput<T>(D(dh), D(dy), this->W(down_), n, f_, c);
    s[kDGate] = this->New({n, f_});
    s[kDUp] = this->New({n, f_});
    SwigluBackward(D(s[kDGate]), D(s[kDUp]), D(dh), D(s[kGate]), D(s[kUp]), int64_t{n} * f_);
    s[kDN2] = this->New({n, c});
    cpu::MatmulBackwardInput<T>(D(s[kDN2]), D(s[kDGate]), this->W(gate_), n, c, f_);
    Tensor dn2_up = this->New({n, c});
    cpu::MatmulBackwardInput<T>(D(dn2_up), D(s[kDUp]), this->W(up_), n, c, f_);
    cpu::AddInPlace(D(s[kDN2]), D(dn2_up), int64_t{n} * c);
    s[kDR] = dy.Clone();
    RmsNormBackwardInput(D(s[kDR]), D(s[kDN2]), D(s[kR]), this->W(norm2_), D(s[kRstd2]), n, c);
    // Attention.
    Tensor datty = this->New({n, c});
    cpu::MatmulBackwardInput<T>(D(datty), D(s[kDR]), this->W(proj_), n, c, c);
    s[kDQkv] = this->New({n, 3 * c});
    cpu::AttentionBackward(D(s[kDQkv]), D(datty), D(s[kQkv]), D(s[kAtt]), mb.batch, mb.seq, c,
                           this->spec_.dims.num_heads);
    s[kAtt] = Tensor();
    s[kQkv] = Tensor();
    s[kDN1] = this->New({n, c});
    cpu::MatmulBackwardInput<T>(D(s[kDN1]), D(s[kDQkv]), this->W(qkv_), n, c, 3 * c);
    if (dx != nullptr) {
      *dx = s[kDR].Clone();
      RmsNormBackwardInput(D(*dx), D(s[kDN1]), D(s[kX]), this->W(norm1_), D(s[kRstd1]), n, c);
    }
  }

  void BackwardWeight(const MicroBatch& mb, Saved* saved) override {
    const int n = mb.batch * mb.seq;
    const int c = this->C();
    auto& s = saved->tensors;
    cpu::MatmulBackwardWeight<T>(this->G(down_), nullptr, D(s[kDy]), D(s[kH]), n, f_, c);
    cpu::MatmulBackwardWeight<T>(this->G(gate_), nullptr, D(s[kDGate]), D(s[kN2]), n, c, f_);
    cpu::MatmulBackwardWeight<T>(this->G(up_), nullptr, D(s[kDUp]), D(s[kN2]), n, c, f_);
    RmsNormBackwardWeight(this->G(norm2_), D(s[kDN2]), D(s[kR]), D(s[kRstd2]), n, c);
    cpu::MatmulBackwardWeight<T>(this->G(proj_), nullptr, D(s[kDR]), D(s[kAtty]), n, c, c);
    cpu::MatmulBackwardWeight<T>(this->G(qkv_), nullptr, D(s[kDQkv]), D(s[kN1]), n, c, 3 * c);
    RmsNormBackwardWeight(this->G(norm1_), D(s[kDN1]), D(s[kX]), D(s[kRstd1]), n, c);
    saved->Clear();
  }

  int64_t ForwardFlops(int batch, int seq) const override {
    const int64_t n = int64_t{batch} * seq;
    const int64_t c = this->C();
    // qkv, proj, gate, up, down; attention scores and their weighted sum.
    return 2 * n * (3 * c * c + c * c + 3 * c * f_) + 4 * int64_t{batch} * seq * seq * c;
  }

  int64_t ActivationBytes(int batch, int seq) const override {
    const int64_t n = int64_t{batch} * seq;
    const int64_t c = this->C();
    const int64_t elements =
        n * (8 * c + 2 + 3 * f_) + int64_t{batch} * this->spec_.dims.num_heads * seq * seq;
    return elements * static_cast<int64_t>(sizeof(T));
  }

 private:
  static T* D(Tensor& tensor) { return tensor.data<T>(); }
  static const T* D(const Tensor& tensor) { return tensor.data<T>(); }

  int f_ = 0;
  int norm1_, qkv_, proj_, norm2_, gate_, up_, down_;
};

bool RegisterLayers(bigmac_registry* registry) {
  return bigmac::plugin::RegisterLayer(registry, "rms_swiglu_block", "cpu",
                                       &bigmac::plugin::DTypeFactory<RmsSwigluBlock>);
}

}  // namespace
}  // namespace rms_swiglu

BIGMAC_PLUGIN(rms_swiglu::RegisterLayers)
