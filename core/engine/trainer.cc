#include "core/engine/trainer.h"

#include <chrono>
#include <cmath>
#include <cstdio>

#include "core/data/dataset.h"
#include "core/data/shard.h"
#include "core/engine/stage.h"
#include "core/memory/allocator.h"
#include "core/optim/adamw.h"

namespace bigmac::engine {
namespace {

std::string Format(const char* format, auto... args) {
  char text[512];
  std::snprintf(text, sizeof(text), format, args...);
  return text;
}

// Names the first layer/parameter with a non-finite gradient, or "".
std::string FirstNonFinite(Stage& stage) {
  for (const Stage::NamedParam& named : stage.OwnedParams()) {
    if (!optim::AllFinite(named.param->grad)) return named.name;
  }
  return "";
}

}  // namespace

TrainResult TrainSingleRank(const config::ResolvedConfig& resolved,
                            const std::function<void(const std::string&)>& log) {
  const config::Config& cfg = resolved.values();
  const config::Train& train = cfg.train();
  const int batch = train.micro_batch_size();
  const int seq = train.seq_length();
  const int accum = train.gradient_accumulation_steps();

  data::TokenDataset train_data(cfg.data().dir(), "train");
  data::TokenDataset val_data(cfg.data().dir(), "val");
  if (static_cast<int>(train_data.vocab_size()) > cfg.model().vocab_size()) {
    throw data::DataError(
        train_data.description() + ": vocabulary " + std::to_string(train_data.vocab_size()) +
        " is larger than model.vocab_size=" + std::to_string(cfg.model().vocab_size()));
  }

  memory::DeviceAllocator allocator("cpu:0", memory::CpuCapacity(cfg.device().memory_limit(), 1));
  StageOptions options;
  options.dims = {cfg.model().vocab_size(), cfg.model().hidden_size(), cfg.model().num_heads(),
                  cfg.model().num_layers(), seq};
  options.allocator = &allocator;
  options.activation_checkpointing = train.activation_checkpointing();
  options.seed = static_cast<uint64_t>(train.seed());
  Stage stage(options, resolved.partition, /*pp_rank=*/0);

  std::vector<layer::Param*> params;
  for (const Stage::NamedParam& named : stage.OwnedParams()) params.push_back(named.param);
  TrainResult result;
  result.parameter_count = stage.OwnedParameterCount();
  log(Format("[train] model: %lld parameters, %d blocks, hidden %d, %d heads, vocab %d | data: %s",
             static_cast<long long>(result.parameter_count), cfg.model().num_layers(),
             cfg.model().hidden_size(), cfg.model().num_heads(), cfg.model().vocab_size(),
             train_data.description().c_str()));

  optim::AdamW adamw(
      {cfg.optim().beta1(), cfg.optim().beta2(), cfg.optim().eps(), cfg.optim().weight_decay()});
  const optim::LrSchedule schedule{cfg.optim().lr(), cfg.optim().min_lr(),
                                   cfg.optim().warmup_steps(), train.max_steps()};
  std::vector<int32_t> tokens(int64_t{batch} * seq);
  std::vector<int32_t> targets(tokens.size());
  layer::MicroBatch mb{batch, seq, tokens.data(), targets.data(), 0.0};

  auto evaluate = [&](int step) {
    double sum = 0;
    mb.loss_scale = 1.0 / (double(batch) * seq);
    for (int i = 0; i < train.eval_batches(); ++i) {
      val_data.EvalBatch(i, batch, seq, tokens.data(), targets.data());
      sum += stage.ForwardLoss(mb);
    }
    const double loss = sum / train.eval_batches();
    result.val_losses.emplace_back(step, loss);
    log(Format("[val] step %d | val_loss %.4f | %d batches of %dx%d", step, loss,
               train.eval_batches(), batch, seq));
  };

  // Every micro-batch's token losses are scaled by 1/(tokens per optimizer step), so the gradient
  // is that of the mean over the whole step (and, later, over every pp/dp split of it).
  evaluate(0);  // the starting point: about ln(vocab_size) for a fresh model
  const double tokens_per_step = double(batch) * seq * accum * resolved.dp;
  for (int step = 0; step < train.max_steps(); ++step) {
    const auto start = std::chrono::steady_clock::now();
    stage.ZeroGrads();
    double loss = 0;
    for (int micro = 0; micro < accum; ++micro) {
      train_data.TrainBatch(options.seed, step, /*dp_rank=*/0, micro, batch, seq, tokens.data(),
                            targets.data());
      mb.loss_scale = 1.0 / tokens_per_step;
      loss += stage.ForwardBackward(mb);
    }
    stage.ReduceTiedGradients();
    if (!std::isfinite(loss)) {
      const std::string where = stage.FirstNonFiniteLayer(mb);
      throw NumericalError(
          Format("step %d: the loss is %f; non-finite values first appear in %s", step + 1, loss,
                 where.empty() ? "no layer on re-run (an intermittent fault?)" : where.c_str()));
    }
    if (std::string where = FirstNonFinite(stage); !where.empty()) {
      throw NumericalError(Format("step %d: non-finite gradient in %s", step + 1, where.c_str()));
    }
    const double norm = optim::GlobalGradNorm(params);
    if (cfg.optim().grad_clip() > 0 && norm > cfg.optim().grad_clip()) {
      optim::ScaleGradients(params, cfg.optim().grad_clip() / norm);
    }
    const double lr = optim::LearningRate(schedule, step);
    adamw.Step(params, lr, step + 1);
    stage.SyncTiedCopies();
    result.train_losses.push_back(loss);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if ((step + 1) % train.log_interval() == 0 || step == 0 || step + 1 == train.max_steps()) {
      log(Format(
          "step %d/%d | loss %.4f | lr %.2e | norm %.3f | %.0f tok/s | %.1f ms | peak %.1f MiB",
          step + 1, train.max_steps(), loss, lr, norm, tokens_per_step / (ms / 1000.0), ms,
          double(allocator.peak_bytes()) / (1 << 20)));
    }
    if (train.eval_interval() > 0 && (step + 1) % train.eval_interval() == 0 &&
        step + 1 != train.max_steps()) {
      evaluate(step + 1);
    }
  }
  evaluate(train.max_steps());
  result.peak_bytes = allocator.peak_bytes();
  for (layer::Param* param : params) {
    for (int64_t i = 0; i < param->value.numel(); ++i) {
      result.final_parameters.push_back(param->value.dtype() == memory::DType::kF64
                                            ? param->value.data<double>()[i]
                                            : param->value.data<float>()[i]);
    }
  }
  return result;
}

}  // namespace bigmac::engine
