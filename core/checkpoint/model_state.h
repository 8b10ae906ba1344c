#ifndef BIGMAC_CORE_CHECKPOINT_MODEL_STATE_H_
#define BIGMAC_CORE_CHECKPOINT_MODEL_STATE_H_

#include <string>
#include <vector>

#include "core/layer/layer.h"
#include "core/layer/tp_layer.h"

namespace bigmac::checkpoint {

// The parameters of one layer that a rank holds, in the layer's order. A tied copy
// (Param::tied_copy) is included: checkpoints never write it, and load it from the tensors of the
// parameter its Param::tied_owner names ("embedding/wte").
struct LayerParams {
  int layer_id = 0;
  std::vector<layer::Param*> params;
  // How this rank holds each of `params` over its tp group (core/layer/tp_layer.h); empty: every
  // parameter whole. Checkpoints hold full tensors: tp ranks gather slices to write, and slice
  // what they read.
  std::vector<layer::TpShard> shards;
};

// A view of the parameters one rank holds, by layer_id, in model order: what checkpoints read and
// write (the fp32 master `value` of each Param, and its AdamW moments; nothing else). The view owns
// nothing: the layers and their Params must outlive it. The engine builds it
// (engine::RankModel::State()); the checkpoint code never sees the engine.
struct ModelState {
  int num_layers = 0;  // model.num_layers: how layer_ids are named (embedding, blocks, head)
  std::vector<LayerParams> layers;
};

// A parameter's name in checkpoints and error messages: "block 3/attn.qkv.weight".
std::string ParamName(const ModelState& state, int layer_id, const layer::Param& param);

}  // namespace bigmac::checkpoint

#endif  // BIGMAC_CORE_CHECKPOINT_MODEL_STATE_H_
