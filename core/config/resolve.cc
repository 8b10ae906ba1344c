#include "core/config/resolve.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "core/config/errors.h"
#include "core/config/schema.h"
#include "core/layer/cost.h"
#include "core/memory/allocator.h"
#include "core/schedule/constraints.h"

namespace bigmac::config {
namespace {

// memory::ParseByteSize calls a size that overflows 64 bits "not a positive size"; when the unit
// is fine and the number positive, the size is too large, and the message says so.
std::string ExplainSizeError(const std::string& text, const std::string& error) {
  size_t at = 0;
  while (at < text.size() &&
         (std::isdigit(static_cast<unsigned char>(text[at])) || text[at] == '.'))
    ++at;
  int64_t unit_bytes = 0;
  std::string ignored;
  if (at > 0 && memory::ParseByteSize("1" + text.substr(at), &unit_bytes, &ignored) &&
      std::strtod(text.substr(0, at).c_str(), nullptr) * double(unit_bytes) >= 9.2e18) {
    return "'" + text + "' is too large: a byte count must stay below 2^63 (about 8 EiB)";
  }
  return error;
}

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

// "parallel.pp_size=3 (--set)".
class Describer {
 public:
  explicit Describer(const LoadedConfig& loaded) : loaded_(loaded) {}

  std::string operator()(const std::string& key, int64_t value) const {
    return key + "=" + std::to_string(value) + " (" + loaded_.sources.Get(key).ToString() + ")";
  }
  std::string operator()(const std::string& key, const std::string& value) const {
    return key + "=" + value + " (" + loaded_.sources.Get(key).ToString() + ")";
  }
  // " [set by: a (file:3), b (--set)]" for the non-default keys among `keys`.
  std::string SetBy(const std::vector<std::string>& keys) const {
    std::string text;
    for (const std::string& key : keys) {
      if (loaded_.sources.IsDefault(key)) continue;
      text += (text.empty() ? "" : ", ") + key + " (" + loaded_.sources.Get(key).ToString() + ")";
    }
    return text.empty() ? " [all from defaults]" : " [set by: " + text + "]";
  }

