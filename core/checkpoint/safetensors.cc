#include "core/checkpoint/safetensors.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <tuple>

#include "core/checkpoint/checkpoint.h"
#include "core/config/resolve.h"
#include "core/util/files.h"
#include "core/util/output_file.h"
#include "nlohmann/json.hpp"

namespace bigmac::checkpoint {
namespace {

// Our parameter name -> (Hugging Face name, transposed?, which rows). A fused tensor of ours
// (llama's q|k|v and gate|up) is several of theirs, each a range of its rows.
struct Mapping {
  int layer_id;
  std::string ours;
  std::string theirs;
  bool transpose = false;
  int64_t row_begin = 0;
  int64_t rows = -1;  // -1: all
};

// A GPT-2 block's parameters and their Hugging Face names under `h` ("transformer.h.3.").
std::vector<Mapping> Gpt2BlockMappings(int i, const std::string& h) {
  return {
      {i, "ln1.weight", h + "ln_1.weight"},
      {i, "ln1.bias", h + "ln_1.bias"},
      {i, "attn.qkv.weight", h + "attn.c_attn.weight", true},
      {i, "attn.qkv.bias", h + "attn.c_attn.bias"},
      {i, "attn.proj.weight", h + "attn.c_proj.weight", true},
      {i, "attn.proj.bias", h + "attn.c_proj.bias"},
      {i, "ln2.weight", h + "ln_2.weight"},
      {i, "ln2.bias", h + "ln_2.bias"},
      {i, "mlp.fc.weight", h + "mlp.c_fc.weight", true},
      {i, "mlp.fc.bias", h + "mlp.c_fc.bias"},
      {i, "mlp.proj.weight", h + "mlp.c_proj.weight", true},
      {i, "mlp.proj.bias", h + "mlp.c_proj.bias"},
  };
}

// A llama block's parameters under LlamaForCausalLM's names (`h`: "model.layers.3."): the same
// [out, in] layout as ours; q|k|v and gate|up split by rows.
std::vector<Mapping> LlamaBlockMappings(int i, const std::string& h, const layer::ModelDims& dims) {
  const int64_t c = dims.hidden_size;
  const int64_t kv_width = int64_t{dims.kv_heads()} * dims.head_dim();
  const int64_t inner = dims.intermediate_size;
  const std::string qkv = "self_attn.qkv_proj.weight";
  const std::string gate_up = "mlp.gate_up_proj.weight";
  return {
      {i, "input_layernorm.weight", h + "input_layernorm.weight"},
      {i, qkv, h + "self_attn.q_proj.weight", false, 0, c},
      {i, qkv, h + "self_attn.k_proj.weight", false, c, kv_width},
      {i, qkv, h + "self_attn.v_proj.weight", false, c + kv_width, kv_width},
      {i, "self_attn.o_proj.weight", h + "self_attn.o_proj.weight"},
      {i, "post_attention_layernorm.weight", h + "post_attention_layernorm.weight"},
      {i, gate_up, h + "mlp.gate_proj.weight", false, 0, inner},
      {i, gate_up, h + "mlp.up_proj.weight", false, inner, inner},
      {i, "mlp.down_proj.weight", h + "mlp.down_proj.weight"},
  };
}

// Every parameter of `state` and its name in the file: the architecture's blocks under Hugging
// Face's names; a block of another type (a plugin's, `block_types`) under its own parameter names
// ("transformer.h.1.norm1.weight"), as stored, which no Hugging Face class reads but import reads
// back.
std::vector<Mapping> HuggingFaceMappings(const ModelState& state, const layer::ModelDims& dims,
                                         const std::vector<std::string>& block_types) {
  const bool llama = dims.arch == layer::Arch::kLlama;
  const int head = layer::HeadLayerId(state.num_layers);
  std::vector<Mapping> mappings;
  if (llama) {
    mappings.push_back({layer::kEmbeddingLayerId, "wte", "model.embed_tokens.weight"});
  } else {
    mappings.push_back({layer::kEmbeddingLayerId, "wte", "transformer.wte.weight"});
    mappings.push_back({layer::kEmbeddingLayerId, "wpe", "transformer.wpe.weight"});
  }
  const std::string own_block = config::LayerTypesOf(dims.arch).block;
  for (int i = 0; i < state.num_layers; ++i) {
    const std::string h = (llama ? "model.layers." : "transformer.h.") + std::to_string(i) + ".";
    if (block_types.empty() || block_types.at(i) == own_block) {
      for (const Mapping& m : llama ? LlamaBlockMappings(i, h, dims) : Gpt2BlockMappings(i, h))
        mappings.push_back(m);
      continue;
    }
    for (const LayerParams& layer : state.layers) {
      if (layer.layer_id != i) continue;
      for (const layer::Param* param : layer.params)
        mappings.push_back({i, param->name, h + param->name});
    }
  }
  if (llama) {
    mappings.push_back({head, "norm.weight", "model.norm.weight"});
    if (!dims.tied_head()) mappings.push_back({head, "lm_head.weight", "lm_head.weight"});
  } else {
    mappings.push_back({head, "lnf.weight", "transformer.ln_f.weight"});
    mappings.push_back({head, "lnf.bias", "transformer.ln_f.bias"});
  }
  return mappings;
}

// The shape of mapping `m`'s tensor in the file, from our parameter's.
std::vector<int64_t> TheirShape(const Mapping& m, const layer::Param& param) {
  std::vector<int64_t> shape = param.value.shape();
  if (m.rows >= 0) shape[0] = m.rows;
  if (m.transpose) std::swap(shape[0], shape[1]);
  return shape;
}

layer::Param* FindParam(const ModelState& state, int layer_id, const std::string& name) {
  for (const LayerParams& layer : state.layers) {
    if (layer.layer_id != layer_id) continue;
    for (layer::Param* param : layer.params) {
      if (param->name == name) return param;
    }
  }
  return nullptr;
}

// [rows, cols] row-major -> [cols, rows].
std::vector<float> Transposed(const float* data, int64_t rows, int64_t cols) {
  std::vector<float> out(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) out[c * rows + r] = data[r * cols + c];
  }
  return out;
}

}  // namespace

void WriteSafetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const NamedTensor& t : tensors) {
    const uint64_t bytes = t.data.size() * sizeof(float);
    header[t.name] = {
        {"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string json = header.dump();
  while ((8 + json.size()) % 8 != 0) json.push_back(' ');
  std::string problem;
  std::unique_ptr<util::OutputFile> out = util::OutputFile::Open(path, &problem);
  if (!out) throw util::OutputError(problem);
  unsigned char length[8];
  for (int i = 0; i < 8; ++i)
    length[i] = static_cast<unsigned char>((uint64_t{json.size()} >> (8 * i)) & 0xff);
  out->Write(std::string_view(reinterpret_cast<const char*>(length), 8));
  out->Write(json);
  for (const NamedTensor& t : tensors) {
    out->Write(std::string_view(reinterpret_cast<const char*>(t.data.data()),
                                t.data.size() * sizeof(float)));
  }
  if (problem = out->Commit(); !problem.empty()) throw util::OutputError(problem);
}

namespace {
std::vector<NamedTensor> ParseSafetensors(const std::string& path,
                                          const std::vector<std::string>& required);
}  // namespace

std::vector<NamedTensor> ReadSafetensors(const std::string& path,
                                         const std::vector<std::string>& required) {
  try {
    return ParseSafetensors(path, required);
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(path + ": malformed header entry: " + e.what());
  }
}

namespace {

// A tensor's place in the data buffer.
struct Extent {
  uint64_t begin;
  uint64_t end;
  std::string name;
  bool operator<(const Extent& other) const {
    return std::tie(begin, end, name) < std::tie(other.begin, other.end, other.name);
  }
};

// "tensor transformer.h.0.ln_1.bias [1024, 1152)".
std::string Describe(const Extent& e) {
  return "tensor " + e.name + " [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + ")";
}

// "; missing here: transformer.h.0.ln_1.bias, ... and 3 more", or "".
std::string MissingNames(const std::vector<std::string>& missing) {
  if (missing.empty()) return "";
  const size_t shown = std::min<size_t>(missing.size(), 3);
  std::string text = "; missing here: ";
  for (size_t i = 0; i < shown; ++i) text += (i ? ", " : "") + missing[i];
  if (missing.size() > shown) text += " and " + std::to_string(missing.size() - shown) + " more";
  return text;
}

// The entries must cover the buffer exactly. A gap is most often a tensor whose header entry was
// lost, so the message names the tensors around it and the `missing` names the reader needs, not
// only a byte offset.
void CheckCoverage(const std::string& path, std::vector<Extent> extents, uint64_t buffer_size,
                   const std::vector<std::string>& missing) {
  std::sort(extents.begin(), extents.end());
  uint64_t covered = 0;
  const Extent* previous = nullptr;
  for (const Extent& e : extents) {
    if (e.begin < covered) {
      throw CheckpointError(path + ": " + Describe(*previous) + " and " + Describe(e) +
                            " overlap in the data buffer");
    }
    if (e.begin > covered) {
      throw CheckpointError(path + ": bytes [" + std::to_string(covered) + ", " +
                            std::to_string(e.begin) + ") of the data buffer belong to no tensor (" +
                            (previous ? "after " + Describe(*previous) + ", " : std::string("")) +
                            "before " + Describe(e) + "): a tensor's header entry is missing" +
                            MissingNames(missing));
    }
    covered = e.end;
    previous = &e;
  }
  if (covered != buffer_size) {
    throw CheckpointError(path + ": " + std::to_string(buffer_size - covered) +
                          " bytes of the data buffer after the last tensor" +
                          (previous ? " (" + Describe(*previous) + ")" : std::string("")) +
                          " belong to no tensor: a tensor's header entry is missing" +
                          MissingNames(missing));
  }
}

std::vector<NamedTensor> ParseSafetensors(const std::string& path,
                                          const std::vector<std::string>& required) {
  std::string bytes;
  if (std::string problem = util::ReadUserFile(path, std::numeric_limits<uint64_t>::max(),
                                               "safetensors file", &bytes);
      !problem.empty()) {
    throw CheckpointError(problem);
  }
  if (bytes.size() < 8) throw CheckpointError(path + ": shorter than the 8-byte header length");
  uint64_t length = 0;
  for (int i = 0; i < 8; ++i) length |= uint64_t{static_cast<unsigned char>(bytes[i])} << (8 * i);
  if (length > bytes.size() - 8) {
    throw CheckpointError(path + ": header length " + std::to_string(length) + " exceeds the file");
  }
  const std::string header_text = bytes.substr(8, length);
  // The format allows only trailing spaces as padding after the JSON.
  if (header_text.find('\0') != std::string::npos) {
    throw CheckpointError(path + ": the header is not JSON: it holds a NUL byte at " +
                          std::to_string(header_text.find('\0')));
  }
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(header_text);
  } catch (const std::exception& e) {
    throw CheckpointError(path + ": the header is not JSON: " + e.what());
  }
  if (!header.is_object()) throw CheckpointError(path + ": the header is not a JSON object");
  const uint64_t buffer_size = bytes.size() - 8 - length;
  const char* buffer = bytes.data() + 8 + length;
  std::vector<Extent> extents;
  std::vector<NamedTensor> tensors;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    const std::string where = path + ": tensor " + name;
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") ||
        !entry.contains("data_offsets")) {
      throw CheckpointError(where + ": needs dtype, shape and data_offsets");
    }
    const std::string dtype = entry["dtype"].get<std::string>();
    static const std::set<std::string> kKnown = {"BOOL", "U8",   "I8",  "I16",     "U16",
                                                 "F16",  "BF16", "I32", "U32",     "F32",
                                                 "F64",  "I64",  "U64", "F8_E4M3", "F8_E5M2"};
    if (!kKnown.count(dtype)) throw CheckpointError(where + ": unknown dtype " + dtype);
    if (dtype != "F32")
      throw CheckpointError(where + ": dtype " + dtype + " is not supported (BigMac imports F32)");
    NamedTensor t;
    t.name = name;
    // A shape whose byte count overflows is refused; otherwise data_offsets must match it and lie
    // inside the buffer (below) before anything is allocated.
    uint64_t numel = 1;
    if (!entry["shape"].is_array()) throw CheckpointError(where + ": shape must be a list");
    for (const auto& extent : entry["shape"]) {
      if (!extent.is_number_unsigned())
        throw CheckpointError(where + ": shape entries must be non-negative integers");
      const uint64_t dim = extent.get<uint64_t>();
      if (dim != 0 && numel > (UINT64_MAX / 4) / dim) {
        throw CheckpointError(where + ": shape " + entry["shape"].dump() +
                              " overflows a 64-bit byte count");
      }
      numel *= dim;
      t.shape.push_back(static_cast<int64_t>(dim));
    }
    const auto& offsets = entry["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2)
      throw CheckpointError(where + ": data_offsets must be [begin, end]");
    const uint64_t begin = offsets[0].get<uint64_t>();
    const uint64_t end = offsets[1].get<uint64_t>();
    if (begin > end || end > buffer_size || end - begin != numel * 4) {
      throw CheckpointError(where + ": data_offsets [" + std::to_string(begin) + ", " +
                            std::to_string(end) + "] do not match its shape or lie outside the " +
                            std::to_string(buffer_size) + "-byte buffer");
    }
    extents.push_back({begin, end, name});
    t.data.resize(numel);
    std::memcpy(t.data.data(), buffer + begin, end - begin);
    tensors.push_back(std::move(t));
  }
  std::vector<std::string> missing;
  for (const std::string& name : required) {
    if (!header.contains(name)) missing.push_back(name);
  }
  CheckCoverage(path, std::move(extents), buffer_size, missing);
  return tensors;
}

}  // namespace

