// Config loading, merge precedence, provenance and the start-up constraint table.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "core/config/effective_log.h"
#include "core/config/errors.h"
#include "core/config/loader.h"
#include "core/config/resolve.h"
#include "tests/testing/run.h"

namespace bigmac::config {
namespace {

using testutil::WriteTempFile;

// A valid base: 27 layers on pp=4, 8 ranks.
constexpr char kBase[] = R"(parallel:
  pp_size: 4
  tp_size: 1
  schedule: 1f1b
train:
  micro_batch_size: 2
  gradient_accumulation_steps: 8
  seq_length: 64
model:
  num_layers: 27
  hidden_size: 64
  num_heads: 4
  vocab_size: 512
)";

std::string Join(const std::vector<std::string>& lines) {
  std::string text;
  for (const std::string& line : lines) text += line + "\n";
  return text;
}

// Every problem LoadConfig + Resolve report, joined; "" if the config is valid.
std::string Problems(const std::string& yaml, const std::vector<std::string>& sets, int world_size,
                     const std::string& file_name = "case.yaml") {
  const std::string path = WriteTempFile(file_name, yaml);
  try {
    Resolve(LoadConfig(path, sets), world_size, "test");
  } catch (const ConfigError& error) {
    return error.what();
  }
  return "";
}

TEST(ConfigLoad, BaseIsValid) { EXPECT_EQ(Problems(kBase, {}, 8), ""); }

// Every default (a 12-layer model) is not what anyone meant to train: an empty file is refused.
TEST(ConfigLoad, EmptyFileIsRefused) {
  for (const char* text : {"", "# only a comment\n\n"}) {
    try {
      LoadConfig(WriteTempFile("empty.yaml", text), {});
      ADD_FAILURE() << "accepted '" << text << "'";
    } catch (const ConfigError& error) {
      EXPECT_NE(std::string(error.what()).find("the config file is empty"), std::string::npos)
          << error.what();
    }
  }
}

TEST(ConfigPrecedence, FileOverridesDefaultWithFileAndLine) {
  const std::string path = WriteTempFile("p.yaml", kBase);
  const LoadedConfig loaded = LoadConfig(path, {});
  EXPECT_EQ(loaded.values.parallel().pp_size(), 4);
  EXPECT_EQ(loaded.sources.Get("parallel.pp_size").ToString(), path + ":2");
  EXPECT_EQ(loaded.sources.Get("model.num_layers").ToString(), path + ":10");
  EXPECT_EQ(loaded.sources.Get("parallel.virtual_stages").ToString(), "default");
}

TEST(ConfigPrecedence, SetOverridesFileAndLastSetWins) {
  const std::string path = WriteTempFile("p.yaml", kBase);
  const LoadedConfig loaded =
      LoadConfig(path, {"parallel.pp_size=2", "train.seq_length=128", "parallel.pp_size=1"});
  EXPECT_EQ(loaded.values.parallel().pp_size(), 1);
  EXPECT_EQ(loaded.values.train().seq_length(), 128);
  EXPECT_EQ(loaded.sources.Get("parallel.pp_size").ToString(), "--set");
  EXPECT_EQ(loaded.sources.Get("train.micro_batch_size").ToString(), path + ":6");
  EXPECT_EQ(PrecedenceLine(loaded), "default < " + path + " < --set (3 overrides); later wins");
}

TEST(ConfigPrecedence, SetReplacesAWholeList) {
  const std::string yaml =
      std::string(kBase) + "  partition: explicit\n  layers_per_stage: [7, 7, 7, 6]\n";
  const LoadedConfig loaded =
      LoadConfig(WriteTempFile("l.yaml", yaml), {"model.layers_per_stage=[6,7,7,7]"});
  ASSERT_EQ(loaded.values.model().layers_per_stage_size(), 4);
  EXPECT_EQ(loaded.values.model().layers_per_stage(0), 6);
  EXPECT_EQ(loaded.values.model().layers_per_stage(3), 7);
  EXPECT_EQ(loaded.sources.Get("model.layers_per_stage").ToString(), "--set");
}

TEST(ConfigPrecedence, DerivedValuesSayDerived) {
  const std::string yaml = std::string(kBase) + "  split_points: [6, 13, 20]\n";
  const ResolvedConfig resolved = Resolve(LoadConfig(WriteTempFile("d.yaml", yaml), {}), 8, "test");
  EXPECT_EQ(resolved.dp, 2);
  EXPECT_EQ(resolved.batch.num_microbatches, 8);
  EXPECT_EQ(resolved.batch.global_batch, 2 * 8 * 2);
  EXPECT_EQ(resolved.sources().Get("parallel.num_microbatches").kind, Source::Kind::kDerived);
  EXPECT_EQ(resolved.sources().Get("model.partition").kind, Source::Kind::kDerived);
  EXPECT_EQ(resolved.policy, partition::Policy::kExplicit);
  EXPECT_EQ(resolved.partition.LayersPerStage(), (std::vector<int>{6, 7, 7, 7}));
}

TEST(ConfigLoad, TextProtoEqualsYamlWithLineNumbers) {
  const std::string textproto = R"(# same as kBase
parallel { pp_size: 4 tp_size: 1 schedule: "1f1b" }
train {
  micro_batch_size: 2
  gradient_accumulation_steps: 8
  seq_length: 64
}
model { num_layers: 27 hidden_size: 64 num_heads: 4 vocab_size: 512 }
)";
  const std::string path = WriteTempFile("c.textproto", textproto);
  const ResolvedConfig from_text = Resolve(LoadConfig(path, {}), 8, "test");
  const ResolvedConfig from_yaml =
      Resolve(LoadConfig(WriteTempFile("c.yaml", kBase), {}), 8, "test");
  EXPECT_EQ(from_text.hash, from_yaml.hash);
  EXPECT_EQ(from_text.sources().Get("parallel.pp_size").ToString(), path + ":2");
  EXPECT_EQ(from_text.sources().Get("train.seq_length").ToString(), path + ":6");
}