 private:
  const LoadedConfig& loaded_;
};

// Allowed values, minimums and maximums declared in config.proto.
void CheckSchemaRules(const LoadedConfig& loaded, const Describer& describe,
                      std::vector<std::string>& problems) {
  for (const KeyInfo& key : AllKeys()) {
    const Message& parent = LeafMessage(loaded.values, key);
    const FieldDescriptor* field = key.field();
    if (field->is_repeated()) continue;
    const auto* reflection = parent.GetReflection();
    if (!key.choices.empty()) {
      const std::string value = reflection->GetString(parent, field);
      if (std::find(key.choices.begin(), key.choices.end(), value) == key.choices.end()) {
        std::string allowed;
        for (const std::string& choice : key.choices)
          allowed += (allowed.empty() ? "" : ", ") + choice;
        std::vector<std::string> near = Suggest(value, key.choices);
        problems.push_back(describe(key.path, "'" + value + "'") + " is not one of: " + allowed +
                           (near.empty() ? "" : " (did you mean '" + near.front() + "'?)"));
      }
    }
    if (field->cpp_type() == FieldDescriptor::CPPTYPE_INT32) {
      const int64_t value = reflection->GetInt32(parent, field);
      const std::string help = key.help.empty() ? "" : " (" + key.help + ")";
      if (key.has_min && value < key.min)
        problems.push_back(describe(key.path, value) + " must be >= " + std::to_string(key.min) +
                           help);
      if (key.has_max && value > key.max)
        problems.push_back(describe(key.path, value) + " must be <= " + std::to_string(key.max) +
                           help);
    }
  }
}

std::string FormatDouble(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", value);
  return text;
}

}  // namespace

partition::PartitionSpec PartitionSpecOf(const Config& values, const Provenance& sources) {
  const Model& model = values.model();
  partition::PartitionSpec spec;
  spec.num_layers = model.num_layers();
  spec.pp = values.parallel().pp_size();
  spec.virtual_stages = values.parallel().virtual_stages();
  spec.origin = model.layers_per_stage_origin();
  spec.layers_per_stage.assign(model.layers_per_stage().begin(), model.layers_per_stage().end());
  for (int point : model.split_points()) spec.split_points.push_back(point - spec.origin);
  // balanced: the estimated compute (forward + backward FLOPs) of each layer for one micro-batch.
  const layer::ModelDims dims = ModelDimsOf(values);
  const int batch = values.train().micro_batch_size();
  const int seq = values.train().seq_length();
  if (model.num_heads() > 0 && model.hidden_size() > 0) {
    const layer::LayerCost block =
        layer::BlockCost(dims, batch, seq, values.train().activation_checkpointing());
    const layer::LayerCost embedding = layer::EmbeddingCost(dims, batch, seq);
    const layer::LayerCost head = layer::HeadCost(dims, batch, seq);
    spec.layer_costs.assign(std::max(0, model.num_layers()),
                            double(block.forward_flops + block.backward_flops));
    spec.first_stage_extra = double(embedding.forward_flops + embedding.backward_flops);
    spec.last_stage_extra = double(head.forward_flops + head.backward_flops);
  }
  const bool has_lists = !spec.layers_per_stage.empty() || !spec.split_points.empty();
  // An explicit list with the policy left at its default means "explicit".
  if (has_lists && sources.IsDefault("model.partition")) {
    spec.policy = partition::Policy::kExplicit;
  } else if (!partition::ParsePolicy(model.partition(), &spec.policy)) {
    spec.policy = partition::Policy::kSpreadFirst;  // CheckSchemaRules reports the bad name
  }
  return spec;
}

std::vector<std::string> BlockTypes(const Config& values, std::vector<std::string>* problems) {
  const Model& model = values.model();
  const int num_layers = model.num_layers();
  const int origin = model.layers_per_stage_origin();
  std::vector<std::string> types(std::max(num_layers, 0), DefaultBlockType(values));
  std::vector<int> set_by(types.size(), -1);  // which entry set each block
  for (int entry = 0; entry < model.layer_types_size(); ++entry) {
    const std::string& text = model.layer_types(entry);
    const std::string where = "model.layer_types[" + std::to_string(entry) + "]='" + text + "'";
    const size_t colon = text.rfind(':');
    int first = 0;
    int last = 0;
    bool ok = colon != std::string::npos && colon > 0;
    if (ok) {
      const std::string range = text.substr(colon + 1);
      const size_t dash = range.find('-');
      const char* begin = range.data();
      const char* end = begin + range.size();
      if (dash == std::string::npos) {
        auto [ptr, ec] = std::from_chars(begin, end, first);
        ok = ec == std::errc() && ptr == end && !range.empty();
        last = first;
      } else {
        auto [p1, e1] = std::from_chars(begin, begin + dash, first);
        auto [p2, e2] = std::from_chars(begin + dash + 1, end, last);
        ok = e1 == std::errc() && p1 == begin + dash && e2 == std::errc() && p2 == end;
      }
    }
    if (!ok) {
      problems->push_back(where +
                          " must be TYPE:FIRST-LAST or TYPE:LAYER, e.g. rms_swiglu_block:2-3");
      continue;
    }
    if (first > last || first < origin || last >= num_layers + origin) {
      problems->push_back(where + ": the range must satisfy " + std::to_string(origin) +
                          " <= FIRST <= LAST <= " + std::to_string(num_layers - 1 + origin) +
                          " (model.num_layers=" + std::to_string(num_layers) +
                          ", model.layers_per_stage_origin=" + std::to_string(origin) + ")");
      continue;
    }
    for (int layer = first - origin; layer <= last - origin; ++layer) {
      if (set_by[layer] >= 0) {
        problems->push_back(where + " overlaps model.layer_types[" + std::to_string(set_by[layer]) +
                            "]='" + model.layer_types(set_by[layer]) + "' at layer " +
                            std::to_string(layer + origin) + " (each block has one type)");
        break;
      }
      set_by[layer] = entry;
      types[layer] = text.substr(0, colon);
    }
  }
  return types;
}

// model.arch's rules: the llama keys shape a llama model only, and a llama model's heads, key/value
// heads and SwiGLU width must divide as grouped-query attention, RoPE and tensor parallelism need.
void CheckArchRules(const LoadedConfig& loaded, const Describer& describe, int tp,
                    std::vector<std::string>& problems) {
  const Model& model = loaded.values.model();
  static const char* const kLlamaKeys[] = {"model.num_kv_heads", "model.intermediate_size",
                                           "model.rope_theta", "model.rms_norm_eps",
                                           "model.tie_embeddings"};
  if (model.arch() != "llama") {
    for (const char* key : kLlamaKeys) {
      if (loaded.sources.IsDefault(key)) continue;
      problems.push_back(std::string(key) + " (" + loaded.sources.Get(key).ToString() +
                         ") shapes a llama model only, and " +
                         describe("model.arch", model.arch()) +
                         " (rule: GPT-2 has num_heads key/value heads, a 4*hidden_size GELU MLP, "
                         "learned positions, LayerNorm and a tied head; set model.arch: llama)");
    }
    return;
  }
  const layer::ModelDims dims = ModelDimsOf(loaded.values);
  const int kv = dims.kv_heads();
  if (kv > model.num_heads() || model.num_heads() % kv != 0) {
    problems.push_back(describe("model.num_heads", model.num_heads()) + " must be divisible by " +
                       describe("model.num_kv_heads", model.num_kv_heads()) +
                       " (rule: each group of num_heads/num_kv_heads query heads shares one key "
                       "and value head; 1 is multi-query, num_heads or 0 multi-head)");
  } else if (kv % tp != 0) {
    problems.push_back("model.num_kv_heads=" + std::to_string(kv) + " (" +
                       loaded.sources.Get("model.num_kv_heads").ToString() +
                       (model.num_kv_heads() == 0 ? ", 0 means num_heads" : "") +
                       ") must be divisible by " + describe("parallel.tp_size", tp) +
                       " (rule: each tensor-parallel rank holds num_kv_heads/tp_size key and value "
                       "heads with their query heads)");
  }
  if (model.hidden_size() % model.num_heads() == 0 && dims.head_dim() % 2 != 0) {
    problems.push_back(describe("model.hidden_size", model.hidden_size()) + " / " +
                       describe("model.num_heads", model.num_heads()) + " = head_dim " +
                       std::to_string(dims.head_dim()) +
                       " must be even (rule: rotary embeddings turn pairs of a head's dimensions)");
  }
  if (dims.intermediate_size % tp != 0) {
    problems.push_back("model.intermediate_size=" + std::to_string(dims.intermediate_size) + " (" +
                       loaded.sources.Get("model.intermediate_size").ToString() +
                       (model.intermediate_size() == 0 ? ", 0 means 8/3*hidden_size rounded up "
                                                         "to a multiple of 256"
                                                       : "") +
                       ") must be divisible by " + describe("parallel.tp_size", tp) +
                       " (rule: gate and up are column-parallel, down row-parallel: each rank "
                       "holds intermediate_size/tp_size of the SwiGLU)");
  }
  const auto positive = [&](const char* key, double value, const char* rule) {
    if (value > 0 && std::isfinite(value)) return;
    problems.push_back(std::string(key) + "=" + FormatDouble(value) + " (" +
                       loaded.sources.Get(key).ToString() +
                       ") must be a positive number (rule: " + rule + ")");
  };
  positive("model.rope_theta", model.rope_theta(), "the base of the rotary frequencies");
  positive("model.rms_norm_eps", model.rms_norm_eps(), "it keeps RMSNorm finite on a row of zeros");
}

std::vector<std::string> CheckConstraints(const LoadedConfig& loaded, int world_size) {
  std::vector<std::string> problems;
  const Describer describe(loaded);
  const Config& values = loaded.values;
  CheckSchemaRules(loaded, describe, problems);
  if (!problems.empty()) return problems;  // the rules below assume positive sizes and known names

  const Parallel& parallel = values.parallel();
  const Train& train = values.train();
  const Model& model = values.model();
  const int pp = parallel.pp_size();
  const int tp = parallel.tp_size();
  if (world_size % (pp * tp) != 0) {
    problems.push_back(
        "world_size=" + std::to_string(world_size) +
        " (launch) must be divisible by pp*tp: pp=" + std::to_string(pp) + " (parallel.pp_size, " +
        loaded.sources.Get("parallel.pp_size").ToString() + ") * tp=" + std::to_string(tp) +
        " (parallel.tp_size, " + loaded.sources.Get("parallel.tp_size").ToString() +
        ") = " + std::to_string(pp * tp) + ", and " + std::to_string(world_size) + " % " +
        std::to_string(pp * tp) + " = " + std::to_string(world_size % (pp * tp)) +
        " (rule: dp = world_size / (pp_size * tp_size) must be a whole number)");
  }
  if (model.hidden_size() % model.num_heads() != 0) {
    problems.push_back(describe("model.hidden_size", model.hidden_size()) +
                       " must be divisible by " + describe("model.num_heads", model.num_heads()) +
                       " (rule: head_dim = hidden_size / num_heads)");
  }
  if (model.num_heads() % tp != 0) {
    problems.push_back(describe("model.num_heads", model.num_heads()) + " must be divisible by " +
                       describe("parallel.tp_size", tp) +
                       " (rule: each tensor-parallel rank holds num_heads/tp_size heads)");
  }
  if (model.hidden_size() % tp != 0) {
    problems.push_back(describe("model.hidden_size", model.hidden_size()) +
                       " must be divisible by " + describe("parallel.tp_size", tp) +
                       " (rule: each tensor-parallel rank holds hidden_size/tp_size columns of "
                       "the attention and its share of the MLP)");
  }
  CheckArchRules(loaded, describe, tp, problems);
  const int accum = train.gradient_accumulation_steps();
  const int microbatches = NumMicrobatches(values);
  if (accum % microbatches != 0) {
    problems.push_back(describe("train.gradient_accumulation_steps", accum) +
                       " must be a multiple of " +
                       describe("parallel.num_microbatches", microbatches) +
                       " (rule: an optimizer step is a whole number of pipeline flushes, accum % "
                       "num_microbatches == 0; " +
                       std::to_string(accum) + " % " + std::to_string(microbatches) + " = " +
                       std::to_string(accum % microbatches) + ")");
  }
  schedule::Kind kind = schedule::Kind::k1F1B;
  schedule::ParseKind(parallel.schedule(), &kind);
  for (const std::string& problem :
       schedule::CheckScheduleConstraints(kind, pp, parallel.virtual_stages(), microbatches)) {
    problems.push_back(
        problem +
        describe.SetBy({"parallel.schedule", "parallel.pp_size", "parallel.virtual_stages",
                        "parallel.num_microbatches", "train.gradient_accumulation_steps"}));
  }
  for (const std::string& problem : partition::CheckSpec(PartitionSpecOf(values, loaded.sources))) {
    problems.push_back(
        problem + describe.SetBy({"model.num_layers", "model.partition", "model.layers_per_stage",
                                  "model.split_points", "model.layers_per_stage_origin",
                                  "parallel.pp_size", "parallel.virtual_stages"}));
  }
  const std::vector<std::string> types = BlockTypes(values, &problems);
  if (model.arch() != "llama") {
    for (size_t layer = 0; layer < types.size(); ++layer) {
      if (types[layer] != LayerTypesOf(layer::Arch::kLlama).block) continue;
      problems.push_back(
          "model.layer_types (" + loaded.sources.Get("model.layer_types").ToString() +
          ") puts llama_block at layer " + std::to_string(layer + model.layers_per_stage_origin()) +
          ", and " + describe("model.arch", model.arch()) +
          " (rule: a llama block takes its key/value heads, SwiGLU width, RoPE "
          "base and RMSNorm epsilon from the llama keys: set model.arch: llama)");
      break;
    }
  }
  if (int64_t bytes = 0; !values.device().memory_limit().empty()) {
    std::string error;
    if (!memory::ParseByteSize(values.device().memory_limit(), &bytes, &error)) {
      problems.push_back(describe("device.memory_limit", values.device().memory_limit()) + ": " +
                         ExplainSizeError(values.device().memory_limit(), error));
    }
  }
  {
    int64_t bytes = 0;
    std::string error;
    if (!memory::ParseByteSize(parallel.dp_bucket_size(), &bytes, &error)) {
      problems.push_back(describe("parallel.dp_bucket_size", parallel.dp_bucket_size()) + ": " +
                         ExplainSizeError(parallel.dp_bucket_size(), error));
    }
  }
  if (parallel.zero_stage() > 1) {
    problems.push_back(describe("parallel.zero_stage", parallel.zero_stage()) +
                       " must be 0 (the optimizer state replicated over dp) or 1 (ZeRO-1: the "
                       "AdamW state sharded over dp); ZeRO stages 2 and 3 (sharded gradients "
                       "and parameters) are not implemented");
  }
  if (parallel.zero_stage() == 1 && tp > 1) {
    problems.push_back(describe("parallel.zero_stage", parallel.zero_stage()) + " with " +
                       describe("parallel.tp_size", tp) +
                       " (rule: ZeRO-1 shards whole parameters over dp and does not yet shard "
                       "tensor-parallel slices; use parallel.zero_stage=0 with tp_size > 1)");
  }
  const Optim& optim = values.optim();
  auto check_range = [&](const std::string& key, double value, double low, bool low_open,
                         double high, bool high_open, const std::string& rule) {
    const bool ok =
        (low_open ? value > low : value >= low) && (high_open ? value < high : value <= high);
    if (!ok) problems.push_back(describe(key, FormatDouble(value)) + " must be " + rule);
  };
  check_range("train.comm_timeout_seconds", train.comm_timeout_seconds(), 0, true, 1e9, false,
              "> 0");
  check_range("train.straggler_ratio", train.straggler_ratio(), 1, true, 1e9, false,
              "> 1 (a rank as fast as its peers is no straggler)");
  check_range("optim.lr", optim.lr(), 0, true, 1e9, false, "> 0");
  check_range("optim.min_lr", optim.min_lr(), 0, false, optim.lr(), false, "in [0, optim.lr]");
  check_range("optim.beta1", optim.beta1(), 0, false, 1, true, "in [0, 1)");
  check_range("optim.beta2", optim.beta2(), 0, false, 1, true, "in [0, 1)");
  check_range("optim.eps", optim.eps(), 0, true, 1e9, false, "> 0");
  check_range("optim.weight_decay", optim.weight_decay(), 0, false, 1e9, false, ">= 0");
  check_range("optim.grad_clip", optim.grad_clip(), 0, false, 1e18, false,
              ">= 0 (0 turns clipping off)");
  if (values.device().transport() == "nccl" && values.device().backend() != "cuda") {
    problems.push_back(describe("device.transport", values.device().transport()) + " needs " +
                       describe("device.backend", values.device().backend()) +
                       " to be cuda (rule: NCCL moves GPU memory; the cpu backend's tensors "
                       "travel over MPI: set BIGMAC_TRANSPORT to auto or mpi, or unset it)");
  }
  // data.path and data.split: the syntax and the rules that need no file (the files are the
  // data's checks, at start-up, exit 5).
  for (const char* key : {"data.path", "data.split"}) {
    std::vector<std::string> data_problems;
    if (std::string(key) == "data.path") {
      ParseBlend({values.data().path().begin(), values.data().path().end()}, &data_problems);
    } else {
      ParseSplit(values.data().split(), &data_problems);
    }
    for (const std::string& problem : data_problems)
      problems.push_back(problem + " (" + loaded.sources.Get(key).ToString() + ")");
  }
  if (values.precision().dtype() == "fp16") {
    problems.push_back(describe("precision.dtype", values.precision().dtype()) +
                       " needs loss scaling, which BigMac does not have yet: use bf16 (fp32's "
                       "range, no scaling needed) or fp32");
  }
  return problems;
}

ResolvedConfig Resolve(LoadedConfig loaded, int world_size, const std::string& world_source) {
  if (world_size < 1) {
    throw ConfigError(
        {"world_size=" + std::to_string(world_size) + " (" + world_source + ") must be >= 1"});
  }
  if (std::vector<std::string> problems = CheckConstraints(loaded, world_size); !problems.empty()) {
    throw ConfigError(std::move(problems));
  }
  ResolvedConfig resolved;
  const Config& values = loaded.values;
  resolved.world_size = world_size;
  resolved.world_source = Source::Launch(world_source);
  resolved.pp = values.parallel().pp_size();
  resolved.tp = values.parallel().tp_size();
  resolved.dp = DataParallelSize(world_size, resolved.pp, resolved.tp);
  resolved.batch = MakeBatchPlan(values, resolved.dp);
  const partition::PartitionSpec spec = PartitionSpecOf(values, loaded.sources);
  resolved.partition = partition::MakePartition(spec);
  resolved.policy = spec.policy;
  std::vector<std::string> unused;
  resolved.block_types = BlockTypes(values, &unused);
  // Every string below was checked by CheckConstraints or the schema's choices.
  schedule::ParseKind(values.parallel().schedule(), &resolved.schedule);
  device::ParseBackend(values.device().backend(), &resolved.backend);
  resolved.bf16 = values.precision().dtype() == "bf16";
  std::string ignored;
  memory::ParseByteSize(values.parallel().dp_bucket_size(), &resolved.dp_bucket_bytes, &ignored);
  if (!values.device().memory_limit().empty())
    memory::ParseByteSize(values.device().memory_limit(), &resolved.memory_limit_bytes, &ignored);
  resolved.nan_policy = values.train().nan_policy() == "skip" ? NanPolicy::kSkip : NanPolicy::kStop;
  resolved.data.blend =
      ParseBlend({values.data().path().begin(), values.data().path().end()}, &unused);
  resolved.data.split = ParseSplit(values.data().split(), &unused);
  // Materialise derived values, so the log and every consumer see the effective ones.
  if (values.parallel().num_microbatches() == 0) {
    loaded.values.mutable_parallel()->set_num_microbatches(resolved.batch.num_microbatches);
    loaded.sources.Set("parallel.num_microbatches",
                       Source::Derived("= train.gradient_accumulation_steps"));
  }
  if (spec.policy == partition::Policy::kExplicit && loaded.sources.IsDefault("model.partition")) {
    loaded.values.mutable_model()->set_partition(partition::PolicyName(spec.policy));
    loaded.sources.Set("model.partition", Source::Derived("explicit lists given"));
  }
  resolved.hash = ConfigHash(values);
  resolved.loaded = std::move(loaded);
  return resolved;
}

uint64_t ConfigHash(const Config& values) {
  uint64_t hash = 1469598103934665603ULL;
  for (const KeyInfo& key : AllKeys()) {
    for (unsigned char byte : key.path + "=" + FormatValue(values, key) + "\n") {
      hash ^= byte;
      hash *= 1099511628211ULL;
    }
  }
  return hash;
}

std::string DescribeModel(const layer::ModelDims& dims) {
  const bool llama = dims.arch == layer::Arch::kLlama;
  std::string text = std::string(llama ? "llama" : "gpt") + ": " + std::to_string(dims.num_layers) +
                     " blocks, hidden " + std::to_string(dims.hidden_size) + ", " +
                     std::to_string(dims.num_heads) + " heads";
  if (llama) {
    text += " over " + std::to_string(dims.kv_heads()) + " key/value heads, SwiGLU " +
            std::to_string(dims.intermediate_size) + ", " +
            (dims.tie_embeddings ? "tied" : "untied") + " head";
  }
  return text + ", vocab " + std::to_string(dims.vocab_size);
}

ArchLayerTypes LayerTypesOf(layer::Arch arch) {
  if (arch == layer::Arch::kLlama) return {"llama_embedding", "llama_block", "llama_head"};
  return {"gpt_embedding", "gpt_block", "gpt_head"};
}

std::string DefaultBlockType(const Config& values) {
  return LayerTypesOf(ModelDimsOf(values).arch).block;
}

layer::ModelDims ModelDimsOf(const Config& values) {
  const Model& model = values.model();
  layer::ModelDims dims;
  dims.vocab_size = model.vocab_size();
  dims.hidden_size = model.hidden_size();
  dims.num_heads = model.num_heads();
  dims.num_layers = model.num_layers();
  dims.max_seq_length = values.train().seq_length();
  if (model.arch() != "llama") return dims;
  dims.arch = layer::Arch::kLlama;
  dims.num_kv_heads = model.num_kv_heads() > 0 ? model.num_kv_heads() : model.num_heads();
  dims.intermediate_size = model.intermediate_size() > 0
                               ? model.intermediate_size()
                               : layer::DefaultIntermediateSize(model.hidden_size());
  dims.rope_theta = model.rope_theta();
  dims.rms_norm_eps = model.rms_norm_eps();
  dims.tie_embeddings = model.tie_embeddings();
  return dims;
}

}  // namespace bigmac::config
