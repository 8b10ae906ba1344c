// End to end through the bigmac binary: data prep, single-rank training, and its exit codes.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "core/comm/cuda/cuda_probe.h"
#include "tests/testing/run.h"

namespace bigmac {
namespace {

using testutil::RunCommand;
using testutil::Runfile;

using testutil::Bigmac;

// Prepared once: a few hundred KB of text made of varied sentences.
std::string DataDir() {
  static const std::string dir = [] {
    std::string text;
    for (int i = 0; i < 6000; ++i) {
      text += "Line " + std::to_string(i * 7919 % 1000) +
              ": the quick brown fox jumps over the lazy dog " + std::to_string(i % 13) +
              " times.\n";
    }
    const std::string corpus = testutil::WriteTempFile("cli_corpus.txt", text);
    const std::string out = corpus + ".shards";
    const testutil::RunResult r =
        RunCommand(Bigmac() + " data prep --input " + corpus + " --output " + out, 60);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("byte-level, vocab 256"), std::string::npos) << r.output;
    return out;
  }();
  return dir;
}

std::string TrainCommand(const std::string& extra) {
  return Bigmac() + " train --config " + Runfile("configs/tiny.yaml") +
         " --set data.dir=" + DataDir() +
         " --set model.hidden_size=32 --set train.seq_length=32 --set train.micro_batch_size=4" +
         " --set train.max_steps=3 --set optim.warmup_steps=1 --set train.log_interval=1 " + extra;
}

TEST(CliTrain, PrintsAProgressLinePerStep) {
  const testutil::RunResult r = RunCommand(TrainCommand(""), 120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::regex progress(
      R"(step (\d)/3 \| loss [0-9.]+ \| lr [0-9.e+-]+ \| norm [0-9.]+ \| \d+ tok/s \| [0-9.]+ ms \| peak [0-9.]+ MiB)");
  int lines = 0;
  for (auto it = std::sregex_iterator(r.output.begin(), r.output.end(), progress);
       it != std::sregex_iterator(); ++it) {
    ++lines;
  }
  EXPECT_EQ(lines, 3) << r.output;
  EXPECT_NE(r.output.find("[val] step 0 | val_loss 5.5"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[val] step 3 | val_loss"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[cfg] world_size=1 pp=1 tp=1 dp=1"), std::string::npos)
      << "the [cfg] log comes first";
}

// BIGMAC_CPU_GEMM picks the float GEMM: BigMac's own (the default where the CPU has AVX2 and
// FMA, with its AVX2 kernel; the AVX-512 one on request), OpenBLAS and oneDNN train to the same
// losses within float rounding, BigMac's two kernels to the same bits, the [rank] line names the
// library and kernel, and an unknown name exits 2 before anything runs.
TEST(CliTrain, FloatGemmLibraryComesFromTheEnvironment) {
  const std::regex last_loss(R"(step 3/3 \| loss ([0-9.]+))");
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f");
  std::vector<std::string> libraries = {"openblas", "onednn"};
  if (avx2) libraries.push_back("bigmac-avx2");
  if (avx512) libraries.push_back("bigmac-avx512");
  std::vector<std::string> losses;
  std::map<std::string, std::string> metrics;  // library -> every step's loss and norm, as written
  const std::regex loss_or_norm(R"re("(?:loss|grad_norm)":[^,}]*)re");
  for (const std::string& library : libraries) {
    const std::string out = testutil::FreshDir("gemm_" + library);
    const testutil::RunResult r = RunCommand(
        "BIGMAC_CPU_GEMM=" + library + " " + TrainCommand("--set train.output_dir=" + out), 120);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(" gemm=" + library + " "), std::string::npos) << r.output;
    std::smatch loss;
    ASSERT_TRUE(std::regex_search(r.output, loss, last_loss)) << r.output;
    losses.push_back(loss[1]);
    const std::string jsonl = testutil::ReadFile(out + "/metrics.jsonl");
    for (auto it = std::sregex_iterator(jsonl.begin(), jsonl.end(), loss_or_norm);
         it != std::sregex_iterator(); ++it) {
      metrics[library] += it->str() + "\n";
    }
  }
  for (size_t i = 1; i < losses.size(); ++i) {
    EXPECT_NEAR(std::stod(losses[i]), std::stod(losses[0]), 1e-3 * std::stod(losses[0]))
        << libraries[i];
  }
  EXPECT_NE(metrics["openblas"].find("\"grad_norm\":"), std::string::npos) << metrics["openblas"];
  if (avx512) {  // the same bits: every step's loss and gradient norm, all digits
    EXPECT_EQ(metrics["bigmac-avx512"], metrics["bigmac-avx2"]);
  }
  const testutil::RunResult plain = RunCommand(TrainCommand(""), 120);
  EXPECT_EQ(plain.exit_code, 0) << plain.output;
  const std::string want = avx2 ? " gemm=bigmac-avx2 " : " gemm=openblas ";
  EXPECT_NE(plain.output.find(want), std::string::npos) << plain.output;
  const testutil::RunResult bad = RunCommand("BIGMAC_CPU_GEMM=mkl " + TrainCommand(""), 60);
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("environment variable BIGMAC_CPU_GEMM='mkl' names no GEMM library: "
                            "it must be bigmac (the default on CPUs with AVX2 and FMA; the "
                            "same as bigmac-avx2), bigmac-avx512, openblas or onednn"),
            std::string::npos)
      << bad.output;
  if (!avx512) {  // asked for a kernel this CPU lacks: exit 2, saying so
    const testutil::RunResult lacking =
        RunCommand("BIGMAC_CPU_GEMM=bigmac-avx512 " + TrainCommand(""), 60);
    EXPECT_EQ(lacking.exit_code, 2) << lacking.output;
    EXPECT_NE(lacking.output.find("BIGMAC_CPU_GEMM=bigmac-avx512 needs a CPU with AVX-512F"),
              std::string::npos)
        << lacking.output;
  }
}