TEST(ConfigHash, ChangesWithAnyValueAndIgnoresSources) {
  const LoadedConfig a = LoadConfig(WriteTempFile("h.yaml", kBase), {});
  LoadedConfig b = LoadConfig(WriteTempFile("h2.yaml", kBase), {"train.seq_length=65"});
  EXPECT_NE(ConfigHash(a.values), ConfigHash(b.values));
  // Writing a default explicitly does not change the effective config.
  const LoadedConfig c = LoadConfig(WriteTempFile("h3.yaml", kBase), {"parallel.virtual_stages=1"});
  EXPECT_EQ(ConfigHash(a.values), ConfigHash(c.values));
}

TEST(EffectiveLog, HasTheSeedLinesWithSources) {
  const std::string path = WriteTempFile("log.yaml", kBase);
  const ResolvedConfig resolved =
      Resolve(LoadConfig(path, {"train.micro_batch_size=3"}), 8, "mpirun");
  const std::string log = Join(EffectiveConfigLines(resolved));
  EXPECT_NE(log.find("[cfg] world_size=8 pp=4 tp=1 dp=2\n"), std::string::npos) << log;
  EXPECT_NE(log.find("[cfg] micro_bs=3 accum=8 num_microbatches=8 global_bs=48 "
                     "(global_bs = micro_bs*accum*dp = 3*8*2 = 48)"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("micro_bs <- --set"), std::string::npos) << log;
  EXPECT_NE(log.find("[cfg] split_points=[7, 14, 21] policy=spread_first"), std::string::npos)
      << log;
  EXPECT_NE(log.find("[cfg] stage 3 -> pp rank 3: layers 21-26 (6) + head"), std::string::npos)
      << log;
  EXPECT_NE(log.find("parallel.pp_size = 4 <- " + path + ":2 [schedule]"), std::string::npos)
      << log;
  EXPECT_NE(log.find("model.num_layers = 27 <- " + path + ":10 [model]"), std::string::npos) << log;
}

TEST(EffectiveLog, OriginOnePrintsOneBasedNumbers) {
  const std::string yaml =
      std::string(kBase) + "  layers_per_stage_origin: 1\n  split_points: [7, 14, 21]\n";
  const ResolvedConfig resolved = Resolve(LoadConfig(WriteTempFile("o.yaml", yaml), {}), 4, "test");
  // Written 1-based: stage 1 starts at layer 7 (1-based) = layer_id 6.
  EXPECT_EQ(resolved.partition.SplitPoints(), (std::vector<int>{6, 13, 20}));
  const std::string log = Join(EffectiveConfigLines(resolved));
  EXPECT_NE(log.find("split_points=[7, 14, 21]"), std::string::npos) << log;
  EXPECT_NE(log.find("stage 0 -> pp rank 0: layers 1-6 (6) + embedding"), std::string::npos) << log;
  EXPECT_NE(log.find("stage 3 -> pp rank 3: layers 21-27 (7) + head"), std::string::npos) << log;
}

TEST(ConfigErrors, ReportsEveryProblemAtOnce) {
  const std::string problems =
      Problems(std::string(kBase) + "  hidden_size: 65\nbogus: 1\n", {"parallel.pp_size=0"}, 8);
  EXPECT_NE(problems.find("written twice"), std::string::npos) << problems;
  EXPECT_NE(problems.find("unknown"), std::string::npos) << problems;
}

// One invalid configuration and a fragment its message must contain.
struct InvalidCase {
  const char* name;
  std::string yaml;  // appended to kBase unless `replace_base`
  std::vector<std::string> sets;
  int world_size;
  const char* fragment;
  bool replace_base = false;
  const char* extension = ".yaml";
  friend void PrintTo(const InvalidCase& c, std::ostream* os) { *os << c.name; }
};

class InvalidConfigTest : public ::testing::TestWithParam<InvalidCase> {};

TEST_P(InvalidConfigTest, FailsNamingTheRule) {
  const InvalidCase& c = GetParam();
  const std::string yaml = c.replace_base ? c.yaml : std::string(kBase) + c.yaml;
  const std::string problems =
      Problems(yaml, c.sets, c.world_size, std::string(c.name) + c.extension);
  ASSERT_FALSE(problems.empty()) << "accepted: " << yaml;
  EXPECT_NE(problems.find(c.fragment), std::string::npos)
      << "expected fragment: " << c.fragment << "\nactual:\n"
      << problems;
}

const InvalidCase kInvalidCases[] = {
    {"world_not_divisible",
     "",
     {"parallel.pp_size=3"},
     8,
     "world_size=8 (launch) must be divisible by pp*tp: pp=3 (parallel.pp_size, --set) * tp=1"},
    {"dp_written",
     "",
     {"parallel.dp_size=2"},
     8,
     "dp is derived as world_size / (pp_size * tp_size)"},
    {"dp_in_file", "  data_parallel_size: 2\n", {}, 8, "dp is derived"},
    {"zero_stage_2",
     "",
     {"parallel.zero_stage=2"},
     8,
     "parallel.zero_stage=2 (--set) must be 0 (the optimizer state replicated over dp) or 1"},
    {"zero_stage_with_tp",
     "",
     {"parallel.zero_stage=1", "parallel.tp_size=2"},
     8,
     "parallel.zero_stage=1 (--set) with parallel.tp_size=2 (--set) (rule: ZeRO-1 shards whole"},
    {"zero_stage_negative",
     "",
     {"parallel.zero_stage=-1"},
     8,
     "parallel.zero_stage=-1 (--set) must be >= 0"},
    {"world_size_in_file", "world_size: 8\n", {}, 8, "belongs to the launch layer"},
    {"gpus_per_node", "", {"parallel.gpus_per_node=8"}, 8, "belongs to the launch layer"},
    {"typo_key", "", {"parallel.pp_szie=4"}, 8, "did you mean 'parallel.pp_size'?"},
    {"typo_section",
     "paralel:\n  pp_size: 4\n",
     {},
     8,
     "unknown section 'paralel'; did you mean 'parallel'?"},
    {"wrong_section",
     "",
     {"parallel.micro_batch_size=2"},
     8,
     "write it as 'train.micro_batch_size'"},
    {"wrong_layer_lps",
     "",
     {"parallel.layers_per_stage=[7,7,7,6]"},
     8,
     "layers_per_stage belongs to the model layer; write it as 'model.layers_per_stage'"},
    {"wrong_layer_num_layers",
     "",
     {"train.num_layers=12"},
     8,
     "belongs to the model layer; write it as 'model.num_layers'"},
    {"wrong_layer_pp_in_model",
     "",
     {"model.pp_size=4"},
     8,
     "belongs to the schedule layer; write it as 'parallel.pp_size'"},
    {"foreign_alias", "", {"parallel.pipeline_size=4"}, 8, "did you mean 'parallel.pp_size'?"},
    {"global_batch_written", "", {"train.global_batch_size=64"}, 8, "global batch is derived"},
    {"not_an_integer", "", {"parallel.pp_size=four"}, 8, "expected an integer, got 'four'"},
    {"int_overflow", "", {"parallel.pp_size=99999999999"}, 8, "out of range for a 32-bit integer"},
    {"list_for_scalar", "", {"parallel.pp_size=[1,2]"}, 8, "expected a single value"},
    {"scalar_for_list",
     "  partition: explicit\n  layers_per_stage: 7\n",
     {},
     8,
     "expected a list like [7, 7, 7, 6]"},
    {"duplicate_key",
     "  num_layers: 28\n",
     {},
     8,
     "'model.num_layers' is written twice (first at line 10)"},
    {"yaml_syntax", "model: [unclosed\n", {}, 8, "YAML syntax error", true},
    {"section_scalar", "parallel: 4\n", {}, 8, "'parallel' is a section", true},
    {"no_value", "", {"parallel.pp_size="}, 8, "no value given"},
    {"set_without_equals", "", {"parallel.pp_size"}, 8, "expected key=value"},
    {"bad_schedule",
     "",
     {"parallel.schedule=1F1B"},
     8,
     "is not one of: gpipe, 1f1b, interleaved_1f1b, zb_h1 (did you mean '1f1b'?)"},
    {"bad_policy",
     "",
     {"model.partition=spread"},
     8,
     "model.partition='spread' (--set) is not one of"},
    {"bad_dtype",
     "",
     {"precision.dtype=fp64"},
     8,
     "precision.dtype='fp64' (--set) is not one of: fp32, bf16, fp16"},
    {"pp_zero", "", {"parallel.pp_size=0"}, 8, "parallel.pp_size=0 (--set) must be >= 1"},
    {"mbs_zero",
     "",
     {"train.micro_batch_size=0"},
     8,
     "train.micro_batch_size=0 (--set) must be >= 1"},
    {"vocab_one", "", {"model.vocab_size=1"}, 8, "model.vocab_size=1 (--set) must be >= 2"},
    {"too_few_layers",
     "",
     {"model.num_layers=3"},
     8,
     "model.num_layers=3 is less than the stage count pp_size*virtual_stages = 4*1 = 4"},
    {"lps_length",
     "  partition: explicit\n  layers_per_stage: [9, 9, 9]\n",
     {},
     8,
     "model.layers_per_stage=[9, 9, 9] has 3 entries but needs one per stage: "
     "pp_size*virtual_stages = 4*1 = 4"},
    {"lps_sum", "  layers_per_stage: [7, 7, 7, 5]\n", {}, 8, "sums to 26 but model.num_layers=27"},
    {"lps_zero",
     "  layers_per_stage: [14, 0, 7, 6]\n",
     {},
     8,
     "gives stage 1 0 layers (rule: every entry >= 1)"},
    {"splits_length", "  split_points: [7, 14]\n", {}, 8, "has 2 entries but needs stages-1 = 3"},
    {"splits_order",
     "  split_points: [7, 7, 21]\n",
     {},
     8,
     "is not strictly increasing at position 1 (7 then 7)"},
    {"splits_range",
     "  split_points: [7, 14, 27]\n",
     {},
     8,
     "27 is outside the layer numbers a stage can start at, 1..26"},
    {"splits_range_origin1",
     "  layers_per_stage_origin: 1\n  split_points: [1, 14, 21]\n",
     {},
     8,
     "outside the layer numbers a stage can start at, 2..27"},
    {"both_lists",
     "  partition: explicit\n  layers_per_stage: [7, 7, 7, 6]\n  split_points: [7, 14, 21]\n",
     {},
     8,
     "needs exactly one of model.layers_per_stage and model.split_points; both are set"},
    {"explicit_without_lists", "  partition: explicit\n", {}, 8, "neither is set"},
    {"policy_conflict",
     "  partition: first\n  layers_per_stage: [7, 7, 7, 6]\n",
     {},
     8,
     "model.partition=first conflicts with model.layers_per_stage"},
    {"origin_two",
     "  layers_per_stage_origin: 2\n",
     {},
     8,
     "model.layers_per_stage_origin=2 must be 0 or 1"},
    {"1f1b_few_microbatches",
     "",
     {"parallel.num_microbatches=2", "train.gradient_accumulation_steps=2"},
     8,
     "parallel.schedule=1f1b needs parallel.num_microbatches=2 >= parallel.pp_size=4"},
    {"zb_few_microbatches",
     "",
     {"parallel.schedule=zb_h1", "train.gradient_accumulation_steps=3"},
     8,
     "parallel.schedule=zb_h1 needs parallel.num_microbatches=3 >= parallel.pp_size=4"},
    {"interleaved_v1",
     "",
     {"parallel.schedule=interleaved_1f1b"},
     8,
     "needs parallel.virtual_stages=1 >= 2"},
    {"virtual_without_interleaved",
     "",
     {"parallel.virtual_stages=2"},
     8,
     "parallel.virtual_stages=2 is only used by parallel.schedule=interleaved_1f1b"},
    {"interleaved_not_multiple",
     "",
     {"parallel.schedule=interleaved_1f1b", "parallel.virtual_stages=2",
      "train.gradient_accumulation_steps=6"},
     8,
     "num_microbatches % pp_size == 0, 6 % 4 = 2"},
    {"accum_not_multiple",
     "",
     {"parallel.num_microbatches=5"},
     8,
     "accum % num_microbatches == 0; 8 % 5 = 3"},
    {"hidden_heads",
     "",
     {"model.hidden_size=66"},
     8,
     "model.hidden_size=66 (--set) must be divisible by model.num_heads=4"},
    {"heads_tp",
     "",
     {"parallel.tp_size=2", "model.num_heads=3", "model.hidden_size=63"},
     8,
     "each tensor-parallel rank holds num_heads/tp_size heads"},
    {"fp16_without_loss_scaling",
     "precision:\n  dtype: fp16\n",
     {},
     8,
     "needs loss scaling, which BigMac does not have yet"},
    {"bad_memory_limit",
     "",
     {"device.memory_limit=lots"},
     8,
     "device.memory_limit=lots (--set): 'lots' is not a positive size"},
    {"bad_backend",
     "",
     {"device.backend=rocm"},
     8,
     "device.backend='rocm' (--set) is not one of: cpu, cuda"},
    {"textproto_unknown",
     "parallel { pp_sise: 4 }\n",
     {},
     8,
     "did you mean 'parallel.pp_size'?",
     true,
     ".textproto"},
    {"top_level_unknown", "bogus: 1\n", {}, 8, "unknown section 'bogus'", true},
    // The transport is how the ranks connect: the launcher's to write (BIGMAC_TRANSPORT).
    {"transport_in_file",
     "device:\n  transport: nccl\n",
     {},
     8,
     "transport_in_file.yaml:15: 'device.transport' belongs to the launch layer (how many "
     "processes, which "
     "devices, how they connect): the launcher sets it as BIGMAC_TRANSPORT=auto|nccl|mpi "
     "(bigmac-mpirun --transport VALUE, or `export BIGMAC_TRANSPORT=VALUE` in a batch script), "
     "never the config file or --set"},
    {"transport_set",
     "",
     {"device.transport=mpi"},
     8,
     "--set device.transport: 'device.transport' belongs to the launch layer"},
    {"transport_wrong_section",
     "",
     {"parallel.transport=nccl"},
     8,
     "--set parallel.transport: 'device.transport' belongs to the launch layer"},
    {"transport_textproto",
     "device { transport: \"nccl\" }\n",
     {},
     8,
     "transport_textproto.textproto:1: 'device.transport' belongs to the launch layer",
     true,
     ".textproto"},
};

INSTANTIATE_TEST_SUITE_P(Table, InvalidConfigTest, ::testing::ValuesIn(kInvalidCases),
                         [](const auto& info) { return std::string(info.param.name); });

// Launch-layer keys come from the launcher's environment, with it as their source.
LoadedConfig LoadWithEnv(const std::vector<std::string>& sets,
                         const std::map<std::string, std::string>& env) {
  return LoadConfig(WriteTempFile("env.yaml", kBase), sets, [&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

TEST(ConfigLaunch, TransportComesFromTheLauncherWithItsSource) {
  LoadedConfig loaded = LoadWithEnv({}, {});
  EXPECT_EQ(loaded.values.device().transport(), "auto");
  EXPECT_EQ(loaded.sources.Get("device.transport").ToString(), "default");
  loaded = LoadWithEnv({}, {{"BIGMAC_TRANSPORT", ""}});  // empty counts as unset
  EXPECT_EQ(loaded.values.device().transport(), "auto");
  loaded = LoadWithEnv({"device.backend=cuda"}, {{"BIGMAC_TRANSPORT", "nccl"}});
  EXPECT_EQ(loaded.values.device().transport(), "nccl");
  EXPECT_EQ(loaded.sources.Get("device.transport").ToString(), "launch: BIGMAC_TRANSPORT");
  const ResolvedConfig resolved = Resolve(std::move(loaded), 8, "mpirun");
  const std::string log = Join(EffectiveConfigLines(resolved));
  EXPECT_NE(log.find("device.transport = nccl <- launch: BIGMAC_TRANSPORT [launch]"),
            std::string::npos)
      << log;
  // Ranks compare the hash: a rank launched with another transport is refused.
  EXPECT_NE(resolved.hash, Resolve(LoadWithEnv({"device.backend=cuda"}, {}), 8, "mpirun").hash);
}

TEST(ConfigLaunch, TransportValuesAreChecked) {
  auto problems = [](const std::vector<std::string>& sets, const std::string& value) {
    try {
      Resolve(LoadWithEnv(sets, {{"BIGMAC_TRANSPORT", value}}), 8, "mpirun");
    } catch (const ConfigError& error) {
      return std::string(error.what());
    }
    return std::string();
  };
  EXPECT_NE(problems({}, "ncl").find("device.transport='ncl' (launch: BIGMAC_TRANSPORT) is not "
                                     "one of: auto, nccl, mpi (did you mean 'nccl'?)"),
            std::string::npos)
      << problems({}, "ncl");
  EXPECT_NE(problems({}, "nccl")
                .find("device.transport=nccl (launch: BIGMAC_TRANSPORT) needs "
                      "device.backend=cpu (default) to be cuda (rule: NCCL moves "
                      "GPU memory"),
            std::string::npos)
      << problems({}, "nccl");
  EXPECT_EQ(problems({"device.backend=cuda"}, "nccl"), "");
  EXPECT_EQ(problems({}, "mpi"), "");
  EXPECT_EQ(problems({"device.backend=cuda"}, "mpi"), "");
}

TEST(ConfigErrors, TextProtoWrongLayerNamesTheRightKey) {
  const std::string problems = Problems("parallel { layers_per_stage: 7 }\n", {}, 1, "w.textproto");
  EXPECT_NE(problems.find("w.textproto:1: 'parallel.layers_per_stage' is in the wrong place"),
            std::string::npos)
      << problems;
}

TEST(ConfigErrors, MissingFileAndUnknownFormat) {
  EXPECT_NE(Problems(kBase, {}, 8, "x.json").find("unknown config format"), std::string::npos);
  try {
    LoadConfig("/nonexistent/config.yaml", {});
    FAIL() << "no error";
  } catch (const ConfigError& error) {
    EXPECT_NE(
        std::string(error.what()).find("/nonexistent/config.yaml: cannot open the config file"),
        std::string::npos);
  }
}

TEST(ConfigErrors, FileProblemsCarryFileAndLine) {
  const std::string problems = Problems(std::string(kBase) + "  n_layer: 4\n", {}, 8, "line.yaml");
  EXPECT_NE(
      problems.find("line.yaml:14: unknown key 'model.n_layer'; did you mean 'model.num_layers'?"),
      std::string::npos)
      << problems;
}

}  // namespace
}  // namespace bigmac::config
