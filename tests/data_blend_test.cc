// Data as Megatron users hand it over (docs/data.md): data.path (one dataset or a weighted blend)
// and data.split (by documents), on datasets written here from the published layouts
// (tests/testing/token_writers.h), not by BigMac's code.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <random>

#include "core/checkpoint/resume_preview.h"
#include "core/config/data_spec.h"
#include "core/config/loader.h"
#include "core/config/resolve.h"
#include "core/data/blend.h"
#include "core/data/dataset.h"
#include "tests/testing/run.h"
#include "tests/testing/token_writers.h"

namespace bigmac {
namespace {

namespace fs = std::filesystem;
using config::BlendEntry;
using config::DataSpec;
using data::BlendedData;

using testutil::FreshDir;

std::vector<std::string> Problems(const std::vector<std::string>& path, const std::string& split) {
  std::vector<std::string> problems;
  config::ParseBlend(path, &problems);
  config::ParseSplit(split, &problems);
  return problems;
}

// ---------------------------------------------------------------- data.path and data.split

TEST(DataSpec, ReadsMegatronsDataPathAndNormalizesTheWeights) {
  std::vector<std::string> problems;
  const std::vector<BlendEntry> blend = config::ParseBlend({"3", "web", "1", "code"}, &problems);
  EXPECT_TRUE(problems.empty());
  ASSERT_EQ(blend.size(), 2u);
  EXPECT_EQ(blend[0].path, "web");
  EXPECT_DOUBLE_EQ(blend[0].weight, 0.75);
  EXPECT_DOUBLE_EQ(blend[1].weight, 0.25);
  const std::vector<BlendEntry> one = config::ParseBlend({"data/corpus_text_document"}, &problems);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].weight, 1.0);
  EXPECT_TRUE(config::ParseBlend({}, &problems).empty());
  EXPECT_TRUE(problems.empty());
}

TEST(DataSpec, RefusesWeightsThatAreNotPositiveFiniteNumbers) {
  for (const char* weight : {"0", "-1", "nan", "inf", "abc", ""}) {
    const std::vector<std::string> problems = Problems({weight, "web", "1", "code"}, "");
    ASSERT_EQ(problems.size(), 1u) << weight;
    EXPECT_NE(problems[0].find("data.path[0]='" + std::string(weight) + "' (the weight of web)"),
              std::string::npos)
        << problems[0];
  }
  EXPECT_NE(Problems({"0.3", "web", "0.7"}, "")[0].find("even number"), std::string::npos);
  EXPECT_NE(Problems({"0.3"}, "")[0].find("a weight with no dataset"), std::string::npos);
}

TEST(DataSpec, ReadsMegatronsSplit) {
  std::vector<std::string> problems;
  const auto split = config::ParseSplit("969,30,1", &problems);
  ASSERT_TRUE(split);
  EXPECT_DOUBLE_EQ((*split)[0], 0.969);
  EXPECT_DOUBLE_EQ((*split)[1], 0.030);
  EXPECT_DOUBLE_EQ((*split)[2], 0.001);
  EXPECT_EQ(config::ParseSplit("969/30/1", &problems), split) << "Megatron reads slashes too";
  const auto two = config::ParseSplit("90, 10", &problems);  // the missing test share is 0
  ASSERT_TRUE(two);
  EXPECT_DOUBLE_EQ((*two)[2], 0.0);
  EXPECT_FALSE(config::ParseSplit("", &problems));
  EXPECT_TRUE(problems.empty());
  EXPECT_NE(Problems({}, "0,1,0")[0].find("the train share is 0"), std::string::npos);
  EXPECT_NE(Problems({}, "0,0,0")[0].find("add up to 0"), std::string::npos);
  EXPECT_NE(Problems({}, "1,2,3,4")[0].find("at most three"), std::string::npos);
  EXPECT_NE(Problems({}, "90,-10")[0].find("'-10' is not a share"), std::string::npos);
}

