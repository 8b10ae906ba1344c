#include "core/engine/executor.h"

#include <stdexcept>

namespace bigmac::engine {

using memory::Tensor;
using schedule::Action;
using schedule::Op;

namespace {

bool IsPerStep(Op op) {
  return op == Op::kReduceTied || op == Op::kReduceDp || op == Op::kOptimizerStep;
}

std::string Category(Op op) {
  switch (op) {
    case Op::kForward:
      return "forward";
    case Op::kBackward:
      return "backward";
    case Op::kBackwardInput:
      return "backward_input";
    case Op::kBackwardWeight:
      return "backward_weight";
    case Op::kRecvAct:
    case Op::kRecvGrad:
      return "wait";
    case Op::kSendAct:
    case Op::kSendGrad:
      return "send";
    case Op::kReduceTied:
      return "tied";
    case Op::kReduceDp:
      return "allreduce";
    case Op::kOptimizerStep:
      return "optimizer";
  }
  return "other";
}

Tensor Take(std::map<std::pair<int, int>, Tensor>& box, int mb, int stage,
            const std::string& what) {
  auto it = box.find({mb, stage});
  if (it == box.end())
    throw std::logic_error("executor: no " + what + " for micro-batch " + std::to_string(mb) +
                           " at stage " + std::to_string(stage));
  Tensor tensor = std::move(it->second);
  box.erase(it);
  return tensor;
}

}  // namespace

Executor::Executor(Stage* stage, comm::PipelineComm* comm, std::vector<Action> actions,
                   int hidden_size)
    : stage_(stage), comm_(comm), actions_(std::move(actions)), hidden_size_(hidden_size) {}

std::vector<int64_t> Executor::ActivationShape(const layer::MicroBatch& mb) const {
  return {mb.batch, mb.seq, hidden_size_};
}

std::string Executor::Describe(const Action& a) const {
  return schedule::OpName(a.op) + "(micro-batch " + std::to_string(a.microbatch) + ", stage " +
         std::to_string(a.stage) + ")";
}

double Executor::RunFlush(const std::function<const layer::MicroBatch&(int)>& batch,
                          bool last_flush, const std::function<void()>& optimizer_step) {
  double loss = 0;
  for (const Action& a : actions_) {
    const auto start = metrics::Timeline::Clock::now();
    RunAction(a, batch, last_flush, optimizer_step, &loss);
    if (timeline_ && (last_flush || !IsPerStep(a.op))) {
      timeline_->Record(schedule::ShortName(a), Category(a.op), start,
                        metrics::Timeline::Clock::now());
    }
  }
  return loss;
}

void Executor::RunAction(const Action& a, const std::function<const layer::MicroBatch&(int)>& batch,
                         bool last_flush, const std::function<void()>& optimizer_step,
                         double* loss_sum) {
  double& loss = *loss_sum;
  switch (a.op) {
    case Op::kRecvAct: {
      const layer::MicroBatch& mb = batch(a.microbatch);
      inbox_[{a.microbatch, a.stage}] =
          comm_->Receive(a.peer, comm::ActivationTag(a.stage, a.microbatch), ActivationShape(mb),
                         memory::DType::kF32, stage_->allocator(), Describe(a) + " activation");
      break;
    }
    case Op::kForward: {
      const layer::MicroBatch& mb = batch(a.microbatch);
      Tensor input =
          a.stage == 0 ? Tensor() : Take(inbox_, a.microbatch, a.stage, "received activation");
      Tensor output = stage_->ForwardStage(a.stage, mb, std::move(input));
      if (stage_->is_last_stage(a.stage)) {
        loss += output.Scalar();
      } else {
        outbox_[{a.microbatch, a.stage}] = std::move(output);
      }
      break;
    }
    case Op::kSendAct: {
      Tensor output = Take(outbox_, a.microbatch, a.stage, "activation to send");
      comm_->Send(output, a.peer, comm::ActivationTag(a.stage + 1, a.microbatch), Describe(a));
      break;
    }
    case Op::kRecvGrad: {
      const layer::MicroBatch& mb = batch(a.microbatch);
      inbox_[{a.microbatch, a.stage}] =
          comm_->Receive(a.peer, comm::GradientTag(a.stage, a.microbatch), ActivationShape(mb),
                         memory::DType::kF32, stage_->allocator(), Describe(a) + " gradient");
      break;
    }
    case Op::kBackward:
    case Op::kBackwardInput: {
      const layer::MicroBatch& mb = batch(a.microbatch);
      Tensor grad = stage_->is_last_stage(a.stage)
                        ? Tensor()
                        : Take(inbox_, a.microbatch, a.stage, "received gradient");
      Tensor dx = a.op == Op::kBackward ? stage_->BackwardStage(a.stage, mb, std::move(grad))
                                        : stage_->BackwardInputStage(a.stage, mb, std::move(grad));
      if (a.stage > 0) outbox_[{a.microbatch, a.stage}] = std::move(dx);
      break;
    }
    case Op::kBackwardWeight:
      stage_->BackwardWeightStage(a.stage, batch(a.microbatch));
      break;
    case Op::kSendGrad: {
      Tensor dx = Take(outbox_, a.microbatch, a.stage, "gradient to send");
      comm_->Send(dx, a.peer, comm::GradientTag(a.stage - 1, a.microbatch), Describe(a));
      break;
    }
    case Op::kReduceTied:
      if (last_flush) ReduceTied();
      break;
    case Op::kReduceDp:
      if (last_flush) ReduceDp();
      break;
    case Op::kOptimizerStep:
      if (last_flush) optimizer_step();
      break;
  }
}

void Executor::ReduceTied() {
  layer::Param* owner = stage_->TiedOwner();
  layer::Param* copy = stage_->TiedCopy();
  if (owner && copy) {
    stage_->ReduceTiedGradients();
  } else if (copy) {
    comm_->Send(copy->grad, 0, comm::kTiedGradientTag, "tied gradient");
    copy->grad.Zero();
  } else if (owner) {
    const Tensor grad =
        comm_->Receive(comm_->pp_size() - 1, comm::kTiedGradientTag, owner->grad.shape(),
                       owner->grad.dtype(), stage_->allocator(), "ReduceTied gradient of wte");
    float* into = owner->grad.data<float>();
    const float* from = grad.data<float>();
    for (int64_t i = 0; i < grad.numel(); ++i) into[i] += from[i];
  }
}

void Executor::SendTiedWeight() {
  layer::Param* owner = stage_->TiedOwner();
  layer::Param* copy = stage_->TiedCopy();
  if (owner && copy) {
    stage_->SyncTiedCopies();
  } else if (owner) {
    comm_->Send(owner->value, comm_->pp_size() - 1, comm::kTiedWeightTag, "tied weight");
  } else if (copy) {
    const Tensor value =
        comm_->Receive(0, comm::kTiedWeightTag, copy->value.shape(), copy->value.dtype(),
                       stage_->allocator(), "OptimizerStep updated wte from its owner");
    copy->value.CopyFrom(value);
  }
}

void Executor::ReduceDp() {
  if (comm_->dp_size() == 1) return;
  // One flat buffer in a fixed parameter order; the comm splits it into buckets.
  std::vector<Stage::NamedParam> params = stage_->OwnedParams();
  int64_t total = 0;
  for (const auto& named : params) total += named.param->grad.numel();
  // Staged in one buffer from the device allocator, so it counts against the capacity.
  Tensor flat_tensor(stage_->allocator(), {total}, memory::DType::kF32);
  float* flat = flat_tensor.data<float>();
  int64_t offset = 0;
  for (const auto& named : params) {
    std::copy_n(named.param->grad.data<float>(), named.param->grad.numel(), flat + offset);
    offset += named.param->grad.numel();
  }
  comm_->AllReduceSumDp(flat, total);
  offset = 0;
  for (const auto& named : params) {
    std::copy_n(flat + offset, named.param->grad.numel(), named.param->grad.data<float>());
    offset += named.param->grad.numel();
  }
}

double Executor::Evaluate(const layer::MicroBatch& mb) {
  double loss = 0;
  const int pp = comm_->pp_size();
  for (const partition::StageRange& range : stage_->ranges()) {
    const int s = range.stage;
    Tensor input;
    if (s > 0) {
      input = comm_->Receive((s - 1) % pp, comm::ActivationTag(s, mb.index), ActivationShape(mb),
                             memory::DType::kF32, stage_->allocator(),
                             "evaluation activation (stage " + std::to_string(s) + ")");
    }
    Tensor output = stage_->ForwardStage(s, mb, std::move(input), /*keep=*/false);
    if (stage_->is_last_stage(s)) {
      loss += output.Scalar();
    } else {
      comm_->Send(output, (s + 1) % pp, comm::ActivationTag(s + 1, mb.index),
                  "evaluation activation");
    }
  }
  return loss;
}

}  // namespace bigmac::engine