TEST(CliTrain, OutOfMemoryExitsThree) {
  const testutil::RunResult r = RunCommand(TrainCommand("--set device.memory_limit=256KiB"), 120);
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("cpu:0: out of memory: tried to allocate"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("capacity 0.25 MiB"), std::string::npos) << r.output;
}

TEST(CliTrain, MissingDataExitsFiveNamingTheDirectory) {
  const testutil::RunResult r = RunCommand(TrainCommand("--set data.dir=/nonexistent/corpus"), 60);
  EXPECT_EQ(r.exit_code, 5) << r.output;
  EXPECT_NE(r.output.find("/nonexistent/corpus: data directory not found"), std::string::npos)
      << r.output;
}

TEST(CliTrain, DamagedShardExitsFiveNamingTheFile) {
  const std::string dir = DataDir() + ".damaged";
  const testutil::RunResult copy =
      RunCommand("rm -rf " + dir + " && cp -r " + DataDir() + " " + dir + " && truncate -s -3 " +
                     dir + "/train_000.bin",
                 30);
  ASSERT_EQ(copy.exit_code, 0) << copy.output;
  const testutil::RunResult r = RunCommand(TrainCommand("--set data.dir=" + dir), 60);
  EXPECT_EQ(r.exit_code, 5) << r.output;
  EXPECT_NE(r.output.find(dir + "/train_000.bin: the header promises"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("(truncated)"), std::string::npos) << r.output;
}

TEST(CliTrain, DataPrepRefusesTooLittleText) {
  const std::string tiny = testutil::WriteTempFile("tiny.txt", "too short");
  const testutil::RunResult r =
      RunCommand(Bigmac() + " data prep --input " + tiny + " --output " + tiny + ".out", 30);
  EXPECT_EQ(r.exit_code, 5) << r.output;
  EXPECT_NE(r.output.find("too little for a train/validation split"), std::string::npos)
      << r.output;
}

// device.backend=cuda on a machine without a GPU says so, exit 2, before anything is allocated;
// a model the CUDA kernels cannot serve is refused first, naming the field and the rule.
TEST(CliTrain, CudaWithoutAGpuOrWithAnUnalignedModelIsRefusedAtStartUp) {
  if (bigmac::comm::cuda::DeviceCount() > 0) GTEST_SKIP() << "this machine has a GPU";
  const testutil::RunResult r =
      RunCommand(TrainCommand("--set precision.dtype=bf16 --set device.backend=cuda"), 60);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("device.backend=cuda but no CUDA device is visible"), std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("[step"), std::string::npos) << r.output;
  const testutil::RunResult unaligned = RunCommand(
      TrainCommand("--set device.backend=cuda --set model.hidden_size=36 --set model.num_heads=3"),
      60);
  EXPECT_EQ(unaligned.exit_code, 2) << unaligned.output;
  EXPECT_NE(unaligned.output.find("model.hidden_size=36: device.backend=cuda needs hidden_size % "
                                  "8 == 0"),
            std::string::npos)
      << unaligned.output;
}

// Settings the dry-run accepts but training does not implement are refused, not ignored.
TEST(CliTrain, UnimplementedSettingsAreRefusedForTraining) {
  // The dry-run still shows such a layout.
  EXPECT_EQ(RunCommand(TrainCommand("--set parallel.tp_size=1 --dry-run"), 60).exit_code, 0);
  const testutil::RunResult tp =
      RunCommand(testutil::Mpirun(2) + " " +
                     TrainCommand("--set parallel.tp_size=2 --set device.backend=cuda"),
                 60);
  EXPECT_EQ(tp.exit_code, 2) << tp.output;
  EXPECT_NE(tp.output.find("parallel.tp_size=2 with device.backend=cuda: tensor parallelism runs "
                           "on the CPU backend only"),
            std::string::npos)
      << tp.output;
}