// Expected values from Megatron's rule run in Python (round() ties to even).
TEST(DataSpec, SplitIndicesAreMegatrons) {
  std::vector<std::string> problems;
  const auto at = [&](const std::string& split, int64_t n) {
    return config::SplitIndices(*config::ParseSplit(split, &problems), n);
  };
  EXPECT_EQ(at("969,30,1", 1000), (std::array<int64_t, 4>{0, 969, 999, 1000}));
  EXPECT_EQ(at("969,30,1", 7), (std::array<int64_t, 4>{0, 7, 7, 7}));
  EXPECT_EQ(at("1,1,0", 5), (std::array<int64_t, 4>{0, 3, 5, 5}));
  EXPECT_EQ(at("90,10", 200), (std::array<int64_t, 4>{0, 180, 200, 200}));
  EXPECT_EQ(at("969,30,1", 7289), (std::array<int64_t, 4>{0, 7063, 7282, 7289}));
  EXPECT_EQ(at("98,1,1", 12345), (std::array<int64_t, 4>{0, 12099, 12222, 12345}));
}

TEST(DataSpec, ConfigErrorsNameTheKeyTheValueAndTheSource) {
  config::LoadedConfig loaded =
      config::LoadConfig("", {"data.path=0.3 web -0.7 code", "data.split=0,100"});
  ASSERT_EQ(loaded.values.data().path_size(), 4);  // a space-separated string is a list
  const std::vector<std::string> problems = config::CheckConstraints(loaded, 1);
  ASSERT_EQ(problems.size(), 2u);
  EXPECT_NE(problems[0].find("data.path[2]='-0.7' (the weight of code): weights must be positive "
                             "finite numbers (--set)"),
            std::string::npos)
      << problems[0];
  EXPECT_NE(problems[1].find("data.split='0,100': the train share is 0"), std::string::npos)
      << problems[1];
}

// ---------------------------------------------------------------- splitting by documents

// `documents` documents of 20..299 tokens; document d's tokens lie in [1000 k, 1000 k + 1000)
// where k = label(d): which split the test expects it in.
struct LabelledDocuments {
  std::vector<uint32_t> tokens;
  std::vector<int> lengths;
};

LabelledDocuments Documents(int documents, const std::function<int(int)>& label, uint32_t seed) {
  LabelledDocuments out;
  std::mt19937 rng(seed);
  for (int d = 0; d < documents; ++d) {
    const int length = 20 + static_cast<int>(rng() % 280);
    out.lengths.push_back(length);
    for (int i = 0; i < length; ++i) out.tokens.push_back(1000 * label(d) + rng() % 1000);
  }
  return out;
}

std::unique_ptr<BlendedData> Open(const std::vector<BlendEntry>& blend, const std::string& split,
                                  const std::string& dir = "") {
  std::vector<std::string> problems;
  DataSpec spec;
  spec.blend = blend;
  spec.split = config::ParseSplit(split, &problems);
  EXPECT_TRUE(problems.empty());
  return std::make_unique<BlendedData>(BlendedData::Options{dir, "*train*.bin", "*val*.bin", spec});
}

void ExpectTokensIn(const std::vector<int32_t>& tokens, int32_t low, int32_t high,
                    const std::string& what) {
  for (int32_t token : tokens) {
    ASSERT_GE(token, low) << what;
    ASSERT_LT(token, high) << what;
  }
}

