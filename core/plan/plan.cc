#include "core/plan/plan.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>

#include "core/config/resolve.h"
#include "core/engine/rank_model.h"
#include "core/layer/cost.h"
#include "core/memory/allocator.h"
#include "core/schedule/simulator.h"
#include "core/util/format.h"

namespace bigmac::plan {
using util::Format;

namespace {

std::string Count(int64_t n) {
  if (n >= 1000000) return Format("%.2fM", n / 1e6);
  if (n >= 1000) return Format("%.1fK", n / 1e3);
  return std::to_string(n);
}

}  // namespace

LayerTimes EstimateLayerTimes(const config::ResolvedConfig& config, double gflops) {
  const config::Config& cfg = config.values();
  const layer::ModelDims dims = config::ModelDimsOf(cfg);
  const int b = cfg.train().micro_batch_size();
  const int t = cfg.train().seq_length();
  const double ms_per_flop = 1e3 / (gflops * 1e9);
  const layer::LayerCost e = layer::EmbeddingCost(dims, b, t);
  const layer::LayerCost k =
      layer::TpBlockCost(dims, config.tp, b, t, cfg.train().activation_checkpointing());
  const layer::LayerCost h = layer::TpHeadCost(dims, config.tp, b, t);
  LayerTimes times;
  times.embedding_forward = e.forward_flops * ms_per_flop;
  times.embedding_backward = e.backward_flops * ms_per_flop;
  times.block_forward = k.forward_flops * ms_per_flop;
  times.block_backward = k.backward_flops * ms_per_flop;
  times.head_forward = h.forward_flops * ms_per_flop;
  times.head_backward = h.backward_flops * ms_per_flop;
  times.source =
      Format("estimated from FLOPs at %.0f GFLOP/s per rank (use --profile to measure)", gflops);
  return times;
}

LayerTimes MeasureLayerTimes(const config::ResolvedConfig& config, int repeats) {
  const config::Config& cfg = config.values();
  const int b = cfg.train().micro_batch_size();
  const int t = cfg.train().seq_length();
  const std::unique_ptr<device::Device> device =
      device::MakeCpuDevice(0, memory::CpuCapacity(config.memory_limit_bytes, 1));
  // A model of one block: its embedding, block and head are timed one at a time.
  partition::PartitionSpec spec;
  spec.num_layers = 1;
  engine::RankModelOptions options;
  options.dims = config::ModelDimsOf(cfg);
  options.dims.num_layers = 1;
  options.device = device.get();
  options.activation_checkpointing = cfg.train().activation_checkpointing();
  engine::RankModel stage(options, partition::MakePartition(spec), 0);
  std::vector<int32_t> tokens(int64_t{b} * t), targets(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int32_t>((i * 7919) % cfg.model().vocab_size());
    targets[i] = static_cast<int32_t>((i * 104729) % cfg.model().vocab_size());
  }
  const layer::MicroBatch mb{b, t, tokens.data(), targets.data(), 1.0 / (double(b) * t), 0};
  double forward[3] = {0, 0, 0};
  double backward[3] = {0, 0, 0};
  using Clock = std::chrono::steady_clock;
  auto ms = [](Clock::time_point a, Clock::time_point z) {
    return std::chrono::duration<double, std::milli>(z - a).count();
  };
  for (int rep = 0; rep <= repeats; ++rep) {
    memory::Tensor activation;
    std::vector<layer::Saved> saved(3);
    double f[3], w[3];
    for (int i = 0; i < 3; ++i) {
      const auto start = Clock::now();
      memory::Tensor next;
      stage.layers()[i]->Forward(mb, activation, &next, &saved[i]);
      f[i] = ms(start, Clock::now());
      activation = std::move(next);
    }
    memory::Tensor grad;
    for (int i = 2; i >= 0; --i) {
      const auto start = Clock::now();
      memory::Tensor dx;
      stage.layers()[i]->BackwardInput(mb, grad, i == 0 ? nullptr : &dx, &saved[i]);
      stage.layers()[i]->BackwardWeight(mb, &saved[i]);
      w[i] = ms(start, Clock::now());
      grad = std::move(dx);
    }
    if (rep == 0) continue;  // warm-up
    for (int i = 0; i < 3; ++i) {
      forward[i] += f[i] / repeats;
      backward[i] += w[i] / repeats;
    }
  }
  LayerTimes times{forward[0],
                   backward[0],
                   forward[1],
                   backward[1],
                   forward[2],
                   backward[2],
                   Format("measured on this machine (CPU backend, mean of %d runs)", repeats)};
  return times;
}

std::vector<PolicyPlan> PlanPolicies(const config::ResolvedConfig& config,
                                     const LayerTimes& times) {
  const config::Config& cfg = config.values();
  const layer::ModelDims dims = config::ModelDimsOf(cfg);
  const int b = cfg.train().micro_batch_size();
  const int t = cfg.train().seq_length();
  const bool ckpt = cfg.train().activation_checkpointing();
  // One tp rank's share (tp = 1: the whole layers). The CPU's blocked attention keeps a
  // log-sum-exp per row, and so does cuDNN's (bf16 on a GPU); the CUDA fallback (fp32) keeps the
  // probabilities.
  const layer::AttentionSaves saves = config.backend == device::Backend::kCpu || config.bf16
                                          ? layer::AttentionSaves::kRowLogSumExp
                                          : layer::AttentionSaves::kProbabilities;
  const layer::LayerCost embedding = layer::TpEmbeddingCost(dims, config.tp, b, t);
  const layer::LayerCost block = layer::TpBlockCost(dims, config.tp, b, t, ckpt, 4, saves);
  const layer::LayerCost head = layer::TpHeadCost(dims, config.tp, b, t);
  constexpr double kMiB = 1024.0 * 1024.0;
  const double microbatches_per_step = cfg.train().gradient_accumulation_steps();

  const schedule::Kind kind = config.schedule;
  const int pp = config.pp;
  const int v = cfg.parallel().virtual_stages();
  const int m = config.batch.num_microbatches;

  std::vector<std::string> policies = {"spread_first", "spread_last", "first", "last", "balanced"};
  if (config.policy == partition::Policy::kExplicit) policies.insert(policies.begin(), "explicit");
  std::vector<PolicyPlan> plans;
  for (const std::string& name : policies) {
    PolicyPlan plan;
    plan.policy = name;
    partition::PartitionSpec spec = config::PartitionSpecOf(cfg, config.sources());
    partition::ParsePolicy(name, &spec.policy);
    if (spec.policy != partition::Policy::kExplicit) {
      spec.layers_per_stage.clear();
      spec.split_points.clear();
    }
    // balanced minimises the costliest stage in the same times the table shows.
    spec.layer_costs.assign(cfg.model().num_layers(), times.block_forward + times.block_backward);
    spec.first_stage_extra = times.embedding_forward + times.embedding_backward;
    spec.last_stage_extra = times.head_forward + times.head_backward;
    if (std::vector<std::string> problems = partition::CheckSpec(spec); !problems.empty()) {
      plan.valid = false;
      plan.problem = problems.front();
      plans.push_back(plan);
      continue;
    }
    const partition::Partition partition = partition::MakePartition(spec);
    schedule::Costs costs;
    for (const partition::StageRange& range : partition.stages) {
      StagePlan stage;
      stage.range = range;
      stage.parameters = int64_t{range.num_layers} * block.parameters;
      double activation = double(range.num_layers) * block.activation_bytes;
      double deferred = double(range.num_layers) * block.deferred_bytes;
      double tp_bytes = double(range.num_layers) * block.tp_allreduce_bytes;
      stage.forward_ms = range.num_layers * times.block_forward;
      stage.backward_ms = range.num_layers * times.block_backward;
      if (range.has_embedding) {
        stage.parameters += embedding.parameters;
        deferred += double(embedding.deferred_bytes);
        tp_bytes += double(embedding.tp_allreduce_bytes);
        stage.forward_ms += times.embedding_forward;
        stage.backward_ms += times.embedding_backward;
        stage.notes += dims.tied_head() ? "embedding (owns tied wte)" : "embedding";
      }
      if (range.has_head) {
        stage.parameters += head.parameters;
        activation += double(head.activation_bytes);
        deferred += double(head.deferred_bytes);
        tp_bytes += double(head.tp_allreduce_bytes);
        stage.forward_ms += times.head_forward;
        stage.backward_ms += times.head_backward;
        stage.notes += std::string(stage.notes.empty() ? "" : ", ") +
                       (dims.tied_head() ? "head (tied copy of wte)" : "head (own lm_head)");
      }
      // The backward's transient peak above what the stage held before it: layers run last to
      // first, one at a time; the fused backward frees each layer's activations after it, the
      // split one leaves its deferred set.
      double fused_peak = 0, split_peak = 0, fused_done = 0, split_done = 0;
      auto backward_of = [&](const layer::LayerCost& layer, int count) {
        for (int i = 0; i < count; ++i) {
          fused_peak = std::max(fused_peak, fused_done + double(layer.backward_peak_bytes));
          split_peak = std::max(split_peak, split_done + double(layer.backward_peak_bytes));
          fused_done -= double(layer.activation_bytes);
          split_done += double(layer.deferred_bytes - layer.activation_bytes);
        }
      };
      if (range.has_head) backward_of(head, 1);
      backward_of(block, range.num_layers);
      if (range.has_embedding) backward_of(embedding, 1);
      costs.stage_backward_peak_bytes.push_back(fused_peak);
      costs.stage_backward_input_peak_bytes.push_back(split_peak);
      stage.activation_mib = activation / kMiB;
      stage.tp_allreduce_mib = tp_bytes * microbatches_per_step / kMiB;
      costs.stage_forward.push_back(stage.forward_ms);
      costs.stage_backward.push_back(stage.backward_ms);
      costs.stage_activation_bytes.push_back(activation);
      costs.stage_deferred_bytes.push_back(deferred);
      plan.stages.push_back(stage);
    }
    const schedule::SimResult sim =
        schedule::Simulate(schedule::BuildAllActions({kind, pp, m, v, !ckpt}), v, costs);
    for (StagePlan& stage : plan.stages) {
      const int rank = stage.range.pp_rank;
      // The rank's in-flight count covers all its chunks; spread evenly over them for the table.
      // The memory is what the stage held at its rank's simulated peak: each chunk's own count,
      // and where the backward is split what waits for the weight gradients (deferred_bytes).
      stage.in_flight = (sim.max_in_flight[rank] + v - 1) / v;
      const double held_mib = sim.stage_bytes_at_peak[stage.range.stage] / kMiB;
      // The head's copy of wte is memory, not a parameter it owns.
      const double copy_bytes =
          dims.tied_head() && stage.range.has_head && !stage.range.has_embedding
              ? double(layer::TpVocabRows(dims, config.tp)) * dims.hidden_size *
                    8  // value + gradient
              : 0.0;
      stage.optimizer_mib = double(stage.parameters) * 8 / kMiB;
      stage.optimizer_zero_mib = stage.optimizer_mib / config.dp;
      stage.checkpoint_snapshot_mib = double(stage.parameters) * config.tp * 12 / kMiB;
      const bool zero = config.values().parallel().zero_stage() == 1;
      stage.total_mib = (double(stage.parameters) * 8 + copy_bytes) / kMiB +
                        (zero ? stage.optimizer_zero_mib : stage.optimizer_mib) + held_mib;
    }
    plan.step_ms = sim.makespan * config.batch.flushes_per_step;
    plan.bubble = sim.bubble_fraction;
    plans.push_back(plan);
  }
  return plans;
}

std::vector<std::string> FormatPlans(const config::ResolvedConfig& config,
                                     const std::vector<PolicyPlan>& plans,
                                     const LayerTimes& times) {
  std::vector<std::string> lines;
  const int origin = config.partition.origin;
  const std::string configured = partition::PolicyName(config.policy);
  const bool zero = config.values().parallel().zero_stage() == 1;
  lines.push_back("[plan] times " + times.source +
                  "; memory = parameters x 8 B (value, gradient) + 2 Adam moments (x 8 B" +
                  (zero ? Format(" / dp=%d: ZeRO-1", config.dp) : std::string(", replicated")) +
                  ") + activations x micro-batches in flight under " +
                  config.values().parallel().schedule());
  if (config.tp > 1) {
    lines.push_back(Format(
        "[plan] tp=%d: params, memory and times are one tp rank's share (heads, MLP columns and "
        "vocab rows split %d ways; norms and row-parallel biases whole); \"tp MiB\" is "
        "what each rank of the stage puts into tp all-reduces per optimizer step",
        config.tp, config.tp));
  }
  const PolicyPlan* best = nullptr;
  const PolicyPlan* current = nullptr;
  for (const PolicyPlan& plan : plans) {
    if (!plan.valid) {
      lines.push_back("[plan] policy " + plan.policy + ": not possible: " + plan.problem);
      continue;
    }
    if (plan.policy == configured) current = &plan;
    if (!best || plan.step_ms < best->step_ms - 1e-9 ||
        (plan.step_ms <= best->step_ms + 1e-9 && plan.policy == configured)) {
      best = &plan;
    }
    lines.push_back(Format("[plan] policy %s%s: predicted step %.1f ms, bubble %.3f",
                           plan.policy.c_str(), plan.policy == configured ? " (configured)" : "",
                           plan.step_ms, plan.bubble));
    lines.push_back(
        Format("[plan]   %-5s %-4s %-11s %-6s %-9s %-9s %-6s %-10s %-8s %-9s %-8s %-8s %s%s",
               "stage", "rank", "layers", "count", "params", "diff", "ratio", "act MiB", "in fl.",
               "total MiB", "fwd ms", "bwd ms", config.tp > 1 ? "tp MiB   " : "", "notes"));
    int64_t previous = -1;
    for (const StagePlan& s : plan.stages) {
      const std::string range = std::to_string(s.range.first_layer + origin) + "-" +
                                std::to_string(s.range.end_layer() - 1 + origin);
      const std::string diff = previous < 0 ? ""
                                            : (s.parameters >= previous ? "+" : "-") +
                                                  Count(std::abs(s.parameters - previous));
      const std::string ratio =
          previous <= 0 ? "" : Format("%.2f", double(s.parameters) / previous);
      lines.push_back(Format(
          "[plan]   %-5d %-4d %-11s %-6d %-9s %-9s %-6s %-10.2f %-8d %-9.1f %-8.2f %-8.2f %s%s",
          s.range.stage, s.range.pp_rank, range.c_str(), s.range.num_layers,
          Count(s.parameters).c_str(), diff.c_str(), ratio.c_str(), s.activation_mib, s.in_flight,
          s.total_mib, s.forward_ms, s.backward_ms,
          config.tp > 1 ? Format("%-9.2f", s.tp_allreduce_mib).c_str() : "", s.notes.c_str()));
      previous = s.parameters;
    }
    std::string optimizer;
    for (const StagePlan& s : plan.stages) {
      optimizer += Format("%sstage %d %.2f MiB replicated, %.2f MiB with ZeRO-1",
                          optimizer.empty() ? "" : "; ", s.range.stage, s.optimizer_mib,
                          s.optimizer_zero_mib);
    }
    lines.push_back(Format("[plan]   optimizer state per rank (dp=%d, parallel.zero_stage=%d): %s",
                           config.dp, config.values().parallel().zero_stage(), optimizer.c_str()));
    std::string snapshot;
    for (const StagePlan& s : plan.stages) {
      snapshot += Format("%sstage %d at most %.2f MiB", snapshot.empty() ? "" : "; ", s.range.stage,
                         s.checkpoint_snapshot_mib);
    }
    lines.push_back(
        Format("[plan]   checkpoint snapshot per rank (host memory, with checkpoint.dir "
               "and checkpoint.async): %s",
               snapshot.c_str()));
  }
  if (best) {
    std::string versus;
    if (current && current != best && current->step_ms > 0) {
      versus = Format(", %.1f%% faster than the configured %s",
                      100.0 * (1 - best->step_ms / current->step_ms), configured.c_str());
    }
    std::string counts;
    for (const StagePlan& s : best->stages)
      counts += (counts.empty() ? "" : ", ") + std::to_string(s.range.num_layers);
    lines.push_back(Format(
        "[plan] recommend: model.partition=%s, i.e. model.layers_per_stage=[%s] (predicted step "
        "%.1f ms, bubble %.3f%s)",
        best->policy.c_str(), counts.c_str(), best->step_ms, best->bubble, versus.c_str()));
  }
  return lines;
}

std::vector<MemoryCheck> CheckMemory(const PolicyPlan& plan, const std::vector<RankRecord>& ranks) {
  std::map<int, MemoryCheck> by_rank;
  for (const StagePlan& stage : plan.stages) {
    MemoryCheck& check = by_rank[stage.range.pp_rank];
    check.pp_rank = stage.range.pp_rank;
    check.predicted_mib += stage.total_mib;
  }
  for (const RankRecord& rank : ranks) {
    auto it = by_rank.find(rank.pp);
    if (it != by_rank.end())
      it->second.measured_mib = std::max(it->second.measured_mib, rank.peak_mib);
  }
  std::vector<MemoryCheck> checks;
  for (const auto& [rank, check] : by_rank) checks.push_back(check);
  return checks;
}

std::vector<std::string> FormatMemoryChecks(const std::vector<MemoryCheck>& checks,
                                            const std::string& policy, double tolerance) {
  std::vector<std::string> lines = {
      Format("[check] policy %s: predicted against measured peak memory per pipeline rank",
             policy.c_str()),
      Format("[check]   %-8s %-14s %-13s %-8s %s", "pp rank", "predicted MiB", "measured MiB",
             "error", "verdict")};
  int outside = 0, missing = 0;
  for (const MemoryCheck& check : checks) {
    const bool measured = check.measured_mib > 0;
    const bool within = measured && std::fabs(check.error()) <= tolerance;
    outside += measured && !within;
    missing += !measured;
    lines.push_back(Format("[check]   %-8d %-14.2f %-13s %-8s %s", check.pp_rank,
                           check.predicted_mib,
                           measured ? Format("%.2f", check.measured_mib).c_str() : "-",
                           measured ? Format("%+.1f%%", 100 * check.error()).c_str() : "-",
                           !measured ? "no [memory] line"
                           : within  ? "ok"
                                     : "OFF"));
  }
  lines.push_back(
      outside + missing == 0
          ? Format("[check] verdict: every rank within %g%% of its measured peak", 100 * tolerance)
          : Format("[check] verdict: %d rank(s) outside %g%%, %d without a measurement", outside,
                   100 * tolerance, missing));
  return lines;
}

}  // namespace bigmac::plan