// tune-mbs on the real trainer with a memory limit: the maximum it reports fits and one more does
// not, which is the definition of the true maximum. The limit puts that maximum inside [1, 64]
// (35 with the CPU block's blocked attention, which keeps no T x T probabilities).
TEST(TuneMbs, FindsTheTrueMaximumUnderAMemoryLimit) {
  const std::string limit =
      " --set device.memory_limit=24MiB --set model.hidden_size=32 --set train.seq_length=64";
  const testutil::RunResult r =
      RunCommand(Bigmac() + " tune-mbs --config " + Runfile("configs/tiny.yaml") +
                     " --set data.dir=" + DataDir() + limit + " --hi 64 --steps 2",
                 240);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::regex found(R"(max micro_batch_size = (\d+); recommended (\d+))");
  std::smatch match;
  ASSERT_TRUE(std::regex_search(r.output, match, found)) << r.output;
  const int max = std::stoi(match[1]);
  EXPECT_EQ(std::stoi(match[2]), std::max(1, max * 4 / 5));
  EXPECT_NE(r.output.find("stopped: converged"), std::string::npos) << r.output;
  // Every try that ran is set against the plan's prediction, as plan --check does (measured: the
  // plan under-predicts the single rank by 7-10%, the backward's transient buffers).
  EXPECT_NE(r.output.find("    plan's predicted / measured peak: pp 0 "), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("memory model: the plan's peaks were within "), std::string::npos)
      << r.output;
  auto train = [&](int mbs) {
    return RunCommand(
               Bigmac() + " train --config " + Runfile("configs/tiny.yaml") +
                   " --set data.dir=" + DataDir() + limit +
                   " --set train.max_steps=2 --set train.eval_batches=1 --set optim.warmup_steps=0"
                   " --set train.micro_batch_size=" +
                   std::to_string(mbs),
               120)
        .exit_code;
  };
  EXPECT_EQ(train(max), 0) << "the maximum fits";
  EXPECT_EQ(train(max + 1), 3) << "one more runs out of memory";
}

// The stop conditions, with a fake child whose behaviour per micro-batch is known.
TEST(TuneMbs, StopConditions) {
  auto tune = [](const std::string& child, const std::string& extra) {
    // Single quotes: the child's $((...)) must reach tune-mbs's own shell unexpanded.
    return RunCommand(Bigmac() + " tune-mbs --config " + Runfile("configs/tiny.yaml") +
                          " --hi 64 --child-command '" + child + "' " + extra,
                      120);
  };
  const testutil::RunResult converged =
      tune("if [ {mbs} -gt 20 ]; then echo out of memory: tried to allocate 1 MiB; exit 3; fi", "");
  EXPECT_NE(converged.output.find("max micro_batch_size = 20; recommended 16"), std::string::npos)
      << converged.output;
  EXPECT_NE(converged.output.find("stopped: converged"), std::string::npos);

  // --hi is included: when everything fits, the maximum is --hi.
  EXPECT_NE(tune("true", "").output.find("max micro_batch_size = 64;"), std::string::npos);

  const testutil::RunResult timeout = tune("if [ {mbs} -gt 20 ]; then sleep 30; fi", "--timeout 1");
  EXPECT_NE(timeout.output.find("stopped: a try timed out"), std::string::npos) << timeout.output;
  EXPECT_NE(timeout.output.find("max micro_batch_size = 1;"), std::string::npos) << timeout.output;

  // Above 30 out of memory; from 17 to 30 another failure (exit 1): the first tries are 1 (fits),
  // 33 (out of memory), 17 (another failure): two in a row that mix.
  const testutil::RunResult mixed = tune(
      "if [ {mbs} -gt 30 ]; then echo out of memory; exit 3; fi; if [ {mbs} -ge 17 ]; then exit 1; "
      "fi",
      "");
  EXPECT_NE(mixed.output.find("stopped: two tries in a row mixed out-of-memory and other failures"),
            std::string::npos)
      << mixed.output;

  const testutil::RunResult nan =
      tune("if [ {mbs} -gt 20 ]; then echo step 1: the loss is nan; exit 4; fi", "");
  EXPECT_NE(nan.output.find("NaN (a numerical problem, not memory)"), std::string::npos)
      << nan.output;
  EXPECT_NE(nan.output.find("the true maximum may be higher"), std::string::npos) << nan.output;
}

// --write puts the recommendation on the config's own line.
TEST(TuneMbs, WritesTheRecommendation) {
  const std::string config = testutil::WriteTempFile(
      "tune.yaml", "train:\n  micro_batch_size: 2   # keep\n  seq_length: 16\n");
  const testutil::RunResult r =
      RunCommand(Bigmac() + " tune-mbs --config " + config +
                     " --hi 64 --write --child-command "
                     "\"if [ {mbs} -gt 30 ]; then echo out of memory; exit 3; fi\"",
                 60);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(config);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "train:\n  micro_batch_size: 24   # keep\n  seq_length: 16\n");
}

}  // namespace
}  // namespace bigmac