TEST(MegatronSplit, ValidationDocumentsNeverAppearInTrainingBatches) {
  for (const bool wide : {false, true}) {
    const std::string dir = FreshDir(wide ? "split_wide" : "split");
    // 200 documents split 90,10: Megatron gives documents 0-179 to training, 180-199 to
    // validation.
    const LabelledDocuments docs = Documents(
        200, [](int d) { return d < 180 ? 0 : 1; }, 7);
    testutil::WriteMegatron(dir + "/corpus_text_document", docs.tokens, docs.lengths, wide);
    const auto data = Open({{1.0, dir + "/corpus_text_document"}}, "90,10");
    ASSERT_EQ(data->size(), 1);
    const data::BlendDataset& dataset = data->dataset(0);
    EXPECT_EQ(dataset.train.documents(), 180);
    EXPECT_EQ(dataset.val.documents(), 20);
    EXPECT_EQ(dataset.test.documents(), 0);
    int64_t train_tokens = 0;
    for (int d = 0; d < 180; ++d) train_tokens += docs.lengths[d];
    EXPECT_EQ(dataset.train.end(), train_tokens);
    EXPECT_EQ(dataset.val.end(), static_cast<int64_t>(docs.tokens.size()));
    const int batch = 4, seq = 64;
    std::vector<int32_t> tokens(batch * seq), targets(tokens.size());
    const data::BlendSampler sampler({1.0}, 5);
    for (int step = 0; step < 500; ++step) {
      for (int mb = 0; mb < 4; ++mb) {
        data->TrainBatch(sampler, int64_t{step} * 16, 5, step, mb, batch, seq, tokens.data(),
                         targets.data());
        ExpectTokensIn(tokens, 0, 1000, "a training window read a validation document");
        ExpectTokensIn(targets, 0, 1000, "a training target came from a validation document");
      }
    }
    for (int index = 0; index < 20; ++index) {
      dataset.val.EvalBatch(index, batch, seq, tokens.data(), targets.data());
      ExpectTokensIn(tokens, 1000, 2000, "validation read outside its documents");
      ExpectTokensIn(targets, 1000, 2000, "validation read outside its documents");
    }
  }
}

TEST(MegatronSplit, TheDefaultIsMegatronsWhenThereAreNoValFiles) {
  const std::string dir = FreshDir("default_split");
  const LabelledDocuments docs = Documents(
      1000, [](int) { return 0; }, 3);
  testutil::WriteMegatron(dir + "/corpus_text_document", docs.tokens, docs.lengths, false);
  const auto data = Open({{1.0, dir + "/corpus_text_document"}}, "");
  EXPECT_EQ(data->dataset(0).train.documents(), 969);
  EXPECT_EQ(data->dataset(0).val.documents(), 30);
  EXPECT_EQ(data->dataset(0).test.documents(), 1);
  ASSERT_EQ(data->Describe().size(), 1u);
  EXPECT_NE(data->Describe()[0].find("train 969 documents"), std::string::npos)
      << data->Describe()[0];
}

// The first complaint: a directory of Megatron's X_text_document.bin/.idx, which no
// *train* or *val* glob matches, as data.dir or as a data.path entry.
TEST(MegatronSplit, ADirectoryOfTextDocumentsIsOneDatasetDividedBySplit) {
  const std::string dir = FreshDir("text_document_dir");
  const LabelledDocuments docs = Documents(
      1000, [](int) { return 0; }, 6);
  testutil::WriteMegatron(dir + "/my-corpus_text_document", docs.tokens, docs.lengths, false);
  for (const bool as_path : {false, true}) {
    const auto data = as_path ? Open({{1.0, dir}}, "969,30,1") : Open({}, "", dir);
    EXPECT_EQ(data->dataset(0).train.documents(), 969);
    EXPECT_EQ(data->dataset(0).val.documents(), 30);
    EXPECT_EQ(data->dataset(0).stream->size(), static_cast<int64_t>(docs.tokens.size()));
  }
}

TEST(TokenSplit, FormatsWithoutDocumentsAreSplitByTokens) {
  const std::string dir = FreshDir("llmc_split");
  const std::vector<uint32_t> tokens = testutil::RandomTokens(10000, 50257, 11);
  testutil::WriteBytes(dir + "/corpus.bin", testutil::LlmcFile(tokens, false));
  const auto data = Open({{1.0, dir + "/corpus.bin"}}, "90,10");
  EXPECT_EQ(data->dataset(0).train.begin(), 0);
  EXPECT_EQ(data->dataset(0).train.end(), 9000);
  EXPECT_EQ(data->dataset(0).val.end(), 10000);
  EXPECT_EQ(data->dataset(0).train.documents(), -1);
  EXPECT_NE(data->dataset(0).division.find("by tokens"), std::string::npos);
}

// ---------------------------------------------------------------- blends

