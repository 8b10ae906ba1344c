#ifndef BIGMAC_CORE_CONFIG_RESOLVE_H_
#define BIGMAC_CORE_CONFIG_RESOLVE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "core/config/batch.h"
#include "core/config/data_spec.h"
#include "core/config/loader.h"
#include "core/device/device.h"
#include "core/layer/layer.h"
#include "core/partition/partition.h"
#include "core/schedule/constraints.h"

namespace bigmac::config {

// The effective configuration: loaded values plus everything derived from them and the launch.
// Only a configuration that passed every start-up check becomes one.
// train.nan_policy: on a non-finite gradient, stop (exit 4) or skip the step's update.
enum class NanPolicy { kStop, kSkip };

struct ResolvedConfig {
  LoadedConfig loaded;  // values and sources; derived keys carry Source::kDerived
  int world_size = 1;
  Source world_source;
  int pp = 1;
  int tp = 1;
  int dp = 1;
  BatchPlan batch;
  partition::Partition partition;
  partition::Policy policy = partition::Policy::kSpreadFirst;
  std::vector<std::string> block_types;  // per block (layer_id 0..num_layers-1)
  uint64_t hash = 0;                     // of the effective values; ranks compare it
  // The validated strings, typed once: no consumer parses them again.
  schedule::Kind schedule = schedule::Kind::k1F1B;  // parallel.schedule
  device::Backend backend = device::Backend::kCpu;  // device.backend
  bool bf16 = false;                        // precision.dtype is bf16 (fp16 is refused; else fp32)
  int64_t dp_bucket_bytes = 0;              // parallel.dp_bucket_size
  int64_t memory_limit_bytes = 0;           // device.memory_limit; 0 when unset
  NanPolicy nan_policy = NanPolicy::kStop;  // train.nan_policy
  DataSpec data;                            // data.path and data.split

  const Config& values() const { return loaded.values; }
  const Provenance& sources() const { return loaded.sources; }
};

// Every hard constraint, checked before any allocation or communication. Each problem names the
// fields, their values and sources, and the rule. Empty: the configuration can run.
std::vector<std::string> CheckConstraints(const LoadedConfig& loaded, int world_size);

// Checks, derives dp, the batch plan and the partition, and fills in derived sources.
// `world_source` says how the launcher told us the world size. Throws ConfigError.
ResolvedConfig Resolve(LoadedConfig loaded, int world_size, const std::string& world_source);

// The layer type of each block (layer_id 0..num_layers-1): the architecture's block
// (DefaultBlockType) unless model.layer_types names another for its range. Appends a problem for
// each malformed, out-of-range or overlapping entry (the registry check comes later, once the
// plugins are loaded).
std::vector<std::string> BlockTypes(const Config& values, std::vector<std::string>* problems);

// The built-in layer types an architecture is made of (here, not in core/layer, so that a plugin,
// which links core/layer, carries no built-in type names).
struct ArchLayerTypes {
  const char* embedding;
  const char* block;  // the blocks model.layer_types does not name
  const char* head;
};
ArchLayerTypes LayerTypesOf(layer::Arch arch);

// model.arch's block type: gpt_block or llama_block.
std::string DefaultBlockType(const Config& values);

// FNV-1a of the deterministic serialization of the effective values.
uint64_t ConfigHash(const Config& values);

// The model's dimensions (model.* and train.seq_length as the position table's rows): the one
// place a config becomes layer::ModelDims.
layer::ModelDims ModelDimsOf(const Config& values);

// "llama: 4 blocks, hidden 128, 4 heads over 2 key/value heads, SwiGLU 384, untied head, vocab
// 256" (GPT-2: "gpt: 4 blocks, hidden 128, 4 heads, vocab 256"): the [train] and [cfg] lines.
std::string DescribeModel(const layer::ModelDims& dims);

// The partition spec the model section describes (layer numbers converted to 0-based layer_ids).
partition::PartitionSpec PartitionSpecOf(const Config& values, const Provenance& sources);

}  // namespace bigmac::config

#endif  // BIGMAC_CORE_CONFIG_RESOLVE_H_
