#ifndef BIGMAC_STAGES_NUMERICS_H_
#define BIGMAC_STAGES_NUMERICS_H_

// The numeric constants of the layers, shared by the CPU kernels (stages/cpu) and the CUDA
// kernels (stages/cuda), so that the two backends compute the same function. Each backend
// rounds them to its compute type (T(k) on the CPU, static_cast<float>(k) on CUDA).

namespace bigmac::stages {

// LayerNorm: y = (x - mean) / sqrt(var + kLayerNormEpsilon) * weight + bias (GPT-2's 1e-5).
inline constexpr double kLayerNormEpsilon = 1e-5;

// GELU, tanh approximation: x * sigmoid(2u), u = sqrt(2/pi) (x + kGeluCubic x^3).
inline constexpr double kGeluCubic = 0.044715;

}  // namespace bigmac::stages

#endif  // BIGMAC_STAGES_NUMERICS_H_
