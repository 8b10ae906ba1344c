#include "core/config/effective_log.h"

#include <cstdio>

#include "core/config/schema.h"

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
  add("config_hash=" + Hex(r.hash));
  add("every key (value <- source, [layer]):");
  for (const KeyInfo& key : AllKeys()) {
    add("  " + key.path + " = " + FormatValue(values, key) + " <- " + from(key.path) + " [" +
        LayerName(key.layer) + "]");
  }
  return lines;
}

}  // namespace bigmac::config
