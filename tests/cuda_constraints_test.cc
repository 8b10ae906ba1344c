// The CUDA layers' start-up rules (pure functions; they run on every machine).
#include <gtest/gtest.h>

#include "stages/gpt/cuda/constraints.h"

namespace bigmac::stages::gpt::cuda {
namespace {

layer::ModelDims Dims(int vocab, int hidden, int heads) {
  layer::ModelDims dims;
  dims.vocab_size = vocab;
  dims.hidden_size = hidden;
  dims.num_heads = heads;
  return dims;
}

TEST(CudaConstraints, LogitRowsArePaddedToWholeCacheLines) {
  EXPECT_EQ(PaddedVocab(50257), 50304);  // GPT-2's, as llm.c pads it
  EXPECT_EQ(PaddedVocab(256), 256);
  EXPECT_EQ(PaddedVocab(1), 64);
  EXPECT_EQ(PaddedVocab(97) % kVocabPadding, 0);
}

TEST(CudaConstraints, UnalignedOrIndivisibleWidthsAreNamedWithTheRule) {
  EXPECT_TRUE(CudaModelProblems(Dims(50257, 768, 12)).empty());
  const std::vector<std::string> odd = CudaModelProblems(Dims(256, 36, 3));
  ASSERT_EQ(odd.size(), 1u);
  EXPECT_NE(odd[0].find("model.hidden_size=36: device.backend=cuda needs hidden_size % 8 == 0"),
            std::string::npos)
      << odd[0];
  const std::vector<std::string> heads = CudaModelProblems(Dims(256, 64, 3));
  ASSERT_EQ(heads.size(), 1u);
  EXPECT_NE(heads[0].find("model.num_heads=3"), std::string::npos) << heads[0];
}

TEST(CudaConstraints, TheSummarySaysWhichAttentionRunsAndThePadding) {
  const std::string gpt2 = CudaLayoutSummary(Dims(50257, 768, 12), /*bf16=*/true);
  EXPECT_NE(gpt2.find("cuDNN"), std::string::npos) << gpt2;
  EXPECT_NE(gpt2.find("50257 padded to 50304"), std::string::npos) << gpt2;
  const std::string odd_heads = CudaLayoutSummary(Dims(256, 48, 4), /*bf16=*/true);
  EXPECT_NE(odd_heads.find("fallback"), std::string::npos) << odd_heads;
  const std::string fp32 = CudaLayoutSummary(Dims(256, 64, 4), /*bf16=*/false);
  EXPECT_NE(fp32.find("fallback"), std::string::npos) << fp32;
}

}  // namespace
}  // namespace bigmac::stages::gpt::cuda
