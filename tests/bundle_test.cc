// The GPU bundle (launch/bundle.sh, docs/gpu.md), assembled from the built binaries and unpacked
// into an empty directory: it is self-contained (every library but glibc's and CUDA's resolves
// inside it), its Open MPI is relocated, the tiny model trains from it on one rank and on two
// under its own mpirun with nothing but the bundle on PATH and LD_LIBRARY_PATH, also with the
// system's Open MPI hidden, and launch/device_check.sh's CPU smoke mode passes.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "tests/testing/expect.h"
#include "tests/testing/run.h"

namespace bigmac {
namespace {

using testutil::ExpectContains;
using testutil::RunCommand;
using testutil::Runfile;
using testutil::RunResult;
using testutil::TempDir;

bool Exists(const std::string& path) {
  struct stat info;
  return stat(path.c_str(), &info) == 0;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The output of launch/bundle.sh --assemble, once per test binary.
const RunResult& Assembly() {
  static const RunResult result = [] {
    std::string text;
    for (int i = 0; i < 8000; ++i) {
      text += "Line " + std::to_string(i * 7919 % 1000) +
              ": the quick brown fox jumps over the lazy dog " + std::to_string(i % 13) +
              " times.\n";
    }
    const std::string corpus = testutil::WriteTempFile("bundle_corpus.txt", text);
    return RunCommand(Runfile("launch/bundle.sh") + " --assemble " + TempDir() +
                          "/bigmac-bundle.tar.gz --bigmac " + Runfile("bigmac") + " --plugin " +
                          Runfile("plugins/examples/rms_swiglu/librms_swiglu.so") + " --gpu-test " +
                          Runfile("tests/cuda_test") + " --pingpong " +
                          Runfile("tests/nccl_pingpong") + " --corpus " + corpus,
                      400);
  }();
  return result;
}

// The bundle, unpacked into a directory that held nothing.
std::string Bundle() {
  static const std::string dir = [] {
    const std::string out = TempDir() + "/unpacked";
    const RunResult unpack = RunCommand("rm -rf " + out + " && mkdir " + out + " && tar xzf " +
                                            TempDir() + "/bigmac-bundle.tar.gz -C " + out,
                                        60);
    EXPECT_EQ(unpack.exit_code, 0) << unpack.output;
    return out;
  }();
  return dir;
}

// `command` run with the bundle alone on PATH and LD_LIBRARY_PATH, from an empty directory.
std::string BundleEnv(const std::string& command) {
  const std::string work = TempDir() + "/work";
  mkdir(work.c_str(), 0755);
  return "cd " + work + " && env -i PATH=" + Bundle() + "/bin LD_LIBRARY_PATH=" + Bundle() +
         "/lib HOME=" + TempDir() +
         " OMP_WAIT_POLICY=passive OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 " +
         command;
}

// The same, in a private mount namespace where Debian's Open MPI, PMIx and hwloc plugin files and
// its orted/orterun are hidden, as on the GPU machine. Empty if this machine cannot do that.
std::string WithoutSystemOpenMpi(const std::string& command) {
  if (RunCommand("unshare -m true", 10).exit_code != 0) return "";
  const std::string empty = TempDir() + "/empty";
  mkdir(empty.c_str(), 0755);
  std::string hide;
  for (const char* dir : {"/usr/lib/x86_64-linux-gnu/openmpi", "/usr/share/openmpi", "/etc/openmpi",
                          "/usr/lib/x86_64-linux-gnu/pmix2", "/usr/lib/x86_64-linux-gnu/hwloc"}) {
    if (Exists(dir)) hide += "mount --bind " + empty + " " + dir + " && ";
  }
  for (const char* file : {"/usr/bin/orted", "/usr/bin/orterun", "/usr/bin/ompi_info"}) {
    if (Exists(file)) hide += std::string("mount --bind /dev/null ") + file + " && ";
  }
  static int scripts = 0;
  const std::string script = testutil::WriteTempFile("hidden_" + std::to_string(++scripts) + ".sh",
                                                     hide + BundleEnv(command));
  return "unshare -m sh " + script;
}

std::string TinyTrain(const std::string& dump) {
  return "bigmac train --config " + Bundle() + "/configs/tiny.yaml --set data.dir=" + Bundle() +
         "/data/tiny --set model.hidden_size=32 --set train.seq_length=32"
         " --set train.micro_batch_size=4 --set train.max_steps=3 --set train.log_interval=1"
         " --set train.eval_batches=1 --dump " +
         TempDir() + "/" + dump;
}

const char kMpirun[] = "mpirun -np 2 --oversubscribe --bind-to none ";

TEST(Bundle, AssemblesUnderThirtyMiBWithEverythingTheGpuMachineNeeds) {
  const RunResult& r = Assembly();
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::smatch size;
  ASSERT_TRUE(std::regex_search(r.output, size, std::regex(R"(: ([0-9.]+) MiB compressed)")))
      << r.output;
  EXPECT_LT(std::stod(size[1]), 30.0) << r.output;
  for (const char* path : {"bin/bigmac",
                           "bin/mpirun",
                           "bin/env.sh",
                           "libexec/bigmac",
                           "libexec/orterun",
                           "libexec/orted",
                           "lib/libmpi.so.40",
                           "lib/libstdc++.so.6",
                           "lib/libopenblas.so.0",
                           "lib/openmpi/mca_btl_vader.so",
                           "lib/openmpi/mca_pmix_ext3x.so",
                           "lib/openmpi/mca_plm_isolated.so",
                           "lib/pmix",
                           "share/openmpi/help-mpi-runtime.txt",
                           "share/pmix",
                           "etc/openmpi-mca-params.conf",
                           "tests/cuda_test",
                           "plugins/librms_swiglu.so",
                           "configs/tiny.yaml",
                           "configs/gpt2_124m_pp4.yaml",
                           "data/tiny/train_000.bin",
                           "data/tiny/val_000.bin",
                           "launch/device_check.sh",
                           "launch/bundle_check.sh",
                           "launch/bundle/libs.sh",
                           "MANIFEST.txt"}) {
    EXPECT_TRUE(Exists(Bundle() + "/" + path)) << "missing " << path;
  }
  // The big CUDA libraries stay behind: the GPU machine has them.
  const RunResult cuda =
      RunCommand("ls " + Bundle() + "/lib | grep -E '^lib(cu|nccl|nvrtc)' || true");
  EXPECT_EQ(cuda.output, "") << "CUDA libraries were carried";
  const std::string manifest = ReadFile(Bundle() + "/MANIFEST.txt");
  ExpectContains(manifest, "glibc_required=2.");
  ExpectContains(manifest, "gpu_tests=cuda_test");
}

TEST(Bundle, EveryLibraryResolvesInsideTheBundleButGlibcAndCuda) {
  ASSERT_EQ(Assembly().exit_code, 0) << Assembly().output;
  // Through the RUNPATHs alone, and as the tests below run it (LD_LIBRARY_PATH=<bundle>/lib).
  for (const std::string& ld : {std::string(), "LD_LIBRARY_PATH=" + Bundle() + "/lib"}) {
    const RunResult r = RunCommand(
        "env -i PATH=/usr/bin:/bin " + ld + " " + Bundle() + "/launch/bundle_check.sh " + Bundle(),
        120);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    ExpectContains(r.output, "bundle_check: ok");
    // The CUDA libraries the GPU test links come from outside (here /usr/local/cuda's RUNPATH).
    ExpectContains(r.output, "libcublasLt.so.13=");
  }
}

TEST(Bundle, TheCheckNamesALibraryThatIsMissing) {
  ASSERT_EQ(Assembly().exit_code, 0) << Assembly().output;
  const std::string broken = TempDir() + "/broken";
  ASSERT_EQ(RunCommand("rm -rf " + broken + " && cp -a " + Bundle() + " " + broken + " && rm " +
                           broken + "/lib/libyaml-cpp.so.0.7",
                       60)
                .exit_code,
            0);
  const RunResult r = RunCommand(broken + "/launch/bundle_check.sh " + broken, 120);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  // Found on this machine's system path: outside the bundle, named with the file that needs it.
  ExpectContains(r.output,
                 "FAIL libexec/bigmac needs libyaml-cpp.so.0.7: resolves outside the bundle");
}

// A library older than what a program was linked against (as a GPU machine's glibc older than the
// build's would be): the symbol version it lacks is named.
TEST(BundleCheck, NamesAMissingSymbolVersion) {
  const std::string dir = TempDir() + "/versions";
  const RunResult build =
      RunCommand("set -e; rm -rf " + dir + "; mkdir -p " + dir + "/bin " + dir + "/lib; cd " + dir +
                     "; echo 'int foo(void) { return 0; }' > foo.c"
                     "; echo 'int foo(void); int main(void) { return foo(); }' > main.c"
                     "; echo 'FOO_1 { global: foo; local: *; };' > old.map"
                     "; echo 'FOO_2 { global: foo; local: *; };' > new.map"
                     "; gcc -shared -fPIC -Wl,--version-script=old.map -o lib/libfoo.so foo.c"
                     "; gcc -o bin/main main.c -Llib -lfoo '-Wl,-rpath,$ORIGIN/../lib'"
                     "; gcc -shared -fPIC -Wl,--version-script=new.map -o lib/libfoo.so foo.c"
                     "; rm *.c *.map",
                 60);
  ASSERT_EQ(build.exit_code, 0) << build.output;
  const RunResult r = RunCommand(Runfile("launch/bundle_check.sh") + " " + dir, 60);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  ExpectContains(r.output, "FAIL bin/main: ");
  ExpectContains(r.output, "version `FOO_1' not found");
}

TEST(Bundle, OpenMpiIsRelocatedIntoTheBundle) {
  ASSERT_EQ(Assembly().exit_code, 0) << Assembly().output;
  const RunResult paths = RunCommand(BundleEnv("ompi_info --path all"), 60);
  ASSERT_EQ(paths.exit_code, 0) << paths.output;
  ExpectContains(paths.output, "Pkglibdir: " + Bundle() + "/lib/openmpi");
  ExpectContains(paths.output, "Pkgdatadir: " + Bundle() + "/share/openmpi");
  ExpectContains(paths.output, "Sysconfdir: " + Bundle() + "/etc");
  ExpectContains(paths.output, "Bindir: " + Bundle() + "/libexec");
  const RunResult components = RunCommand(BundleEnv("ompi_info"), 60);
  ASSERT_EQ(components.exit_code, 0) << components.output;
  ExpectContains(components.output, "MCA btl: vader");
  ExpectContains(components.output, "MCA pmix: ext3x");
  ExpectContains(components.output, "MCA plm: isolated");
}

void ExpectTrainsOnOneAndTwoRanks(const std::string& one, const std::string& two,
                                  const std::string& dump) {
  const RunResult single = RunCommand(one, 120);
  ASSERT_EQ(single.exit_code, 0) << single.output;
  ExpectContains(single.output, "step 3/3 | loss");
  const RunResult pipeline = RunCommand(two, 120);
  ASSERT_EQ(pipeline.exit_code, 0) << pipeline.output;
  ExpectContains(pipeline.output, "[cfg] world_size=2 pp=2");
  ExpectContains(pipeline.output, "step 3/3 | loss");
  for (const RunResult* r : {&single, &pipeline}) {
    EXPECT_EQ(r->output.find("mca_base_component_repository_open"), std::string::npos) << r->output;
    EXPECT_EQ(r->output.find("WARNING"), std::string::npos) << r->output;
  }
  // The same global batch on 1 and 2 stages: the same losses (bitwise on the CPU backend).
  const std::string losses = ReadFile(TempDir() + "/" + dump + "_1/losses.txt");
  EXPECT_EQ(std::count(losses.begin(), losses.end(), '\n'), 3) << losses;
  EXPECT_EQ(losses, ReadFile(TempDir() + "/" + dump + "_2/losses.txt"));
}

TEST(Bundle, TrainsFromTheBundleAloneOnOneRankAndUnderItsMpirun) {
  ASSERT_EQ(Assembly().exit_code, 0) << Assembly().output;
  ExpectTrainsOnOneAndTwoRanks(
      BundleEnv(TinyTrain("plain_1")),
      BundleEnv(std::string(kMpirun) + TinyTrain("plain_2") + " --set parallel.pp_size=2"),
      "plain");
}

TEST(Bundle, TrainsWithTheSystemsOpenMpiHidden) {
  ASSERT_EQ(Assembly().exit_code, 0) << Assembly().output;
  const std::string one = WithoutSystemOpenMpi(TinyTrain("hidden_1"));
  if (one.empty()) GTEST_SKIP() << "unshare -m is not permitted here: cannot hide /usr's Open MPI";
  // The hiding works: the system's mpirun no longer starts.
  const RunResult system_mpirun =
      RunCommand(WithoutSystemOpenMpi("/usr/bin/mpirun -np 1 /bin/true") + " || echo refused", 30);
  ExpectContains(system_mpirun.output, "refused");
  ExpectTrainsOnOneAndTwoRanks(one,
                               WithoutSystemOpenMpi(std::string(kMpirun) + TinyTrain("hidden_2") +
                                                    " --set parallel.pp_size=2"),
                               "hidden");
}

// launch/device_check.sh from the unpacked bundle in its CPU smoke mode: the same steps, parsing
// and table as on the GPU machine, with device.backend=cpu for the "GPU" runs.
TEST(Bundle, DeviceCheckSmokeRunOnTheCpu) {
  ASSERT_EQ(Assembly().exit_code, 0) << Assembly().output;
  const std::string out = TempDir() + "/device_check_out";
  const RunResult r =
      RunCommand("env -i PATH=/usr/bin:/bin HOME=" + TempDir() +
                     " BIGMAC_DEVICE_CHECK_BACKEND=cpu BIGMAC_DEVICE_CHECK_STEPS=5 " + Bundle() +
                     "/launch/device_check.sh " + out,
                 300);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  // The table comes last.
  const size_t table = r.output.rfind("\ncheck ");
  ASSERT_NE(table, std::string::npos) << r.output;
  const std::string tail = r.output.substr(table);
  for (const char* row :
       {"machine ", "libraries ", "cuda_test ", "tiny fp32 gpu vs cpu ", "tiny bf16 gpu vs cpu ",
        "tiny pp=2 vs pp=1 gpu fp32 ", "gpt2 \\(2-layer smoke, cpu\\) ",
        "tiny CUDA_LAUNCH_BLOCKING=1 ", "staged ping-pong 2 ranks on 1 GPU "}) {
    std::smatch match;
    EXPECT_TRUE(std::regex_search(tail, match, std::regex(std::string("\n") + row + " *\\| PASS ")))
        << "no PASS row '" << row << "' in:\n"
        << tail;
  }
  ExpectContains(tail, "steps=5 bitwise");  // pp=2 against pp=1, and cpu against cpu
  ExpectContains(tail, "tok/s");
  // The transport rows: NCCL needs GPUs; the staged path's checksums on the CPU device.
  ExpectContains(tail, "| SKIP   | backend cpu: NCCL moves GPU memory");
  ExpectContains(tail, "exchange: 4/4 checksums ok");
  // Few files come back from the device tool: the log, the table, the logs' archive.
  const RunResult files = RunCommand("ls " + out, 10);
  EXPECT_EQ(files.output, "device_check.log\nlogs.tar.gz\nsummary.txt\n");
}

}  // namespace
}  // namespace bigmac