// Two datasets whose tokens tell them apart: a's are below 100, b's 100 or more.
std::unique_ptr<BlendedData> TwoDatasets(const std::string& name, double weight_a,
                                         double weight_b) {
  const std::string dir = FreshDir(name);
  const LabelledDocuments a = Documents(
      300, [](int) { return 0; }, 1);
  std::vector<uint32_t> b_tokens = testutil::RandomTokens(60000, 900, 2);
  for (uint32_t& token : b_tokens) token += 100;
  std::vector<uint32_t> a_tokens = a.tokens;
  for (uint32_t& token : a_tokens) token %= 100;
  testutil::WriteMegatron(dir + "/a_text_document", a_tokens, a.lengths, false);
  testutil::WriteBytes(dir + "/b.bin", testutil::LlmcFile(b_tokens, false));
  const double total = weight_a + weight_b;
  return Open({{weight_a / total, dir + "/a_text_document"}, {weight_b / total, dir + "/b.bin"}},
              "");
}

TEST(Blend, AQuarterAndThreeQuartersOver1000StepsWithinOnePercent) {
  const auto data = TwoDatasets("blend_25_75", 0.25, 0.75);
  const data::BlendSampler sampler(data->weights(), 1337);
  const int batch = 4, seq = 32, microbatches = 8;  // 32 samples a step
  std::vector<int32_t> tokens(batch * seq), targets(tokens.size());
  int64_t from_a = 0, samples = 0;
  for (int step = 0; step < 1000; ++step) {
    for (int mb = 0; mb < microbatches; ++mb) {
      data->TrainBatch(sampler, int64_t{step} * batch * microbatches, 1337, step, mb, batch, seq,
                       tokens.data(), targets.data());
      for (int row = 0; row < batch; ++row) {
        const bool a = tokens[row * seq] < 100;
        for (int i = 0; i < seq; ++i)
          ASSERT_EQ(tokens[row * seq + i] < 100, a) << "one dataset a row";
        from_a += a;
        ++samples;
      }
    }
  }
  const double share = double(from_a) / samples;
  std::printf("[blend] 0.25/0.75 over 1000 steps of 32 samples: %.5f / %.5f\n", share, 1 - share);
  EXPECT_NEAR(share, 0.25, 0.0025);  // 1% of the share
  // The sampler says the same, and so does every prefix: within a few samples of the weights.
  std::vector<int64_t> counts;
  sampler.Count(0, samples, &counts);
  EXPECT_EQ(counts[0], from_a);
  std::vector<int64_t> running(2, 0);
  for (int64_t i = 0; i < samples; ++i) {
    ++running[sampler.DatasetOf(i)];
    ASSERT_LE(std::fabs(double(running[0]) - 0.25 * double(i + 1)), 3.0) << "after " << i + 1;
  }
}

TEST(Blend, ASampleDependsOnItsIndexAlone) {
  const data::BlendSampler one({0.2, 0.3, 0.5}, 9), two({0.2, 0.3, 0.5}, 9),
      other({0.2, 0.3, 0.5}, 10);
  int differ = 0;
  for (int64_t i = 0; i < 1000; ++i) {
    EXPECT_EQ(one.DatasetOf(i), two.DatasetOf(i));
    differ += one.DatasetOf(i) != other.DatasetOf(i);
  }
  EXPECT_GT(differ, 100) << "the seed moves the sequence";
  // Counting a range in pieces (one layout's steps, another's) adds up to counting it whole.
  std::vector<int64_t> whole, pieces;
  one.Count(100, 900, &whole);
  one.Count(100, 333, &pieces);
  one.Count(333, 900, &pieces);
  EXPECT_EQ(whole, pieces);
}

TEST(Blend, OneDatasetReadsWhatTheSplitsAlwaysRead) {
  const std::string dir = FreshDir("one_dataset");
  testutil::WriteBytes(dir + "/train_000.bin",
                       testutil::BigMacShard(testutil::RandomTokens(5000, 256, 4), 256, 2));
  testutil::WriteBytes(dir + "/val_000.bin",
                       testutil::BigMacShard(testutil::RandomTokens(700, 256, 5), 256, 2));
  const auto data = Open({}, "", dir);
  const data::TokenDataset train(dir, "train");
  const data::BlendSampler sampler({1.0}, 42);
  std::vector<int32_t> a(64), b(64), ya(64), yb(64);
  for (int step = 0; step < 50; ++step) {
    for (int mb = 0; mb < 3; ++mb) {
      data->TrainBatch(sampler, step * 6, 42, step, mb, 2, 32, a.data(), ya.data());
      train.TrainBatch(42, step, 0, mb, 2, 32, b.data(), yb.data());
      ASSERT_EQ(a, b);
      ASSERT_EQ(ya, yb);
    }
  }
  EXPECT_EQ(data->dataset(0).val.size(), 700);
}

