// The bad-input corpus (tests/corpus/cases.yaml): hostile or broken configs, data shards,
// checkpoints, plugin libraries and safetensors files. Each case runs bigmac in a fresh working
// directory and must give its exit code and message, and write nothing: the directory (inputs
// included) is byte-identical afterwards.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "tests/testing/run.h"
#include "yaml-cpp/yaml.h"

namespace bigmac {
namespace {

namespace fs = std::filesystem;
using testutil::RunCommand;
using testutil::Runfile;

using testutil::Bigmac;
using testutil::TempDir;

struct Case {
  std::string name;
  YAML::Node node;
  friend void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }
};

std::vector<Case> LoadCases() {
  std::vector<Case> cases;
  for (const YAML::Node& node : YAML::LoadFile(Runfile("tests/corpus/cases.yaml"))) {
    cases.push_back({node["name"].as<std::string>(), node});
  }
  return cases;
}

std::string Unhex(const std::string& hex) {
  std::string bytes;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    bytes.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return bytes;
}

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void WriteFile(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// Every entry under `dir` with its contents: "<dir>" for directories, "<link>TARGET" for
// symbolic links (never followed: a case may hold a loop), "<special>" for fifos and devices
// (never opened: a fifo would block).
std::map<std::string, std::string> Snapshot(const fs::path& dir) {
  std::map<std::string, std::string> tree;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    // Lexically: fs::relative follows links, and a case may hold a symbolic-link loop.
    const std::string relative = entry.path().lexically_relative(dir).string();
    const fs::file_status status = entry.symlink_status();
    tree[relative] = fs::is_symlink(status)        ? "<link>" + fs::read_symlink(entry).string()
                     : fs::is_directory(status)    ? "<dir>"
                     : fs::is_regular_file(status) ? ReadFile(entry.path())
                                                   : "<special>";
  }
  return tree;
}

// The good inputs the damaged ones are made from, built once: data/ (token shards), config.yaml
// (a 2-block model reading data/), ckpt/ (2 steps of that model).
const fs::path& Fixture() {
  static const fs::path dir = [] {
    const fs::path root = fs::path(TempDir()) / "corpus_fixture";
    fs::remove_all(root);
    fs::create_directories(root);
    std::string text;
    for (int i = 0; i < 400; ++i) {
      text += "A corrupt file must be named, line " + std::to_string(i) + ", never trusted.\n";
    }
    WriteFile(root / "corpus.txt", text);
    WriteFile(root / "config.yaml",
              "model: {num_layers: 2, hidden_size: 32, num_heads: 2, vocab_size: 256}\n"
              "train: {micro_batch_size: 2, seq_length: 16, max_steps: 2, eval_interval: 0,"
              " eval_batches: 1, log_interval: 1}\n"
              "data: {dir: data}\n");
    const std::string cd = "cd " + root.string() + " && ";
    const testutil::RunResult prep =
        RunCommand(cd + Bigmac() + " data prep --input corpus.txt --output data --val-every 4", 60);
    EXPECT_EQ(prep.exit_code, 0) << prep.output;
    const testutil::RunResult train =
        RunCommand(cd + Bigmac() + " train --config config.yaml --set checkpoint.dir=ckpt", 120);
    EXPECT_EQ(train.exit_code, 0) << train.output;
    fs::remove_all(root / "runs");
    fs::remove(root / "corpus.txt");
    return root;
  }();
  return dir;
}

// Applies one `ops` entry (see cases.yaml's header) inside the case's directory.
void ApplyOp(const fs::path& dir, const YAML::Node& op) {
  const fs::path path = dir / op["file"].as<std::string>();
  const std::string kind = op["op"].as<std::string>();
  if (kind == "truncate") {
    fs::resize_file(path, op["size"].as<uintmax_t>());
  } else if (kind == "write" || kind == "flip") {
    std::string bytes = ReadFile(path);
    int64_t at = op["at"].as<int64_t>();
    if (at < 0) at += static_cast<int64_t>(bytes.size());
    ASSERT_GE(at, 0) << "op offset outside " << path;
    if (kind == "flip") {
      ASSERT_LT(at, static_cast<int64_t>(bytes.size())) << "flip outside " << path;
      bytes[at] = static_cast<char>(bytes[at] ^ 0xFF);
    } else {
      const std::string patch = Unhex(op["hex"].as<std::string>());
      if (bytes.size() < at + patch.size()) bytes.resize(at + patch.size());
      bytes.replace(at, patch.size(), patch);
    }
    WriteFile(path, bytes);
  } else if (kind == "append") {
    WriteFile(path, ReadFile(path) + Unhex(op["hex"].as<std::string>()));
  } else if (kind == "delete") {
    fs::remove_all(path);
  } else if (kind == "replace") {
    WriteFile(path, op["text"].as<std::string>());
  } else if (kind == "mkdir") {
    fs::remove_all(path);
    fs::create_directories(path);
  } else if (kind == "copy") {
    fs::copy(path, dir / op["to"].as<std::string>(), fs::copy_options::overwrite_existing);
  } else {
    FAIL() << "unknown op '" << kind << "'";
  }
}

// Writes a case's own file from `text` (repeated `repeat` times) or `hex`; `mkdir` makes it a
// directory; `no_file`/`missing` leave it absent.
void WriteCaseFile(const fs::path& path, const YAML::Node& node) {
  if (node["no_file"] || node["missing"]) return;
  if (node["mkdir"]) {
    fs::create_directories(path);
    return;
  }
  std::string bytes = node["text"]  ? node["text"].as<std::string>()
                      : node["hex"] ? Unhex(node["hex"].as<std::string>())
                                    : "";
  if (node["repeat"]) {
    std::string repeated;
    for (int i = 0; i < node["repeat"].as<int>(); ++i) repeated += bytes;
    bytes = std::move(repeated);
  }
  WriteFile(path, bytes);
}

// What a command case's shell may name: $BIGMAC (the binary) and $RMS_SWIGLU (the example layer
// plugin, plugins/examples/rms_swiglu).
std::string ShellVariables() {
  return "export BIGMAC=" + Bigmac() +
         " RMS_SWIGLU=" + Runfile("plugins/examples/rms_swiglu/librms_swiglu.so") + "; ";
}

class CorpusTest : public ::testing::TestWithParam<Case> {};

TEST_P(CorpusTest, GivesItsErrorAndWritesNothing) {
  const YAML::Node& node = GetParam().node;
  const std::string kind = node["kind"].as<std::string>();
  const fs::path dir = fs::path(TempDir()) / ("case_" + GetParam().name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path& fixture = Fixture();
  if (kind != "config") {
    fs::copy(fixture / "config.yaml", dir / "config.yaml");
    fs::copy(fixture / "data", dir / "data", fs::copy_options::recursive);
  }
  if (kind == "checkpoint" || (kind == "command" && node["ckpt"])) {
    fs::copy(fixture / "ckpt", dir / "ckpt", fs::copy_options::recursive);
  }

  std::string command;
  if (kind == "config") {
    const std::string file = node["file"] ? node["file"].as<std::string>() : "config.yaml";
    WriteCaseFile(dir / file, node);
    command = "train --config " + file;
  } else if (kind == "shard" || kind == "checkpoint") {
    for (const YAML::Node& op : node["ops"]) {
      ApplyOp(dir, op);
      if (HasFatalFailure()) return;
    }
    command = kind == "shard" ? "train --config config.yaml"
              : node["command"] && node["command"].as<std::string>() == "inspect"
                  ? "ckpt inspect ckpt"
                  // max_steps above the checkpoint's step 2: a step is left to train, so the
                  // damage is what stops the run (a checkpoint at max_steps is its own error).
                  : "train --config config.yaml --resume ckpt --set train.max_steps=4";
  } else if (kind == "plugin") {
    std::string plugin = "plugin.so";
    if (node["builtin"]) {
      plugin = Runfile("tests/plugins/lib" + node["builtin"].as<std::string>() + ".so");
    } else {
      WriteCaseFile(dir / plugin, node);
    }
    command = "train --config config.yaml --plugin " + plugin;
  } else if (kind == "safetensors") {
    WriteCaseFile(dir / "model.safetensors", node);
    command = "ckpt import --safetensors model.safetensors --config config.yaml --output out";
  } else if (kind == "command") {
    if (node["text"] || node["hex"]) WriteCaseFile(dir / node["file"].as<std::string>(), node);
    for (const YAML::Node& line : node["setup"]) {
      const testutil::RunResult setup =
          RunCommand("cd " + dir.string() + " && " + ShellVariables() + line.as<std::string>(), 60);
      ASSERT_EQ(setup.exit_code, 0) << line.as<std::string>() << "\n" << setup.output;
    }
    command = node["command"].as<std::string>();
  } else {
    FAIL() << "unknown kind '" << kind << "'";
  }
  if (node["args"]) {
    for (const YAML::Node& arg : node["args"]) command += " " + arg.as<std::string>();
  }

  std::map<std::string, std::string> before = Snapshot(dir);
  // `launcher: true` runs launch/bigmac-mpirun (with this bigmac) instead of bigmac itself.
  std::string shell = node["launcher"] ? "BIGMAC_BIN=" + Bigmac() + " " +
                                             Runfile("launch/bigmac-mpirun") + " " + command
                                       : Bigmac() + " " + command;
  if (node["signal"]) {
    // Started in the background, signalled once it is up, then waited for: the exit code is
    // bigmac's own.
    shell = node["env"].as<std::string>("") + " " + shell + " & pid=$!; sleep " +
            node["signal_after"].as<std::string>("1") + "; kill -" +
            node["signal"].as<std::string>() + " $pid; wait $pid";
  } else if (node["env"]) {
    shell = node["env"].as<std::string>() + " " + shell;
  }
  const testutil::RunResult run =
      RunCommand("cd " + dir.string() + " && " + ShellVariables() + shell, 60);
  EXPECT_EQ(run.exit_code, node["exit"].as<int>()) << command << "\n" << run.output;
  if (node["max_seconds"]) {
    EXPECT_LE(run.seconds, node["max_seconds"].as<double>()) << command << "\n" << run.output;
  }
  for (const YAML::Node& fragment : node["expect"]) {
    EXPECT_NE(run.output.find(fragment.as<std::string>()), std::string::npos)
        << "missing '" << fragment.as<std::string>() << "' in the output of `bigmac " << command
        << "`:\n"
        << run.output;
  }
  for (const YAML::Node& fragment : node["reject"]) {
    EXPECT_EQ(run.output.find(fragment.as<std::string>()), std::string::npos)
        << "unexpected '" << fragment.as<std::string>() << "' in the output of `bigmac " << command
        << "`:\n"
        << run.output;
  }
  // `scratch` names the places under the case directory a case may write (a command that
  // succeeds, such as an --overwrite): one path or a list; everything else must be byte-identical.
  std::vector<std::string> scratches;
  if (node["scratch"] && node["scratch"].IsSequence()) {
    for (const YAML::Node& path : node["scratch"]) scratches.push_back(path.as<std::string>());
  } else if (node["scratch"]) {
    scratches.push_back(node["scratch"].as<std::string>());
  }
  auto in_scratch = [&scratches](const std::string& path) {
    return std::any_of(scratches.begin(), scratches.end(), [&](const std::string& scratch) {
      return path == scratch || path.rfind(scratch + "/", 0) == 0;
    });
  };
  std::map<std::string, std::string> after = Snapshot(dir);
  for (auto* tree : {&before, &after}) {
    for (auto it = tree->begin(); it != tree->end();)
      it = in_scratch(it->first) ? tree->erase(it) : std::next(it);
  }
  for (const auto& [path, contents] : after) {
    auto it = before.find(path);
    if (it == before.end()) {
      ADD_FAILURE() << "wrote " << path;
    } else if (it->second != contents) {
      ADD_FAILURE() << "changed " << path;
    }
  }
  for (const auto& [path, contents] : before) {
    if (!after.count(path)) ADD_FAILURE() << "removed " << path;
  }
  if (!HasFailure()) fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Corpus, CorpusTest, ::testing::ValuesIn(LoadCases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
                         });

TEST(CorpusSize, AtLeastSixtyCasesOverEveryKind) {
  std::map<std::string, int> kinds;
  for (const Case& c : LoadCases()) ++kinds[c.node["kind"].as<std::string>()];
  int total = 0;
  for (const auto& [kind, count] : kinds) {
    std::printf("[corpus] %s: %d cases\n", kind.c_str(), count);
    total += count;
  }
  EXPECT_GE(total, 60);
  for (const char* kind : {"config", "shard", "checkpoint", "plugin", "safetensors", "command"}) {
    EXPECT_GT(kinds[kind], 0) << kind;
  }
}

}  // namespace
}  // namespace bigmac
