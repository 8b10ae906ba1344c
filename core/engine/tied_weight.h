#ifndef BIGMAC_CORE_ENGINE_TIED_WEIGHT_H_
#define BIGMAC_CORE_ENGINE_TIED_WEIGHT_H_

#include <string>

#include "core/comm/peer_links.h"
#include "core/layer/layer.h"

namespace bigmac::engine {

// One tied weight as one pipeline rank sees it: the owner's parameter, the copy's, both (owner
// and copy on this rank) or neither. The one place for the tied-weight protocol:
//   after the backward:   the copy's gradient is added into the owner's and zeroed;
//   after the owner's step (or a skipped step): the owner's value goes to the copy, whose
//   compute copy is refreshed.
// Between ranks these travel over the pipeline transport (tags kTiedGradientTag/kTiedWeightTag).
// The parameters belong to the stage's layers, which outlive this object.
class TiedWeight {
 public:
  // `owner`/`copy` are null when they are not on this rank; `owner_rank`/`copy_rank` are the pp
  // ranks holding them.
  TiedWeight(std::string name, layer::Param* owner, layer::Param* copy, int owner_rank,
             int copy_rank);

  const std::string& name() const { return name_; }  // "embedding/wte"
  layer::Param* owner() const { return owner_; }
  layer::Param* copy() const { return copy_; }
  bool local() const { return owner_ && copy_; }

  // `links` may be null when the weight is local (or not on this rank at all).
  void ReduceGradient(comm::PeerLinks* links);
  void SyncValue(comm::PeerLinks* links);

 private:
  std::string name_;
  layer::Param* owner_;
  layer::Param* copy_;
  int owner_rank_;
  int copy_rank_;
};

}  // namespace bigmac::engine

#endif  // BIGMAC_CORE_ENGINE_TIED_WEIGHT_H_
