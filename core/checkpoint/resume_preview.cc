#include "core/checkpoint/resume_preview.h"

#include <cmath>
#include <map>
#include <set>

#include "core/checkpoint/checkpoint.h"
#include "core/util/format.h"

namespace bigmac::checkpoint {
namespace {

std::string List(const std::vector<int>& values) {
  std::string text = "[";
  for (size_t i = 0; i < values.size(); ++i) text += (i ? ", " : "") + std::to_string(values[i]);
  return text + "]";
}

struct Layout {
  int pp, virtual_stages, dp, tp, zero_stage;
  std::vector<int> layers_per_stage;
  std::string Describe() const {
    return "pp=" + std::to_string(pp) + " (layers_per_stage " + List(layers_per_stage) +
           ") virtual_stages=" + std::to_string(virtual_stages) + " dp=" + std::to_string(dp) +
           " tp=" + std::to_string(tp) + " zero_stage=" + std::to_string(zero_stage);
  }
};

// "pp 2 -> 1, tp 2 -> 1", or "" when nothing changes.
std::string Changes(const Layout& a, const Layout& b) {
  std::vector<std::string> changes;
  const auto add = [&](const char* name, int from, int to) {
    if (from != to)
      changes.push_back(std::string(name) + " " + std::to_string(from) + " -> " +
                        std::to_string(to));
  };
  add("pp", a.pp, b.pp);
  add("virtual_stages", a.virtual_stages, b.virtual_stages);
  add("dp", a.dp, b.dp);
  add("tp", a.tp, b.tp);
  add("zero_stage", a.zero_stage, b.zero_stage);
  if (a.layers_per_stage != b.layers_per_stage) {
    changes.push_back("layers_per_stage " + List(a.layers_per_stage) + " -> " +
                      List(b.layers_per_stage));
  }
  return util::Join(changes, ", ");
}

// The files of consecutive layer_ids as "block_0000.bin .. block_0003.bin".
std::string FileRange(int first, int last, int num_layers) {
  if (first == last) return LayerFileName(first, num_layers);
  return LayerFileName(first, num_layers) + " .. " + LayerFileName(last, num_layers);
}

// Why the batches after the resume differ from the ones the saved run would have drawn, or "":
// a training batch is a function of (seed, step, micro-batch index in the step, row) and the
// stream (TokenDataset::TrainBatch), so it continues exactly when those inputs are the same.
std::vector<std::string> DataChanges(const config::Config& saved, const config::Config& now,
                                     int saved_dp, int now_dp) {
  std::vector<std::string> reasons;
  const auto differ = [&](const std::string& what, const std::string& from, const std::string& to) {
    if (from != to) reasons.push_back(what + " " + from + " -> " + to);
  };
  differ("train.seed", std::to_string(saved.train().seed()), std::to_string(now.train().seed()));
  differ("train.seq_length", std::to_string(saved.train().seq_length()),
         std::to_string(now.train().seq_length()));
  differ("train.micro_batch_size", std::to_string(saved.train().micro_batch_size()),
         std::to_string(now.train().micro_batch_size()));
  differ("micro-batches per step (gradient_accumulation_steps x dp)",
         std::to_string(int64_t{saved.train().gradient_accumulation_steps()} * saved_dp),
         std::to_string(int64_t{now.train().gradient_accumulation_steps()} * now_dp));
  if (saved.data().path().empty() && now.data().path().empty())
    differ("data.dir", "'" + saved.data().dir() + "'", "'" + now.data().dir() + "'");
  differ("data.train_files", "'" + saved.data().train_files() + "'",
         "'" + now.data().train_files() + "'");
  return reasons;
}

// "[0.25 a, 0.75 b]", or "data.dir d" for the one dataset of data.dir.
std::string BlendText(const std::vector<config::BlendEntry>& blend, const std::string& dir) {
  if (blend.empty()) return "data.dir " + dir;
  std::vector<std::string> parts;
  for (const config::BlendEntry& entry : blend)
    parts.push_back(util::Format("%.6g %s", entry.weight, entry.path.c_str()));
  return "[" + util::Join(parts, ", ") + "]";
}

std::string SplitOf(const std::optional<config::SplitShares>& split) {
  return split ? config::SplitText(*split) : "unset (the *val* files, else 969,30,1)";
}

}  // namespace

std::vector<std::string> BlendChanges(const config::Config& saved,
                                      const config::ResolvedConfig& now) {
  std::vector<std::string> ignored, changes;
  const std::vector<config::BlendEntry> before =
      config::ParseBlend({saved.data().path().begin(), saved.data().path().end()}, &ignored);
  const std::optional<config::SplitShares> split_before =
      config::ParseSplit(saved.data().split(), &ignored);
  const std::vector<config::BlendEntry>& after = now.data.blend;
  bool same = before.size() == after.size();
  for (size_t i = 0; same && i < before.size(); ++i) {
    same = before[i].path == after[i].path && std::abs(before[i].weight - after[i].weight) <= 1e-12;
  }
  if (!same) {
    changes.push_back("data.path " + BlendText(before, saved.data().dir()) + " -> " +
                      BlendText(after, now.values().data().dir()));
  }
  const auto text = [](const std::optional<config::SplitShares>& split) { return SplitOf(split); };
  if (text(split_before) != text(now.data.split))
    changes.push_back("data.split " + text(split_before) + " -> " + text(now.data.split));
  return changes;
}

std::vector<std::string> DescribeResume(const Manifest& manifest,
                                        const config::ResolvedConfig& resolved) {
  const config::Config& saved = manifest.config();
  const config::Config& now = resolved.values();
  const int num_layers = now.model().num_layers();
  std::vector<std::string> lines;

  const Layout before{manifest.pp(),
                      saved.parallel().virtual_stages(),
                      manifest.dp(),
                      saved.parallel().tp_size(),
                      saved.parallel().zero_stage(),
                      {manifest.layers_per_stage().begin(), manifest.layers_per_stage().end()}};
  const Layout after{
      resolved.pp, now.parallel().virtual_stages(), resolved.dp,
      resolved.tp, now.parallel().zero_stage(),     resolved.partition.LayersPerStage()};
  const std::string changes = Changes(before, after);
  lines.push_back("layout: saved " + before.Describe() + "; now " + after.Describe() +
                  (changes.empty() ? " (the same)" : "; resharded: " + changes));

  // Each pipeline rank's files: the layer_ids of its stages (files hold whole tensors).
  for (int rank = 0; rank < resolved.pp; ++rank) {
    std::vector<std::string> files;
    int count = 0;
    for (const partition::StageRange& stage : resolved.partition.StagesOfRank(rank)) {
      if (stage.has_embedding) files.push_back(LayerFileName(layer::kEmbeddingLayerId, num_layers));
      if (stage.num_layers > 0)
        files.push_back(FileRange(stage.first_layer, stage.end_layer() - 1, num_layers));
      if (stage.has_head)
        files.push_back(LayerFileName(layer::HeadLayerId(num_layers), num_layers));
      count += stage.num_layers + (stage.has_embedding ? 1 : 0) + (stage.has_head ? 1 : 0);
    }
    lines.push_back("pp rank " + std::to_string(rank) + " reads " + util::Join(files, ", ") + " (" +
                    std::to_string(count) + " files" +
                    (resolved.dp > 1
                         ? ", on each of its dp=" + std::to_string(resolved.dp) + " replicas"
                         : "") +
                    ")");
  }
  if (after.tp > 1 || before.tp > 1) {
    lines.push_back(
        "the files hold each layer's whole tensors: " +
        (after.tp > 1 ? "each of the tp=" + std::to_string(after.tp) +
                            " ranks of a stage takes its slice (docs/tensor_parallel.md)"
                      : std::string("every rank takes the whole layers")) +
        (before.tp != after.tp ? " (saved under tp=" + std::to_string(before.tp) + ")" : ""));
  }

  // The optimizer state: every saved parameter's moments.
  std::set<std::string> values, first, second;
  for (const TensorEntry& tensor : manifest.tensors()) {
    const std::string& name = tensor.name();
    const size_t hash = name.rfind('#');
    if (hash == std::string::npos) continue;
    const std::string base = name.substr(0, hash), kind = name.substr(hash + 1);
    if (kind == "value") values.insert(base);
    if (kind == "exp_avg") first.insert(base);
    if (kind == "exp_avg_sq") second.insert(base);
  }
  int complete = 0;
  for (const std::string& name : values) complete += first.count(name) && second.count(name);
  std::string optimizer;
  if (complete == static_cast<int>(values.size())) {
    optimizer =
        "optimizer: AdamW moments for all " + std::to_string(values.size()) + " parameter tensors";
    if (after.zero_stage == 1) {
      optimizer += "; ZeRO-1 over dp=" + std::to_string(after.dp) + ": each rank keeps its shard";
    }
  } else if (complete == 0) {
    optimizer =
        "optimizer: no AdamW moments in the checkpoint (an import or weights only): the "
        "moments start from zero";
  } else {
    optimizer = "optimizer: AdamW moments for " + std::to_string(complete) + " of " +
                std::to_string(values.size()) + " parameter tensors";
  }
  lines.push_back(optimizer);

  // The data stream.
  std::vector<std::string> data = DataChanges(saved, now, manifest.dp(), resolved.dp);
  const std::vector<std::string> blend = BlendChanges(saved, resolved);
  data.insert(data.end(), blend.begin(), blend.end());
  const std::string next = std::to_string(manifest.step() + 1);
  if (data.empty()) {
    lines.push_back("data: continues exactly: step " + next +
                    " draws the batches the saved run "
                    "would have drawn (same seed, data, sequence length and micro-batches)");
  } else {
    lines.push_back("data: does not continue exactly (" + util::Join(data, "; ") + "): step " +
                    next +
                    " draws the batches a fresh run with these settings would draw at "
                    "that step");
  }
  if (manifest.has_data() && manifest.data().datasets_size() > 1) {
    std::vector<std::string> drawn;
    for (const DatasetDrawn& dataset : manifest.data().datasets()) {
      drawn.push_back(util::Format("%s %lld tokens (%lld samples)", dataset.path().c_str(),
                                   static_cast<long long>(dataset.tokens()),
                                   static_cast<long long>(dataset.samples())));
    }
    lines.push_back("data: trained on so far: " + util::Join(drawn, ", "));
  }
  if (!blend.empty()) {
    lines.push_back(
        "data: a changed blend or split needs --allow-data-change; each dataset the new blend "
        "keeps (by path) keeps its count of samples drawn, a new one starts at 0");
  }
  // The learning-rate schedule is a function of the step and these keys.
  std::vector<std::string> schedule;
  if (saved.train().max_steps() != now.train().max_steps()) {
    schedule.push_back("train.max_steps " + std::to_string(saved.train().max_steps()) + " -> " +
                       std::to_string(now.train().max_steps()));
  }
  if (saved.optim().lr() != now.optim().lr() || saved.optim().min_lr() != now.optim().min_lr() ||
      saved.optim().warmup_steps() != now.optim().warmup_steps()) {
    schedule.push_back("optim.lr, min_lr or warmup_steps");
  }
  if (!schedule.empty()) {
    lines.push_back("learning rate: the schedule changes from step " + next + " (" +
                    util::Join(schedule, ", ") + ")");
  }
  return lines;
}

}  // namespace bigmac::checkpoint
