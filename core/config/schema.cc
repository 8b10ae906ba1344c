#include "core/config/schema.h"

#include <algorithm>
#include <map>

#include "core/util/format.h"
#include "google/protobuf/text_format.h"

namespace bigmac::config {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;

std::vector<std::string> SplitCommaList(const std::string& text) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= text.size() && !text.empty()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    parts.push_back(text.substr(start, comma - start));
    start = comma + 1;
  }
  return parts;
}

void CollectKeys(const Descriptor* message, const std::string& prefix,
                 std::vector<const FieldDescriptor*>& chain, std::vector<KeyInfo>& keys) {
  for (int i = 0; i < message->field_count(); ++i) {
    const FieldDescriptor* field = message->field(i);
    chain.push_back(field);
    const std::string path = prefix.empty() ? field->name() : prefix + "." + field->name();
    if (field->type() == FieldDescriptor::TYPE_MESSAGE) {
      CollectKeys(field->message_type(), path, chain, keys);
    } else {
      const auto& options = field->options();
      keys.push_back(KeyInfo{path, chain, options.GetExtension(layer), options.GetExtension(help),
                             SplitCommaList(options.GetExtension(choices)),
                             options.HasExtension(min), options.GetExtension(min),
                             options.HasExtension(max), options.GetExtension(max),
                             options.GetExtension(env)});
    }
    chain.pop_back();
  }
}

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t substitution = diagonal + (a[i - 1] == b[j - 1] ? 0 : 1);
      diagonal = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, substitution});
    }
  }
  return row[b.size()];
}

std::string LastComponent(std::string_view path) {
  const size_t dot = path.rfind('.');
  return std::string(dot == std::string_view::npos ? path : path.substr(dot + 1));
}

std::string FirstComponent(std::string_view path) {
  return std::string(path.substr(0, path.find('.')));
}

// Settings that belong to the launcher (mpirun / sbatch), never to a config file.
bool IsLaunchKey(const std::string& name) {
  static const char* const kLaunchKeys[] = {
      "world_size",    "nnodes",         "num_nodes",   "nodes",
      "gpus_per_node", "nproc_per_node", "num_gpus",    "cuda_visible_devices",
      "devices",       "master_addr",    "master_port", "rank",
      "local_rank",    "node_rank",      "hostfile"};
  return std::find(std::begin(kLaunchKeys), std::end(kLaunchKeys), name) != std::end(kLaunchKeys);
}

// Values the program derives; writing them would create a second, conflicting source of truth.
std::string DerivedKeyRule(const std::string& name) {
  static const std::map<std::string, std::string> kDerived = {
      {"dp", "dp"},
      {"dp_size", "dp"},
      {"data_parallel_size", "dp"},
      {"dp_degree", "dp"},
      {"global_batch_size", "global_batch"},
      {"global_batch", "global_batch"},
      {"global_bs", "global_batch"},
  };
  auto it = kDerived.find(name);
  if (it == kDerived.end()) return "";
  if (it->second == "dp") {
    return "dp is derived as world_size / (pp_size * tp_size) and is never written: set the "
           "process count in the launcher (mpirun -np / sbatch) and parallel.pp_size, "
           "parallel.tp_size in the config";
  }
  return "the global batch is derived as train.micro_batch_size * "
         "train.gradient_accumulation_steps * dp and is never written: set those instead";
}

// Names other trainers use for our keys (Megatron-LM, DeepSpeed, nanoGPT, the seeds' skeleton).
std::string ForeignAlias(const std::string& name) {
  static const std::map<std::string, std::string> kAliases = {
      {"pipeline_size", "parallel.pp_size"},
      {"pipeline_model_parallel_size", "parallel.pp_size"},
      {"pipeline_parallel_size", "parallel.pp_size"},
      {"pp", "parallel.pp_size"},
      {"tensor_model_parallel_size", "parallel.tp_size"},
      {"tensor_parallel_size", "parallel.tp_size"},
      {"tp", "parallel.tp_size"},
      {"virtual_pipeline_model_parallel_size", "parallel.virtual_stages"},
      {"micro_batch", "train.micro_batch_size"},
      {"train_micro_batch_size_per_gpu", "train.micro_batch_size"},
      {"micro_bs", "train.micro_batch_size"},
      {"accum", "train.gradient_accumulation_steps"},
      {"seq_len", "train.seq_length"},
      {"max_seq_len", "train.seq_length"},
      {"sequence_length", "train.seq_length"},
      {"n_layer", "model.num_layers"},
      {"n_embd", "model.hidden_size"},
      {"n_head", "model.num_heads"},
      {"num_attention_heads", "model.num_heads"},
  };
  auto it = kAliases.find(name);
  return it == kAliases.end() ? "" : it->second;
}

}  // namespace

std::vector<KeyInfo> AllKeys() {
  std::vector<KeyInfo> keys;
  std::vector<const FieldDescriptor*> chain;
  CollectKeys(Config::descriptor(), "", chain, keys);
  return keys;
}

const KeyInfo* FindKey(const std::vector<KeyInfo>& keys, std::string_view path) {
  for (const KeyInfo& key : keys) {
    if (key.path == path) return &key;
  }
  return nullptr;
}

