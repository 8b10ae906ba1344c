#include "core/engine/executor.h"

#include <stdexcept>

namespace bigmac::engine {

using memory::Tensor;
using schedule::Action;
using schedule::Op;

namespace {

bool IsPerStep(Op op) { return schedule::Info(op).per_step; }

std::string Category(Op op) { return schedule::Info(op).category; }

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

Executor::Executor(Stage* stage, comm::PipelineComm* comm, const schedule::ScheduleSpec& spec,
                   int hidden_size)
    : stage_(stage),
      comm_(comm),
      spec_(spec),
      flush_(schedule::BuildRankActions(spec, comm->pp_rank())),
      step_tail_(schedule::BuildStepTail(spec, comm->pp_rank())),
      hidden_size_(hidden_size) {
  for (const Action& a : flush_) {
    if (IsPerStep(a.op))
      throw std::logic_error("executor: per-step " + ShortName(a) + " in a flush");
  }
  for (const Action& a : step_tail_) {
    if (!IsPerStep(a.op)) throw std::logic_error("executor: " + ShortName(a) + " in the step tail");
  }
}

std::vector<int64_t> Executor::ActivationShape(const layer::MicroBatch& mb) const {
  return {mb.batch, mb.seq, hidden_size_};
}

std::string Executor::Describe(const Action& a) const {
  return schedule::OpName(a.op) + "(micro-batch " + std::to_string(a.microbatch) + ", stage " +
         std::to_string(a.stage) + ")";
}

double Executor::RunFlush(const std::function<const layer::MicroBatch&(int)>& batch,
                          bool last_flush, const std::function<void()>& optimizer_step) {
  double loss = RunList(flush_, batch, optimizer_step, /*keep=*/true, /*record=*/true);
  if (last_flush) loss += RunList(step_tail_, batch, optimizer_step, true, true);
  return loss;
}

double Executor::Evaluate(const layer::MicroBatch& mb) {
  // Micro-batch mb.index, so that its messages carry the same tags as before the list existed.
  return RunList(
      schedule::BuildForwardOnlyActions(spec_, comm_->pp_rank(), mb.index),
      [&](int) -> const layer::MicroBatch& { return mb; }, [] {}, /*keep=*/false,
      /*record=*/false);
}

double Executor::RunList(const std::vector<Action>& actions,
                         const std::function<const layer::MicroBatch&(int)>& batch,
                         const std::function<void()>& optimizer_step, bool keep, bool record) {
  double loss = 0;
  for (const Action& a : actions) {
    const auto start = metrics::Timeline::Clock::now();
    RunAction(a, batch, optimizer_step, keep, &loss);
    if (timeline_ && record) {
      timeline_->Record(schedule::ShortName(a), Category(a.op), start,
                        metrics::Timeline::Clock::now());
    }
  }
  return loss;
}

void Executor::RunAction(const Action& a, const std::function<const layer::MicroBatch&(int)>& batch,
                         const std::function<void()>& optimizer_step, bool keep, double* loss_sum) {
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
      Tensor output = stage_->ForwardStage(a.stage, mb, std::move(input), keep);
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
      ReduceTied();
      break;
    case Op::kReduceDp:
      ReduceDp();
      break;
    case Op::kOptimizerStep:
      optimizer_step();
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

}  // namespace bigmac::engine
