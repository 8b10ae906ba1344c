#ifndef BIGMAC_CORE_CHECKPOINT_SAFETENSORS_H_
#define BIGMAC_CORE_CHECKPOINT_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/checkpoint/model_state.h"
#include "core/layer/layer.h"

namespace bigmac::checkpoint {

// One float32 tensor of a safetensors file.
struct NamedTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;
};

// The safetensors format (huggingface/safetensors): an 8-byte little-endian header length N, N
// bytes of JSON {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}
// padded with spaces to a multiple of 8, then the data buffer. Written whole or not at all
// (util::OutputFile); throws util::OutputError naming the file and the OS's reason.
void WriteSafetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                      const std::map<std::string, std::string>& metadata);

// Reads and validates a file against the specification: the header length fits, the header is a
// JSON object, every entry has a known dtype (only F32 is accepted), a shape and offsets that
// match it, and the entries cover the data buffer exactly, without holes or overlaps (a gap is
// reported with the tensors around it, and those of `required`, the names the caller needs, that
// have no entry). Throws CheckpointError naming the file and the problem.
std::vector<NamedTensor> ReadSafetensors(const std::string& path,
                                         const std::vector<std::string>& required = {});

// The names ToHuggingFace writes for `state`: what an import requires.
std::vector<std::string> HuggingFaceNames(const ModelState& state, const layer::ModelDims& dims,
                                          const std::vector<std::string>& block_types);

// The model's parameters under Hugging Face's names and layouts for dims.arch: GPT2LMHeadModel's
// (Conv1D weights are [in, out], the transpose of ours: transformer.wte.weight,
// transformer.h.0.attn.c_attn.weight, ...) or LlamaForCausalLM's (model.embed_tokens.weight,
// model.layers.0.self_attn.q_proj.weight, ..., model.norm.weight, lm_head.weight unless tied; our
// fused q|k|v and gate|up split by rows). `state` must hold the whole model (pp = 1).
// `block_types` (config::ResolvedConfig's; empty: the architecture's block): a block of another
// type (a plugin's) has no Hugging Face names, and its parameters go under their own, below the
// architecture's block prefix: transformer.h.1.norm1.weight, model.layers.1.norm1.weight.
std::vector<NamedTensor> ToHuggingFace(const ModelState& state, const layer::ModelDims& dims,
                                       const std::vector<std::string>& block_types = {});

// The reverse: sets the master values of `state` (tied copies too) from those tensors, checking
// that every one is present with the shape the config implies. Returns the names of the file's
// tensors the model has no place for (an untied head's lm_head.weight imported as tied, ...), for
// the caller to report. Throws CheckpointError.
std::vector<std::string> FromHuggingFace(const std::vector<NamedTensor>& tensors,
                                         const ModelState& state, const layer::ModelDims& dims,
                                         const std::vector<std::string>& block_types,
                                         const std::string& source);

// The config.json that transformers' from_pretrained reads beside the weights: LlamaConfig's
// or GPT2Config's fields for `dims`.
std::string HuggingFaceConfigJson(const layer::ModelDims& dims);

}  // namespace bigmac::checkpoint

#endif  // BIGMAC_CORE_CHECKPOINT_SAFETENSORS_H_
