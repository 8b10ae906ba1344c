#ifndef BIGMAC_CORE_ENGINE_TP_GROUP_H_
#define BIGMAC_CORE_ENGINE_TP_GROUP_H_

// The layers' tensor-parallel group (core/layer/tp_layer.h) over the transport's tp calls, so a
// transport (MPI today, NCCL later) implements one AllReduceTp and the layers never see it.
// Holds a reference to the transport, which must outlive it.

#include <string>

#include "core/comm/pipeline_comm.h"
#include "core/layer/tp_layer.h"

namespace bigmac::engine {

class CommTpGroup : public layer::TpGroup {
 public:
  explicit CommTpGroup(comm::PipelineComm& comm) : comm_(comm) {}
  int rank() const override { return comm_.tp_rank(); }
  int size() const override { return comm_.tp_size(); }
  void AllReduceSum(memory::Tensor* tensor, const std::string& what) override {
    comm_.AllReduceTp(tensor, comm::PipelineComm::ReduceOp::kSum, what);
  }
  void AllReduceMax(memory::Tensor* tensor, const std::string& what) override {
    comm_.AllReduceTp(tensor, comm::PipelineComm::ReduceOp::kMax, what);
  }

 private:
  comm::PipelineComm& comm_;
};

}  // namespace bigmac::engine

#endif  // BIGMAC_CORE_ENGINE_TP_GROUP_H_
