// The weights' packed copies of BigMac's CPU GEMM (stages/cpu/gemm.cc, lever 22 in
// bench/NOTES.md): util::ConstantWeightsScope lists the weights that stay constant for a flush;
// while it lives the GEMMs that multiply by one of them pack it once and reuse the pack. Checked
// here: the scope's epochs and lookups; every kernel that multiplies by a weight gives the bits it
// gives without a scope, reuses the pack within a scope, and packs again in the next scope (the
// weights changed between them); a buffer the scope does not list, or lists with other bytes, is
// packed at every product, so a scratch matrix that changes inside a scope is read as it is now.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/util/constant_weights.h"
#include "plugins/sdk/cpu_kernels.h"
#include "stages/cpu/blocked_gemm.h"
#include "tests/testing/numeric.h"

namespace bigmac {
namespace {

using testutil::BitwiseEqual;
using testutil::Random;

TEST(ConstantWeightsScope, EpochsOnlyForTheListedWholeBuffersWhileItLives) {
  std::vector<float> w(100), v(50), other(10);
  const int64_t w_bytes = int64_t{100} * sizeof(float);
  EXPECT_EQ(util::ConstantWeightEpoch(w.data(), w_bytes), 0u) << "outside any scope";
  uint64_t first = 0;
  {
    util::ConstantWeightsScope scope({{v.data(), int64_t{50} * 4}, {w.data(), w_bytes}});
    first = util::ConstantWeightEpoch(w.data(), w_bytes);
    EXPECT_NE(first, 0u);
    EXPECT_EQ(util::ConstantWeightEpoch(v.data(), int64_t{50} * 4), first);
    EXPECT_EQ(util::ConstantWeightEpoch(w.data(), w_bytes - 4), 0u) << "a part of a weight";
    EXPECT_EQ(util::ConstantWeightEpoch(w.data() + 1, w_bytes - 4), 0u) << "inside a weight";
    EXPECT_EQ(util::ConstantWeightEpoch(other.data(), int64_t{10} * 4), 0u) << "not listed";
  }
  EXPECT_EQ(util::ConstantWeightEpoch(w.data(), w_bytes), 0u) << "after the scope";
  util::ConstantWeightsScope next({{w.data(), w_bytes}});
  EXPECT_GT(util::ConstantWeightEpoch(w.data(), w_bytes), first) << "each scope its own epoch";
}

// The weight products of the CPU kernels, each once: forward (w^T, bias or not), input gradient
// (w), and the fused GELU, residual and SwiGLU forms. Returns every output, concatenated.
std::vector<float> WeightProducts(const std::vector<float>& x, const std::vector<float>& w,
                                  const std::vector<float>& bias, int n, int c, int oc) {
  std::vector<float> out(int64_t{n} * oc), act(out.size()), dinp(int64_t{n} * c);
  std::vector<float> all;
  auto keep = [&all](const std::vector<float>& v) { all.insert(all.end(), v.begin(), v.end()); };
  sdk::cpu::MatmulForward(out.data(), x.data(), w.data(), bias.data(), n, c, oc);
  keep(out);
  sdk::cpu::MatmulForward(out.data(), x.data(), w.data(), static_cast<const float*>(nullptr), n, c,
                          oc);
  keep(out);
  const std::vector<float> dout = Random<float>(int64_t{n} * oc, 5);
  sdk::cpu::MatmulBackwardInput(dinp.data(), dout.data(), w.data(), n, c, oc);
  keep(dinp);
  sdk::cpu::MatmulGeluForward(out.data(), act.data(), x.data(), w.data(), bias.data(), n, c, oc);
  keep(out);
  keep(act);
  sdk::cpu::MatmulGeluBackwardInput(dinp.data(), dout.data(), w.data(), x.data(), n, c, oc);
  keep(dinp);
  const std::vector<float> residual = Random<float>(int64_t{n} * oc, 7);
  sdk::cpu::MatmulResidualForward(out.data(), x.data(), w.data(), bias.data(), residual.data(), n,
                                  c, oc);
  keep(out);
  // SwiGLU: w as gate_up (oc = 2 width rows of c) forward, as down (c rows of width) backward.
  const int width = oc / 2;
  std::vector<float> gate_up(int64_t{n} * oc), h(int64_t{n} * width), dh(int64_t{n} * width);
  std::vector<float> dgate_up(gate_up.size());
  sdk::cpu::MatmulSwigluForward(gate_up.data(), h.data(), x.data(), w.data(), n, c, width);
  keep(gate_up);
  keep(h);
  const int down_rows = static_cast<int>(w.size() / width);  // w as down: down_rows x width
  const std::vector<float> ddown = Random<float>(int64_t{n} * down_rows, 6);
  sdk::cpu::MatmulSwigluBackwardInput(dh.data(), dgate_up.data(), ddown.data(), w.data(),
                                      gate_up.data(), n, width, down_rows);
  keep(dh);
  keep(dgate_up);
  return all;
}

TEST(WeightPacks, SameBitsReusedWithinAScopePackedAgainInTheNext) {
  const char* library = sdk::cpu::FloatGemmLibrary();
  const bool blocked = library && std::string(library).rfind("bigmac", 0) == 0;
  // Rows that are not whole micro-tiles, a k of several blocks, columns not whole panels.
  const int n = 37, c = 600, oc = 260;
  const std::vector<float> x = Random<float>(int64_t{n} * c, 1);
  std::vector<float> w = Random<float>(int64_t{oc} * c, 2);
  const std::vector<float> bias = Random<float>(oc, 3);
  const std::vector<float> plain = WeightProducts(x, w, bias, n, c, oc);
  const std::pair<const void*, int64_t> listed{w.data(), int64_t(w.size() * sizeof(float))};

  // Three packs: w^T (the forward forms), w (the input gradients), w as SwiGLU's down.
  const int64_t products_before = sdk::cpu::internal::WholeBProductsRun();
  const int64_t packs_before = sdk::cpu::internal::WholeBPacksMade();
  {
    util::ConstantWeightsScope scope({listed});
    EXPECT_TRUE(BitwiseEqual(WeightProducts(x, w, bias, n, c, oc), plain)) << "first products";
    if (blocked) EXPECT_EQ(sdk::cpu::internal::WholeBPacksMade() - packs_before, 3);
    EXPECT_TRUE(BitwiseEqual(WeightProducts(x, w, bias, n, c, oc), plain)) << "from the packs";
    if (blocked) EXPECT_EQ(sdk::cpu::internal::WholeBPacksMade() - packs_before, 3) << "repacked";
  }
  if (blocked) {
    EXPECT_EQ(sdk::cpu::internal::WholeBProductsRun() - products_before, 16)
        << "every weight product of both rounds from a pack";
  }

  // The optimizer's step between two flushes: the next scope packs the new values.
  for (float& v : w) v *= -0.5f;
  const std::vector<float> changed = WeightProducts(x, w, bias, n, c, oc);
  ASSERT_FALSE(BitwiseEqual(changed, plain));
  {
    util::ConstantWeightsScope scope({listed});
    const int64_t packs = sdk::cpu::internal::WholeBPacksMade();
    EXPECT_TRUE(BitwiseEqual(WeightProducts(x, w, bias, n, c, oc), changed))
        << "a pack of the previous scope's weights was used";
    if (blocked) EXPECT_EQ(sdk::cpu::internal::WholeBPacksMade() - packs, 3) << "not repacked";
  }

  // Inside a scope, a buffer it does not list may change between products (a plugin's scratch
  // matrix), and so may one listed with other bytes: each product reads it as it is.
  std::vector<float> scratch = w;
  const int64_t unlisted_before = sdk::cpu::internal::WholeBProductsRun();
  {
    util::ConstantWeightsScope scope({{scratch.data(), int64_t((scratch.size() - 1) * 4)}});
    EXPECT_TRUE(BitwiseEqual(WeightProducts(x, scratch, bias, n, c, oc), changed));
    for (float& v : scratch) v *= -2.0f;
    EXPECT_TRUE(BitwiseEqual(WeightProducts(x, scratch, bias, n, c, oc), plain));
  }
  EXPECT_EQ(sdk::cpu::internal::WholeBProductsRun(), unlisted_before) << "an unlisted weight";
}

}  // namespace
}  // namespace bigmac