std::vector<NamedTensor> ToHuggingFace(const ModelState& state, const layer::ModelDims& dims,
                                       const std::vector<std::string>& block_types) {
  std::vector<NamedTensor> tensors;
  for (const Mapping& m : HuggingFaceMappings(state, dims, block_types)) {
    layer::Param* param = FindParam(state, m.layer_id, m.ours);
    if (!param) throw CheckpointError("export needs the whole model; " + m.ours + " is not here");
    std::vector<float> host(param->value.numel());
    param->value.CopyToHost(host.data());  // device memory through the host
    NamedTensor t;
    t.name = m.theirs;
    t.shape = TheirShape(m, *param);
    if (m.transpose) {
      t.data = Transposed(host.data(), t.shape[1], t.shape[0]);
    } else {
      const int64_t row = param->value.shape().size() > 1 ? param->value.shape()[1] : 1;
      const int64_t begin = m.row_begin * row;
      const int64_t count = m.rows >= 0 ? m.rows * row : param->value.numel();
      t.data.assign(host.begin() + begin, host.begin() + begin + count);
    }
    tensors.push_back(std::move(t));
  }
  return tensors;
}

std::vector<std::string> HuggingFaceNames(const ModelState& state, const layer::ModelDims& dims,
                                          const std::vector<std::string>& block_types) {
  std::vector<std::string> names;
  for (const Mapping& m : HuggingFaceMappings(state, dims, block_types)) names.push_back(m.theirs);
  return names;
}

