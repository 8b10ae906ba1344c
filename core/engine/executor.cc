#include "core/engine/executor.h"

#include <algorithm>
#include <exception>
#include <optional>
#include <set>
#include <stdexcept>

#include "core/comm/progress.h"
#include "core/util/constant_weights.h"

namespace bigmac::engine {

using memory::Tensor;
using schedule::Action;
using schedule::Op;

namespace {

bool IsCommunication(Op op) { return schedule::Info(op).peer != 0; }

bool IsReceive(Op op) { return op == Op::kRecvAct || op == Op::kRecvGrad; }

std::string Category(Op op) { return schedule::Info(op).category; }

// The tag a receive's message carries: the consumer stage and the micro-batch.
int ReceiveTag(const Action& a) {
  return a.op == Op::kRecvAct ? comm::ActivationTag(a.stage, a.microbatch)
                              : comm::GradientTag(a.stage, a.microbatch);
}

// "Forward mb5", "RecvGrad mb3", "OptimizerStep": how the hang report names an action.
std::string Label(const Action& a) {
  return schedule::OpName(a.op) + (a.microbatch >= 0 ? " mb" + std::to_string(a.microbatch) : "");
}

// Actions [begin, end) about to run (one computation, or one exchange), for the hang report.
void RecordProgress(const std::vector<Action>& actions, size_t begin, size_t end,
                    const std::string& name) {
  std::vector<comm::progress::ExpectedReceive> receives;
  for (size_t i = begin; i < end; ++i) {
    if (IsReceive(actions[i].op))
      receives.push_back(
          {ReceiveTag(actions[i]), Label(actions[i]), schedule::ShortName(actions[i])});
  }
  comm::progress::SetAction(name, Label(actions[begin]), receives);
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

Executor::Executor(RankModel* stage, comm::PipelineComm* comm, const schedule::ScheduleSpec& spec,
                   int hidden_size)
    : Executor(stage, comm, spec, hidden_size, schedule::BuildRankActions(spec, comm->pp().rank()),
               schedule::BuildStepTail(spec, comm->pp().rank())) {}

Executor::Executor(RankModel* stage, comm::PipelineComm* comm, const schedule::ScheduleSpec& spec,
                   int hidden_size, std::vector<Action> flush, std::vector<Action> tail)
    : model_(stage),
      comm_(comm),
      spec_(spec),
      flush_(std::move(flush)),
      tail_(std::move(tail)),
      hidden_size_(hidden_size),
      loss_(stage->device(), {1}, memory::DType::kF64),
      loss_term_(stage->device(), {1}, memory::DType::kF64) {
  // Counted from the list (not the spec): a test's hand-written list may compute fewer.
  std::set<int> microbatches;
  for (const Action& action : flush_) {
    if (action.op == Op::kForward) microbatches.insert(action.microbatch);
  }
  flush_microbatches_ = static_cast<int>(microbatches.size());
  set_dp_reduce(DpReduceOptions());
  model_->set_weight_gradient_hook([this](int layer) { dp_reducer_->WeightGradientDone(layer); });
}

Executor::~Executor() { model_->set_weight_gradient_hook(nullptr); }

void Executor::set_timeline(metrics::Timeline* timeline) {
  timeline_ = timeline;
  dp_reducer_->set_timeline(timeline);
}

void Executor::set_dp_reduce(const DpReduceOptions& options) {
  dp_reducer_ = std::make_unique<DpReducer>(model_, &comm_->dp(), options, spec_.microbatches);
  dp_reducer_->set_timeline(timeline_);
}

std::vector<int64_t> Executor::ActivationShape(const layer::MicroBatch& mb) const {
  return {mb.batch, mb.seq, hidden_size_};
}

std::string Executor::Describe(const Action& a) const {
  return schedule::OpName(a.op) + "(micro-batch " + std::to_string(a.microbatch) + ", stage " +
         std::to_string(a.stage) + ")";
}

double Executor::RunFlush(const Batch& batch, bool last) {
  loss_.Zero();
  if (last) dp_reducer_->BeginLastFlush();
  // The weights stay as they are until the tail's optimizer step, so the CPU kernels may pack
  // them once for all of the flush's micro-batches (util/constant_weights.h).
  std::optional<util::ConstantWeightsScope> constant_weights;
  if (flush_microbatches_ > 1 && model_->device()->backend() == device::Backend::kCpu)
    constant_weights.emplace(model_->WeightBuffersReadAsIs());
  Run(flush_, batch, [] {});
  return loss_.Scalar();
}

void Executor::RunTail(const std::function<void()>& optimizer_step) {
  Run(
      tail_,
      [](int) -> const layer::MicroBatch& {
        throw std::logic_error("executor: a per-step action asked for a micro-batch");
      },
      optimizer_step);
}

void Executor::Run(const std::vector<Action>& actions, const Batch& batch,
                   const std::function<void()>& optimizer_step, bool keep, bool record) {
  size_t expected_until = 0;  // the receives before this index have been announced
  // Leaving by an exception: the receives announced and not received are forgotten, so that a
  // later run's receive with the same tag cannot take their messages.
  struct ForgetOnThrow {
    comm::PeerLinks& links;
    int exceptions = std::uncaught_exceptions();
    ~ForgetOnThrow() {
      if (std::uncaught_exceptions() > exceptions) links.ForgetExpected();
    }
  } forget_on_throw{comm_->links()};
  for (size_t i = 0; i < actions.size();) {
    const auto start = metrics::Timeline::Clock::now();
    size_t end = i + 1;
    std::string name = schedule::ShortName(actions[i]);
    std::string category = Category(actions[i].op);
    double compute_cpu_ms = 0;
    if (IsCommunication(actions[i].op)) {
      // Adjacent communication with the same neighbour goes out as one exchange.
      while (end < actions.size() && IsCommunication(actions[end].op) &&
             actions[end].peer == actions[i].peer) {
        name += "+" + schedule::ShortName(actions[end]);
        if (IsReceive(actions[end].op)) category = "wait";
        ++end;
      }
      RecordProgress(actions, i, end, name);
      if (action_hook_) action_hook_(actions[i]);
      RunExchange(actions, i, end, batch);
    } else {
      RecordProgress(actions, i, end, name);
      if (action_hook_) action_hook_(actions[i]);
      // The next exchange's messages may move while this computes.
      ExpectNextReceives(actions, i, &expected_until, batch);
      const bool timed = record && device_spans_ && device_spans_->enabled();
      const device::Event device_start = timed ? device_spans_->Mark() : device::Event{};
      // On the host's clock only: the forward and backward computations' CPU time (compare's
      // bottleneck, which waits, the optimizer and a device's enqueueing would blur).
      const bool cpu_timed =
          record && timeline_ && !timed && schedule::Info(actions[i].op).computes;
      const double cpu_start_ms = cpu_timed ? metrics::Timeline::ThreadCpuMs() : 0;
      RunCompute(actions[i], batch, optimizer_step, keep);
      if (cpu_timed) compute_cpu_ms = metrics::Timeline::ThreadCpuMs() - cpu_start_ms;
      if (timed) {
        device_spans_->Add(name, "device_compute", metrics::Timeline::kDeviceComputeTrack,
                           device_start, device_spans_->Mark());
      }
      comm_->Progress();  // sends and dp reductions in flight move on between computations
    }
    if (timeline_ && record) {
      timeline_->Record(name, category, start, metrics::Timeline::Clock::now());
      if (compute_cpu_ms > 0) timeline_->Add("compute_cpu", compute_cpu_ms);
    }
    i = end;
  }
}

comm::Incoming Executor::IncomingOf(const Action& a, const Batch& batch) const {
  return {a.peer,
          ReceiveTag(a),
          ActivationShape(batch(a.microbatch)),
          model_->activation_dtype(),
          model_->device(),
          Describe(a) + (a.op == Op::kRecvAct ? " activation" : " gradient")};
}

void Executor::ExpectNextReceives(const std::vector<Action>& actions, size_t computing,
                                  size_t* expected_until, const Batch& batch) {
  size_t block = computing + 1;
  while (block < actions.size() && !IsCommunication(actions[block].op)) ++block;
  size_t end = block;
  while (end < actions.size() && IsCommunication(actions[end].op)) ++end;
  for (size_t i = std::max(block, *expected_until); i < end; ++i) {
    if (IsReceive(actions[i].op)) comm_->links().Expect(IncomingOf(actions[i], batch));
  }
  *expected_until = std::max(*expected_until, end);
}

void Executor::DuplicateReceive(const Action& a) const {
  throw std::logic_error("executor: " + Describe(a) +
                         ": a second receive for this (micro-batch, stage) while the first is "
                         "still unused; the schedule is wrong");
}

void Executor::Deliver(const Action& a, Tensor tensor) {
  if (!inbox_.try_emplace({a.microbatch, a.stage}, std::move(tensor)).second) DuplicateReceive(a);
}

void Executor::RunExchange(const std::vector<Action>& actions, size_t begin, size_t end,
                           const Batch& batch) {
  std::vector<comm::Outgoing> sends;
  std::vector<comm::Incoming> receives;
  std::vector<const Action*> receive_actions;
  for (size_t i = begin; i < end; ++i) {
    const Action& a = actions[i];
    switch (a.op) {
      case Op::kSendAct:
        sends.push_back({Take(outbox_, a.microbatch, a.stage, "activation to send"), a.peer,
                         comm::ActivationTag(a.stage + 1, a.microbatch), Describe(a)});
        break;
      case Op::kSendGrad:
        sends.push_back({Take(outbox_, a.microbatch, a.stage, "gradient to send"), a.peer,
                         comm::GradientTag(a.stage - 1, a.microbatch), Describe(a)});
        break;
      case Op::kRecvAct:
      case Op::kRecvGrad: {
        for (const Action* earlier : receive_actions) {
          if (earlier->microbatch == a.microbatch && earlier->stage == a.stage) DuplicateReceive(a);
        }
        if (inbox_.count({a.microbatch, a.stage})) DuplicateReceive(a);
        receives.push_back(IncomingOf(a, batch));
        receive_actions.push_back(&a);
        break;
      }
      default:
        throw std::logic_error("executor: " + Describe(a) + " is not communication");
    }
  }
  std::vector<Tensor> received = comm_->links().Exchange(std::move(sends), receives);
  for (size_t i = 0; i < received.size(); ++i) Deliver(*receive_actions[i], std::move(received[i]));
}

void Executor::RunCompute(const Action& a, const Batch& batch,
                          const std::function<void()>& optimizer_step, bool keep) {
  switch (a.op) {
    case Op::kForward: {
      const layer::MicroBatch& mb = batch(a.microbatch);
      Tensor input =
          a.stage == 0 ? Tensor() : Take(inbox_, a.microbatch, a.stage, "received activation");
      Tensor output = model_->ForwardStage(a.stage, mb, std::move(input), keep);
      if (model_->is_last_stage(a.stage) && capture_output_) {
        output_ = std::move(output);
      } else if (model_->is_last_stage(a.stage)) {
        // The loss stays on the device until the flush ends.
        loss_term_.ConvertFrom(output);
        loss_.device()->AddInto(loss_.raw(), loss_term_.raw(), memory::DType::kF64, 1);
      } else {
        outbox_[{a.microbatch, a.stage}] = std::move(output);
      }
      break;
    }
    case Op::kBackward:
    case Op::kBackwardInput: {
      const layer::MicroBatch& mb = batch(a.microbatch);
      Tensor grad = model_->is_last_stage(a.stage)
                        ? Tensor()
                        : Take(inbox_, a.microbatch, a.stage, "received gradient");
      Tensor dx = a.op == Op::kBackward ? model_->BackwardStage(a.stage, mb, std::move(grad))
                                        : model_->BackwardInputStage(a.stage, mb, std::move(grad));
      if (a.stage > 0) outbox_[{a.microbatch, a.stage}] = std::move(dx);
      break;
    }
    case Op::kBackwardWeight:
      model_->BackwardWeightStage(a.stage, batch(a.microbatch));
      break;
    case Op::kReduceTied:
      for (TiedWeight& tie : model_->tied()) tie.ReduceGradient(&comm_->links());
      dp_reducer_->TiedReduced();
      break;
    case Op::kReduceDp:
      dp_reducer_->Finish();
      break;
    case Op::kOptimizerStep:
      optimizer_step();
      break;
    default:
      throw std::logic_error("executor: " + Describe(a) + " is communication");
  }
}

void Executor::SendTiedWeight() {
  for (TiedWeight& tie : model_->tied()) tie.SyncValue(&comm_->links());
}

double Executor::Evaluate(const layer::MicroBatch& mb) {
  loss_.Zero();
  // Micro-batch mb.index, so that its messages carry their own tags.
  Run(
      schedule::BuildForwardOnlyActions(spec_, comm_->pp().rank(), mb.index),
      [&](int) -> const layer::MicroBatch& { return mb; }, [] {}, /*keep=*/false,
      /*record=*/false);
  return loss_.Scalar();
}

Tensor Executor::ForwardOutput(const layer::MicroBatch& mb) {
  capture_output_ = true;
  output_ = Tensor();
  Run(
      schedule::BuildForwardOnlyActions(spec_, comm_->pp().rank(), mb.index),
      [&](int) -> const layer::MicroBatch& { return mb; }, [] {}, /*keep=*/false,
      /*record=*/false);
  capture_output_ = false;
  return std::move(output_);
}

}  // namespace bigmac::engine