TEST(Blend, RefusesDatasetsOfDifferentVocabularies) {
  const std::string dir = FreshDir("vocabularies");
  testutil::WriteBytes(dir + "/a.bin",
                       testutil::BigMacShard(testutil::RandomTokens(3000, 256, 1), 256, 2));
  testutil::WriteBytes(dir + "/b.bin",
                       testutil::BigMacShard(testutil::RandomTokens(3000, 256, 2), 512, 2));
  try {
    Open({{0.5, dir + "/a.bin"}, {0.5, dir + "/b.bin"}}, "");
    FAIL() << "different vocabularies were accepted";
  } catch (const data::DataError& error) {
    const std::string what = error.what();
    EXPECT_NE(what.find("vocabularies differ"), std::string::npos) << what;
    EXPECT_NE(what.find("b.bin: vocabulary 512"), std::string::npos) << what;
    EXPECT_NE(what.find("a.bin: vocabulary 256"), std::string::npos) << what;
  }
}

TEST(Blend, RefusesAnEmptyOrMissingDataset) {
  const std::string dir = FreshDir("empty");
  testutil::WriteMegatron(dir + "/empty_text_document", {}, {}, false);
  EXPECT_THROW(
      {
        try {
          Open({{1.0, dir + "/empty_text_document"}}, "");
        } catch (const data::DataError& error) {
          EXPECT_NE(std::string(error.what()).find("the dataset is empty"), std::string::npos)
              << error.what();
          throw;
        }
      },
      data::DataError);
  try {
    Open({{1.0, dir + "/missing_text_document"}}, "");
    FAIL() << "a missing prefix was accepted";
  } catch (const data::DataError& error) {
    EXPECT_NE(std::string(error.what()).find("missing_text_document: not found"), std::string::npos)
        << error.what();
  }
}

TEST(Blend, ASplitTooSmallForAWindowNamesTheDatasetAndTheShare) {
  const std::string dir = FreshDir("small_split");
  const LabelledDocuments docs = Documents(
      100, [](int) { return 0; }, 8);
  testutil::WriteMegatron(dir + "/corpus_text_document", docs.tokens, docs.lengths, false);
  const auto data = Open({{1.0, dir + "/corpus_text_document"}}, "99,1,0");
  try {
    data->CheckFits(512, 1000);
    FAIL() << "a one-document validation split served 513-token windows";
  } catch (const data::DataError& error) {
    EXPECT_NE(std::string(error.what()).find("its validation split"), std::string::npos)
        << error.what();
    EXPECT_NE(std::string(error.what()).find("larger validation share"), std::string::npos);
  }
}

// ---------------------------------------------------------------- resume

TEST(ResumeData, AChangedBlendOrSplitIsNamed) {
  config::LoadedConfig saved = config::LoadConfig("", {"data.path=1 a 3 b", "data.split=90,10"});
  const auto resolve = [](const std::vector<std::string>& overrides) {
    return config::Resolve(config::LoadConfig("", overrides), 1, "test");
  };
  EXPECT_TRUE(
      checkpoint::BlendChanges(saved.values, resolve({"data.path=0.25 a 0.75 b", "data.split=9,1"}))
          .empty())
      << "the same blend and split, written otherwise";
  const std::vector<std::string> changes =
      checkpoint::BlendChanges(saved.values, resolve({"data.path=1 a 1 b", "data.split=80,20"}));
  ASSERT_EQ(changes.size(), 2u);
  EXPECT_EQ(changes[0], "data.path [0.25 a, 0.75 b] -> [0.5 a, 0.5 b]");
  EXPECT_EQ(changes[1], "data.split 0.9,0.1,0 -> 0.8,0.2,0");
}

}  // namespace
}  // namespace bigmac