std::vector<std::string> FromHuggingFace(const std::vector<NamedTensor>& tensors,
                                         const ModelState& state, const layer::ModelDims& dims,
                                         const std::vector<std::string>& block_types,
                                         const std::string& source) {
  std::map<std::string, const NamedTensor*> by_name;
  for (const NamedTensor& t : tensors) by_name[t.name] = &t;
  std::set<std::string> used;
  // Each parameter's new value, assembled on the host (a fused one from several tensors).
  std::map<layer::Param*, std::vector<float>> values;
  std::map<std::string, const layer::Param*> set;  // by checkpoint name, for the tied copies
  for (const Mapping& m : HuggingFaceMappings(state, dims, block_types)) {
    layer::Param* param = FindParam(state, m.layer_id, m.ours);
    if (!param) throw CheckpointError("import needs the whole model; " + m.ours + " is not here");
    auto it = by_name.find(m.theirs);
    if (it == by_name.end()) throw CheckpointError(source + ": " + m.theirs + " is missing");
    used.insert(m.theirs);
    const std::vector<int64_t> want = TheirShape(m, *param);
    const NamedTensor& t = *it->second;
    // A Hugging Face position table may be longer than our sequence: take its first rows.
    const bool longer_positions = m.theirs == "transformer.wpe.weight" && t.shape.size() == 2 &&
                                  t.shape[1] == want[1] && t.shape[0] >= want[0];
    if (t.shape != want && !longer_positions) {
      std::string got, wanted;
      for (int64_t e : t.shape) got += (got.empty() ? "" : ", ") + std::to_string(e);
      for (int64_t e : want) wanted += (wanted.empty() ? "" : ", ") + std::to_string(e);
      throw CheckpointError(source + ": " + m.theirs + " has shape [" + got +
                            "], this config needs [" + wanted + "]");
    }
    std::vector<float>& value = values[param];
    value.resize(param->value.numel());
    if (m.transpose) {
      value = Transposed(t.data.data(), want[0], want[1]);
    } else {
      const int64_t row = param->value.shape().size() > 1 ? param->value.shape()[1] : 1;
      const int64_t count = m.rows >= 0 ? m.rows * row : param->value.numel();
      std::copy(t.data.begin(), t.data.begin() + count, value.begin() + m.row_begin * row);
    }
    set[ParamName(state, m.layer_id, *param)] = param;
  }
  for (auto& [param, value] : values) param->value.CopyFromHost(value.data());
  for (const LayerParams& layer : state.layers) {
    for (layer::Param* param : layer.params) {
      if (!param->tied_copy) continue;
      auto owner = set.find(param->tied_owner);
      if (owner == set.end()) {
        throw CheckpointError(source + ": the tied copy of " + param->tied_owner +
                              " needs its owner on this rank");
      }
      param->value.CopyFrom(owner->second->value);
    }
  }
  std::vector<std::string> unused;
  for (const NamedTensor& t : tensors) {
    if (!used.count(t.name)) unused.push_back(t.name);
  }
  return unused;
}

