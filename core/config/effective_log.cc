#include "core/config/effective_log.h"

#include <algorithm>
#include <cstdio>

#include "core/config/schema.h"
#include "core/layer/tp_layer.h"
#include "core/util/format.h"

namespace bigmac::config {
namespace {

std::string Hex(uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(value));
  return text;
}

}  // namespace

std::vector<std::string> EffectiveConfigLines(const ResolvedConfig& r) {
  const Config& values = r.values();
  const Provenance& sources = r.sources();
  const BatchPlan& batch = r.batch;
  const partition::Partition& partition = r.partition;
  std::vector<std::string> lines;
  auto add = [&lines](const std::string& text) { lines.push_back("[cfg] " + text); };
  auto from = [&sources](const std::string& key) { return sources.Get(key).ToString(); };

  add("precedence: " + PrecedenceLine(r.loaded));
  add("world_size=" + std::to_string(r.world_size) + " pp=" + std::to_string(r.pp) +
      " tp=" + std::to_string(r.tp) + " dp=" + std::to_string(r.dp));
  add("  world_size <- " + r.world_source.ToString() + "; pp <- " + from("parallel.pp_size") +
      "; tp <- " + from("parallel.tp_size") +
      "; dp <- derived: world_size/(pp*tp) = " + std::to_string(r.world_size) + "/(" +
      std::to_string(r.pp) + "*" + std::to_string(r.tp) + ")");
  if (r.tp > 1) {
    // Tensor-parallel peers are neighbours in rank order (docs/topology.md).
    const int groups = r.world_size / r.tp;
    const layer::ModelDims dims = ModelDimsOf(values);
    std::string list;
    for (int g = 0; g < std::min(groups, 4); ++g) {
      list += (g ? " " : "") + std::string("[") + std::to_string(g * r.tp) + "-" +
              std::to_string(g * r.tp + r.tp - 1) + "]";
    }
    add("tp groups: " + list + (groups > 4 ? " ..." : "") + " (" + std::to_string(groups) +
        " of tp=" + std::to_string(r.tp) + " consecutive ranks); per block each rank holds " +
        "num_heads/tp = " + std::to_string(dims.num_heads / r.tp) + " heads" +
        (dims.arch == layer::Arch::kLlama
             ? " (num_kv_heads/tp = " + std::to_string(dims.kv_heads() / r.tp) +
                   " key/value heads) and intermediate_size/tp = " +
                   std::to_string(dims.mlp_width() / r.tp)
             : " and 4*hidden/tp = " + std::to_string(dims.mlp_width() / r.tp)) +
        " MLP columns");
    const int64_t vocab = values.model().vocab_size();
    add("vocab_size=" + std::to_string(vocab) + " padded to " +
        std::to_string(layer::PaddedVocabSize(vocab, r.tp)) + " (a multiple of tp*64 = " +
        std::to_string(64 * r.tp) + ") for the vocab-parallel embedding and head; the padding " +
        "rows hold zeros, stay out of the loss and out of checkpoints");
  }
  add("model: " + DescribeModel(ModelDimsOf(values)));
  add("micro_bs=" + std::to_string(batch.micro_batch_size) +
      " accum=" + std::to_string(batch.accumulation_steps) + " num_microbatches=" +
      std::to_string(batch.num_microbatches) + " global_bs=" + std::to_string(batch.global_batch) +
      " (global_bs = " + batch.GlobalBatchFormula() + ")");
  add("  micro_bs <- " + from("train.micro_batch_size") + "; accum <- " +
      from("train.gradient_accumulation_steps") + "; num_microbatches <- " +
      from("parallel.num_microbatches") +
      "; flushes_per_step = accum/num_microbatches = " + std::to_string(batch.flushes_per_step));
  add("schedule=" + values.parallel().schedule() +
      " virtual_stages=" + std::to_string(values.parallel().virtual_stages()) +
      " seq_length=" + std::to_string(values.train().seq_length()) +
      " dtype=" + values.precision().dtype() + " backend=" + values.device().backend());
  add("split_points=" + partition::FormatLayerList(partition.SplitPoints(), partition.origin) +
      " policy=" + partition::PolicyName(r.policy) + " (" + from("model.partition") + ")" +
      " layers_per_stage=" + partition::FormatCounts(partition.LayersPerStage()) + " num_layers=" +
      std::to_string(values.model().num_layers()) + " origin=" + std::to_string(partition.origin));
  for (const partition::StageRange& range : partition.stages) {
    add("stage " + std::to_string(range.stage) + " -> pp rank " + std::to_string(range.pp_rank) +
        (values.parallel().virtual_stages() > 1 ? " chunk " + std::to_string(range.chunk) : "") +
        ": " + partition::FormatRange(range, partition.origin));
  }
  // Runs of blocks with one layer type: "0-1 gpt_block, 2-3 rms_swiglu_block".
  std::string types;
  for (size_t first = 0; first < r.block_types.size();) {
    size_t last = first;
    while (last + 1 < r.block_types.size() && r.block_types[last + 1] == r.block_types[first])
      ++last;
    types += (types.empty() ? "" : ", ") + std::to_string(first + partition.origin) +
             (last > first ? "-" + std::to_string(last + partition.origin) : "") + " " +
             r.block_types[first];
    first = last + 1;
  }
  add("layer_types: " + types + " (" + from("model.layer_types") + ")");
  if (values.plugins_size() > 0) {
    add("plugins: " + util::Join({values.plugins().begin(), values.plugins().end()}, " ") + " (" +
        from("plugins") + ")");
  }
  add("config_hash=" + Hex(r.hash));
  add("every key (value <- source, [layer]):");
  for (const KeyInfo& key : AllKeys()) {
    add("  " + key.path + " = " + FormatValue(values, key) + " <- " + from(key.path) + " [" +
        LayerName(key.layer) + "]");
  }
  return lines;
}

}  // namespace bigmac::config
