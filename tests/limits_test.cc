// Issue 33, classes 5, 6 and 10 at their roots: the checked opener, the confinement of paths read
// from files, the environment checked like config values, the config maxima, the start-up split
// warnings, and a sample that a stop signal ends.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "core/config/environment.h"
#include "core/config/errors.h"
#include "core/config/loader.h"
#include "core/config/resolve.h"
#include "core/data/dataset.h"
#include "core/data/shard.h"
#include "core/engine/generate.h"
#include "core/util/files.h"
#include "tests/testing/expect.h"
#include "tests/testing/run.h"

namespace bigmac {
namespace {

namespace fs = std::filesystem;
using testutil::ExpectContains;

// A fresh directory under the test's temporary directory.
fs::path FreshDir(const std::string& name) {
  const fs::path dir = fs::path(testutil::TempDir()) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

TEST(OpenUserFile, RefusesAFifoWithoutWaitingForAWriter) {
  const fs::path dir = FreshDir("open_fifo");
  const std::string fifo = (dir / "tokenizer.json").string();
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  int fd = -1;
  uint64_t size = 0;
  // Returning at all is the point: a blocking open would wait here for a writer forever.
  const std::string problem = util::OpenUserFile(fifo, 1 << 20, "tokenizer manifest", &fd, &size);
  EXPECT_EQ(fd, -1);
  ExpectContains(problem, "tokenizer.json: not a regular file (a fifo)");
}

TEST(OpenUserFile, NamesADirectoryAndAFileOverItsLimit) {
  const fs::path dir = FreshDir("open_kinds");
  int fd = -1;
  uint64_t size = 0;
  ExpectContains(util::OpenUserFile(dir.string(), 100, "SentencePiece model", &fd, &size),
                 ": is a directory, not a SentencePiece model");
  const std::string big = testutil::WriteTempFile("open_kinds_big", std::string(101, 'x'));
  ExpectContains(util::OpenUserFile(big, 100, "tokenizer manifest", &fd, &size),
                 "tokenizer manifest is too large: 101 bytes, the limit is 100");
  EXPECT_EQ(fd, -1);
}

TEST(OpenUserFile, GivesAnOpenBlockingDescriptorAndTheSize) {
  const std::string path = testutil::WriteTempFile("open_ok", "hello");
  int fd = -1;
  uint64_t size = 0;
  ASSERT_EQ(util::OpenUserFile(path, 5, "text file", &fd, &size), "");
  ASSERT_GE(fd, 0);
  EXPECT_EQ(size, 5u);
  EXPECT_EQ(fcntl(fd, F_GETFL) & O_NONBLOCK, 0);
  char buffer[8];
  EXPECT_EQ(read(fd, buffer, sizeof(buffer)), 5);
  close(fd);
}

TEST(ResolveInside, AcceptsANameInsideAndResolvesIt) {
  const fs::path dir = FreshDir("confine_ok");
  fs::create_directories(dir / "sub");
  testutil::WriteTempFile("confine_ok/sub/tokenizer.model", "m");
  std::string resolved;
  EXPECT_EQ(util::ResolveInside(dir.string(), "sub/../sub/tokenizer.model", &resolved), "");
  EXPECT_EQ(resolved, fs::canonical(dir / "sub/tokenizer.model").string());
}

TEST(ResolveInside, RefusesEveryWayOut) {
  const fs::path dir = FreshDir("confine_out");
  fs::create_symlink("/etc/hostname", dir / "link.model");
  fs::create_directory_symlink("/etc", dir / "etc");
  testutil::WriteTempFile("confine_out_sibling.model", "m");
  std::string resolved = "untouched";
  // Enough ../ to reach / from wherever the test runs.
  std::string up;
  for (const auto& part : fs::canonical(dir)) {
    if (part != "/") up += "../";
  }
  ExpectContains(util::ResolveInside(dir.string(), up + "etc/passwd", &resolved),
                 "'" + up + "etc/passwd' resolves to /etc/passwd, outside " + dir.string());
  ExpectContains(util::ResolveInside(dir.string(), "/etc/passwd", &resolved),
                 "'/etc/passwd' is an absolute path");
  ExpectContains(util::ResolveInside(dir.string(), "link.model", &resolved),
                 "'link.model' resolves to /etc/hostname, outside");
  ExpectContains(util::ResolveInside(dir.string(), "etc/passwd", &resolved), "outside");
  ExpectContains(util::ResolveInside(dir.string(), "../confine_out_sibling.model", &resolved),
                 "outside");
  ExpectContains(util::ResolveInside(dir.string(), "missing.model", &resolved),
                 "'missing.model' is not in " + dir.string());
  ExpectContains(util::ResolveInside(dir.string(), "", &resolved), "an empty name");
  EXPECT_EQ(resolved, "untouched");
}

// A directory's own resolved path is not "inside" a sibling that shares its prefix.
TEST(ResolveInside, APrefixIsNotADirectory) {
  const fs::path dir = FreshDir("confine_prefix");
  FreshDir("confine_prefix2");
  testutil::WriteTempFile("confine_prefix2/x.model", "m");
  std::string resolved;
  ExpectContains(util::ResolveInside(dir.string(), "../confine_prefix2/x.model", &resolved),
                 "outside");
}

std::vector<std::string> CheckEnv(const std::map<std::string, std::string>& values) {
  return config::CheckEnvironment([&values](const char* name) -> const char* {
    const auto it = values.find(name);
    return it == values.end() ? nullptr : it->second.c_str();
  });
}

TEST(CheckEnvironment, OmpNumThreadsIsBoundedLikeAConfigValue) {
  EXPECT_TRUE(CheckEnv({}).empty());
  EXPECT_TRUE(CheckEnv({{"OMP_NUM_THREADS", "8"}}).empty());
  EXPECT_TRUE(CheckEnv({{"OMP_NUM_THREADS", "4,2"}}).empty());
  EXPECT_TRUE(CheckEnv({{"OMP_NUM_THREADS", "1024"}}).empty());
  EXPECT_TRUE(CheckEnv({{"OMP_NUM_THREADS", ""}}).empty()) << "empty is unset, as for OpenMP";
  const std::vector<std::string> huge = CheckEnv({{"OMP_NUM_THREADS", "99999999999999999999"}});
  ASSERT_EQ(huge.size(), 1u);
  ExpectContains(huge[0],
                 "OMP_NUM_THREADS='99999999999999999999' (environment): "
                 "99999999999999999999 OpenMP threads per rank is over the limit of 1024");
  ExpectContains(CheckEnv({{"OMP_NUM_THREADS", "1025"}}).at(0), "over the limit of 1024");
  ExpectContains(CheckEnv({{"OMP_NUM_THREADS", "4,5000"}}).at(0), "5000 OpenMP threads");
  for (const char* bad : {"0", "-1", "abc", "4,", " 4", "1e3"}) {
    const std::vector<std::string> problems = CheckEnv({{"OMP_NUM_THREADS", bad}});
    ASSERT_EQ(problems.size(), 1u) << bad;
    ExpectContains(problems[0], "must be a positive integer");
  }
}

std::string Problems(const std::vector<std::string>& sets) {
  const std::string path = testutil::WriteTempFile(
      "limits.yaml", "model: {num_layers: 2, hidden_size: 32, num_heads: 2, vocab_size: 256}\n");
  try {
    config::Resolve(config::LoadConfig(path, sets), 1, "test");
  } catch (const config::ConfigError& error) {
    return error.what();
  }
  return "";
}

TEST(ConfigMaximum, SampleTokensHasAStatedMaximum) {
  EXPECT_EQ(Problems({"train.sample_tokens=4096"}), "");
  ExpectContains(Problems({"train.sample_tokens=4097"}),
                 "train.sample_tokens=4097 (--set) must be <= 4096");
  ExpectContains(Problems({"train.sample_tokens=2147483647"}), "must be <= 4096");
}

// Counts that cost work and no memory the allocator would refuse: each states its maximum.
TEST(ConfigMaximum, EveryCountOfWorkHasOne) {
  EXPECT_EQ(
      Problems({"train.eval_batches=65536", "model.num_layers=65536", "train.trace_steps=1000",
                "train.gradient_accumulation_steps=65536", "parallel.num_microbatches=65536"}),
      "");
  const std::string problems =
      Problems({"train.eval_batches=65537", "model.num_layers=2000000000", "train.trace_steps=1001",
                "train.gradient_accumulation_steps=65537", "parallel.num_microbatches=65537"});
  ExpectContains(problems, "train.eval_batches=65537 (--set) must be <= 65536");
  ExpectContains(problems, "model.num_layers=2000000000 (--set) must be <= 65536");
  ExpectContains(problems, "train.trace_steps=1001 (--set) must be <= 1000");
  ExpectContains(problems, "train.gradient_accumulation_steps=65537 (--set) must be <= 65536");
  ExpectContains(problems, "parallel.num_microbatches=65537 (--set) must be <= 65536");
}

// Two splits in one directory: `train` and `val` token counts, and extra files.
fs::path SplitDir(const std::string& name, int train_tokens, int val_tokens) {
  const fs::path dir = FreshDir(name);
  data::WriteShard((dir / "train_000.bin").string(), 256, std::vector<uint32_t>(train_tokens, 7));
  data::WriteShard((dir / "val_000.bin").string(), 256, std::vector<uint32_t>(val_tokens, 9));
  return dir;
}

TEST(SplitWarnings, NoneForSeparateSplitsThatHoldTheEvalWindows) {
  const fs::path dir = SplitDir("splits_ok", 1000, 170);
  const data::TokenDataset train(dir.string(), "train"), val(dir.string(), "val");
  // 170 tokens: 10 windows of 16 + 1; 5 batches of 2 use each once.
  EXPECT_TRUE(data::SplitWarnings(train, val, 16, 2, 5).empty());
}

TEST(SplitWarnings, EvalBatchesPastTheSplitSayHowManyRepeat) {
  const fs::path dir = SplitDir("splits_repeat", 1000, 170);
  const data::TokenDataset train(dir.string(), "train"), val(dir.string(), "val");
  const std::vector<std::string> warnings = data::SplitWarnings(train, val, 16, 2, 8);
  ASSERT_EQ(warnings.size(), 1u);
  ExpectContains(warnings[0],
                 "train.eval_batches=8 x train.micro_batch_size=2 = 16 validation windows of "
                 "seq_length+1=17 tokens, but ");
  ExpectContains(warnings[0],
                 "holds 10: the windows after the first 10 repeat them (each counts "
                 "up to 2 times in val_loss); train.eval_batches=5 uses each window "
                 "once");
}

TEST(SplitWarnings, AFileBothGlobsMatchIsNamed) {
  const fs::path dir = SplitDir("splits_shared", 1000, 170);
  data::WriteShard((dir / "train_val.bin").string(), 256, std::vector<uint32_t>(300, 5));
  const data::TokenDataset train(dir.string(), "train"), val(dir.string(), "val");
  const std::vector<std::string> warnings = data::SplitWarnings(train, val, 16, 2, 1);
  ASSERT_EQ(warnings.size(), 1u);
  ExpectContains(warnings[0],
                 "train_val.bin is read by both splits: data.train_files *train*.bin "
                 "and data.val_files *val*.bin match it");
}

TEST(SplitWarnings, ALinkToATrainingFileIsTheSameFile) {
  const fs::path dir = SplitDir("splits_link", 1000, 170);
  fs::create_symlink("train_000.bin", dir / "val_001.bin");
  const data::TokenDataset train(dir.string(), "train"), val(dir.string(), "val");
  const std::vector<std::string> warnings = data::SplitWarnings(train, val, 16, 2, 1);
  ASSERT_EQ(warnings.size(), 1u);
  ExpectContains(warnings[0], "val_001.bin (the same file as ");
}

TEST(GenerateStop, ASignalEndsASampleBeforeItsLastToken) {
  engine::SampleOptions options;
  options.tokens = 4096;
  options.temperature = 0;
  int asked = 0;
  const engine::Generation generation = engine::Generate(
      {1, 2, 3}, 16, 8, options,
      [](const std::vector<int32_t>&) { return std::vector<float>{0, 1, 0, 0, 0, 0, 0, 0}; },
      [](const engine::Pick& pick, bool) { return pick; }, [&asked] { return ++asked > 3; });
  EXPECT_TRUE(generation.stopped);
  EXPECT_EQ(generation.tokens.size(), 3u);
  EXPECT_EQ(asked, 4) << "asked once before each token";
  EXPECT_TRUE(std::isfinite(generation.mean_loss));
}

TEST(GenerateStop, WithoutASignalEveryTokenIsWritten) {
  engine::SampleOptions options;
  options.tokens = 5;
  const engine::Generation generation = engine::Generate(
      {1}, 16, 4, options,
      [](const std::vector<int32_t>&) {
        return std::vector<float>{0, 0, 0, 0};
      },
      [](const engine::Pick& pick, bool) { return pick; }, [] { return false; });
  EXPECT_FALSE(generation.stopped);
  EXPECT_EQ(generation.tokens.size(), 5u);
}

}  // namespace
}  // namespace bigmac
