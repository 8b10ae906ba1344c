#ifndef BIGMAC_CORE_ENGINE_TP_GROUP_H_
#define BIGMAC_CORE_ENGINE_TP_GROUP_H_

// The layers' tensor-parallel group (core/layer/tp_layer.h, the plugin SDK) over the transport's
// tp group, so the layers never see the transport. Holds a reference to the group, which must
// outlive it.

#include <string>

#include "core/comm/group.h"
#include "core/layer/tp_layer.h"

namespace bigmac::engine {

class CommTpGroup : public layer::TpGroup {
 public:
  explicit CommTpGroup(comm::Group& tp) : tp_(tp) {}
  int rank() const override { return tp_.rank(); }
  int size() const override { return tp_.size(); }
  void AllReduceSum(memory::Tensor* tensor, const std::string& what) override {
    tp_.AllReduce(tensor, comm::ReduceOp::kSum, what);
  }
  void AllReduceMax(memory::Tensor* tensor, const std::string& what) override {
    tp_.AllReduce(tensor, comm::ReduceOp::kMax, what);
  }

 private:
  comm::Group& tp_;
};

}  // namespace bigmac::engine

#endif  // BIGMAC_CORE_ENGINE_TP_GROUP_H_