const google::protobuf::Message& LeafMessage(const Config& values, const KeyInfo& key) {
  const google::protobuf::Message* message = &values;
  for (size_t i = 0; i + 1 < key.chain.size(); ++i) {
    message = &message->GetReflection()->GetMessage(*message, key.chain[i]);
  }
  return *message;
}

std::string FormatValue(const Config& values, const KeyInfo& key) {
  const google::protobuf::Message& message = LeafMessage(values, key);
  const FieldDescriptor* field = key.field();
  const google::protobuf::Reflection* reflection = message.GetReflection();
  google::protobuf::TextFormat::Printer printer;
  if (!field->is_repeated()) {
    std::string text;
    printer.PrintFieldValueToString(message, field, -1, &text);
    if (field->cpp_type() == FieldDescriptor::CPPTYPE_STRING)
      return reflection->GetString(message, field);
    return text;
  }
  std::string text = "[";
  for (int i = 0; i < reflection->FieldSize(message, field); ++i) {
    std::string item;
    printer.PrintFieldValueToString(message, field, i, &item);
    text += (i ? ", " : "") + item;
  }
  return text + "]";
}

std::string LayerName(Layer layer) {
  switch (layer) {
    case LAUNCH:
      return "launch";
    case SCHEDULE:
      return "schedule";
    case MODEL:
      return "model";
    default:
      return "unspecified";
  }
}

std::vector<std::string> Suggest(std::string_view word,
                                 const std::vector<std::string>& candidates) {
  const size_t limit = std::max<size_t>(2, word.size() / 3);
  std::vector<std::pair<size_t, std::string>> scored;
  for (const std::string& candidate : candidates) {
    const size_t distance = EditDistance(word, candidate);
    if (distance <= limit) scored.emplace_back(distance, candidate);
  }
  std::stable_sort(scored.begin(), scored.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::string> best;
  for (const auto& [distance, candidate] : scored) {
    if (best.size() < 3) best.push_back(candidate);
  }
  return best;
}

std::string LaunchKeyRule(const KeyInfo& key) {
  std::string choices;
  for (const std::string& choice : key.choices) choices += (choices.empty() ? "" : "|") + choice;
  const std::string value = choices.empty() ? "VALUE" : choices;
  std::string option = LastComponent(key.path);
  std::replace(option.begin(), option.end(), '_', '-');
  return "'" + key.path +
         "' belongs to the launch layer (how many processes, which devices, how they connect): "
         "the launcher sets it as " +
         key.env + "=" + value + " (bigmac-mpirun --" + option + " VALUE, or `export " + key.env +
         "=VALUE` in a batch script), never the config file or --set";
}

const KeyInfo* LookupKeyName(const std::vector<KeyInfo>& keys, std::string_view name) {
  if (const KeyInfo* key = FindKey(keys, name)) return key;
  const std::string alias = ForeignAlias(std::string(name));
  for (const KeyInfo& key : keys) {
    if (LastComponent(key.path) == name || key.path == alias) return &key;
  }
  return nullptr;
}

std::string ExplainUnknownKey(const std::vector<KeyInfo>& keys, std::string_view path) {
  const std::string name = LastComponent(path);
  const std::string quoted = "'" + std::string(path) + "'";
  if (IsLaunchKey(name)) {
    return quoted +
           " belongs to the launch layer (how many processes, which devices, how they "
           "connect): set it in the mpirun/sbatch line (see launch/), never in the config; "
           "world_size is read from MPI";
  }
  if (std::string rule = DerivedKeyRule(name); !rule.empty()) {
    return quoted + " cannot be set: " + rule;
  }
  // The right name in the wrong section, possibly in another layer.
  for (const KeyInfo& key : keys) {
    if (LastComponent(key.path) == name && key.layer == LAUNCH) return LaunchKeyRule(key);
    if (LastComponent(key.path) == name) {
      return quoted + " is in the wrong place: " + name + " belongs to the " +
             LayerName(key.layer) + " layer; write it as '" + key.path + "'";
    }
  }
  if (std::string alias = ForeignAlias(name); !alias.empty()) {
    return "unknown key " + quoted + "; did you mean '" + alias + "'?";
  }
  std::vector<std::string> sections;
  std::vector<std::string> paths;
  for (const KeyInfo& key : keys) {
    paths.push_back(key.path);
    const std::string section = FirstComponent(key.path);
    if (std::find(sections.begin(), sections.end(), section) == sections.end()) {
      sections.push_back(section);
    }
  }
  const std::string section = FirstComponent(path);
  if (std::find(sections.begin(), sections.end(), section) == sections.end()) {
    std::vector<std::string> near = Suggest(section, sections);
    return "unknown section '" + section + "'" +
           (path.find('.') == std::string_view::npos ? "" : " in " + quoted) +
           (near.empty() ? "" : "; did you mean '" + near.front() + "'?") +
           " (sections: " + util::Join(sections, ", ") + ")";
  }
  std::vector<std::string> near = Suggest(path, paths);
  if (!near.empty()) return "unknown key " + quoted + "; did you mean '" + near.front() + "'?";
  std::vector<std::string> in_section;
  for (const std::string& candidate : paths) {
    if (FirstComponent(candidate) == section) in_section.push_back(candidate);
  }
  return "unknown key " + quoted + " (keys in '" + section + "': " + util::Join(in_section, ", ") +
         ")";
}

}  // namespace bigmac::config
