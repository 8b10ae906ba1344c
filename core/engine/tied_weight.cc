#include "core/engine/tied_weight.h"

#include <stdexcept>

namespace bigmac::engine {

TiedWeight::TiedWeight(std::string name, layer::Param* owner, layer::Param* copy, int owner_rank,
                       int copy_rank)
    : name_(std::move(name)),
      owner_(owner),
      copy_(copy),
      owner_rank_(owner_rank),
      copy_rank_(copy_rank) {}

namespace {
comm::PeerLinks& Need(comm::PeerLinks* links, const std::string& what) {
  if (links == nullptr) throw std::logic_error(what + ": owner and copy are on different ranks");
  return *links;
}
}  // namespace

void TiedWeight::ReduceGradient(comm::PeerLinks* links) {
  if (local()) {
    owner_->grad.device()->AddInto(owner_->grad.raw(), copy_->grad.raw(), owner_->grad.dtype(),
                                   owner_->grad.numel());
    copy_->grad.Zero();
  } else if (copy_) {
    Need(links, name_)
        .Send(copy_->grad.Clone(), owner_rank_, comm::kTiedGradientTag,
              "tied gradient of " + name_);
    copy_->grad.Zero();
  } else if (owner_) {
    const memory::Tensor grad =
        Need(links, name_)
            .Receive(copy_rank_, comm::kTiedGradientTag, owner_->grad.shape(), owner_->grad.dtype(),
                     owner_->grad.device(), "ReduceTied gradient of " + name_);
    owner_->grad.device()->AddInto(owner_->grad.raw(), grad.raw(), owner_->grad.dtype(),
                                   owner_->grad.numel());
  }
}

void TiedWeight::SyncValue(comm::PeerLinks* links) {
  if (local()) {
    copy_->value.CopyFrom(owner_->value);
  } else if (owner_) {
    Need(links, name_)
        .Send(owner_->value.Clone(), copy_rank_, comm::kTiedWeightTag, "tied weight " + name_);
  } else if (copy_) {
    const memory::Tensor value =
        Need(links, name_)
            .Receive(owner_rank_, comm::kTiedWeightTag, copy_->value.shape(), copy_->value.dtype(),
                     copy_->value.device(), "OptimizerStep updated " + name_ + " from its owner");
    copy_->value.CopyFrom(value);
  }
  if (copy_) layer::RefreshComputeCopy(copy_);
}

}  // namespace bigmac::engine
