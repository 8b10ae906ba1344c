#ifndef BIGMAC_CORE_CONFIG_SCHEMA_H_
#define BIGMAC_CORE_CONFIG_SCHEMA_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/config/config.pb.h"
#include "google/protobuf/descriptor.h"

namespace bigmac::config {

// One settable leaf of config.proto, e.g. "parallel.pp_size".
struct KeyInfo {
  std::string path;
  // Message fields from the root Config down to the leaf (the leaf is last).
  std::vector<const google::protobuf::FieldDescriptor*> chain;
  Layer layer = LAYER_UNSPECIFIED;
  std::string help;
  std::vector<std::string> choices;  // empty: any value of the field's type
  bool has_min = false;              // integers: the smallest allowed value
  int64_t min = 0;
  bool has_max = false;  // integers: the largest allowed value
  int64_t max = 0;
  std::string env;  // launch-layer keys: the environment variable the launcher sets

  const google::protobuf::FieldDescriptor* field() const { return chain.back(); }
};

// Every settable key, in schema order. Built from config.proto by reflection.
std::vector<KeyInfo> AllKeys();

// The key at `path`, or nullptr.
const KeyInfo* FindKey(const std::vector<KeyInfo>& keys, std::string_view path);

// The key a name refers to: a full path ("parallel.pp_size"), a leaf name ("pp_size") or another
// framework's name for it ("pipeline_model_parallel_size", "micro_batch"); nullptr if none.
// Launch scripts use it (`bigmac config-key`) to refuse config keys on their command lines.
const KeyInfo* LookupKeyName(const std::vector<KeyInfo>& keys, std::string_view name);

// Why `path` is not a key, as one sentence: a launch-layer key, a derived value, a key written in
// the wrong section or layer, a name from another framework, or a typo with the nearest keys.
std::string ExplainUnknownKey(const std::vector<KeyInfo>& keys, std::string_view path);

// Why a launch-layer key cannot be written in a config file or --set, as one sentence naming the
// variable the launcher sets ("'device.transport' belongs to the launch layer ...").
std::string LaunchKeyRule(const KeyInfo& key);

// The message that holds `key`'s leaf in `values` (a default instance if a section is unset).
const google::protobuf::Message& LeafMessage(const Config& values, const KeyInfo& key);

// The effective value of `key` as text: "4", "1f1b", "[7, 7, 7, 6]".
std::string FormatValue(const Config& values, const KeyInfo& key);

// "launch", "schedule", "model".
std::string LayerName(Layer layer);

// The closest candidates to `word` by edit distance, best first; empty if none is close.
std::vector<std::string> Suggest(std::string_view word, const std::vector<std::string>& candidates);

}  // namespace bigmac::config

#endif  // BIGMAC_CORE_CONFIG_SCHEMA_H_