std::string HuggingFaceConfigJson(const layer::ModelDims& dims) {
  nlohmann::ordered_json config;
  if (dims.arch == layer::Arch::kLlama) {
    config = {
        {"architectures", {"LlamaForCausalLM"}},
        {"model_type", "llama"},
        {"vocab_size", dims.vocab_size},
        {"hidden_size", dims.hidden_size},
        {"intermediate_size", dims.intermediate_size},
        {"num_hidden_layers", dims.num_layers},
        {"num_attention_heads", dims.num_heads},
        {"num_key_value_heads", dims.kv_heads()},
        {"head_dim", dims.head_dim()},
        {"hidden_act", "silu"},
        {"max_position_embeddings", dims.max_seq_length},
        {"rms_norm_eps", dims.rms_norm_eps},
        {"rope_theta", dims.rope_theta},
        {"attention_bias", false},
        {"mlp_bias", false},
        {"tie_word_embeddings", dims.tie_embeddings},
        {"torch_dtype", "float32"},
    };
  } else {
    config = {
        {"architectures", {"GPT2LMHeadModel"}}, {"model_type", "gpt2"},
        {"vocab_size", dims.vocab_size},        {"n_embd", dims.hidden_size},
        {"n_layer", dims.num_layers},           {"n_head", dims.num_heads},
        {"n_positions", dims.max_seq_length},   {"n_inner", 4 * dims.hidden_size},
        {"activation_function", "gelu_new"},    {"layer_norm_epsilon", 1e-5},
        {"tie_word_embeddings", true},          {"torch_dtype", "float32"},
    };
  }
  return config.dump(2) + "\n";
}

}  // namespace bigmac::checkpoint
