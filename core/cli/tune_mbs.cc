// `bigmac tune-mbs`: the largest micro-batch that fits, by bisection over real training runs (seed
// 2).
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <regex>
#include <sstream>

#include "core/cli/commands.h"
#include "core/cli/exit_codes.h"
#include "core/cli/run_record.h"
#include "core/cli/startup_checks.h"
#include "core/config/errors.h"
#include "core/config/loader.h"
#include "core/config/resolve.h"
#include "core/partition/partition.h"
#include "core/plan/plan.h"
#include "core/util/files.h"
#include "core/util/format.h"
#include "core/util/output_file.h"
#include "core/util/process.h"

namespace bigmac::cli {
namespace {

enum class Outcome { kFits, kOutOfMemory, kNaN, kFailure, kTimeout };

const char* OutcomeName(Outcome outcome) {
  switch (outcome) {
    case Outcome::kFits:
      return "fits";
    case Outcome::kOutOfMemory:
      return "out of memory";
    case Outcome::kNaN:
      return "NaN (a numerical problem, not memory)";
    case Outcome::kFailure:
      return "failed without running out of memory";
    case Outcome::kTimeout:
      return "timed out";
  }
  return "?";
}

struct Try {
  Outcome outcome;
  std::string detail;  // the line that decided it
  std::string output;  // the child's stdout and stderr
};

std::string Replace(std::string text, const std::string& from, const std::string& to) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
  return text;
}

// Runs `command` with a deadline; classifies its end like seed 2: only an out-of-memory error (the
// allocator's, exit code 3, or CUDA's own words) means "does not fit".
Try Classify(const util::ChildResult& child, int timeout_seconds) {
  const std::string& output = child.output;
  const int code = child.exit_code;
  const double elapsed = child.seconds;
  auto line_with = [&output](const std::regex& pattern) {
    std::smatch match;
    std::istringstream lines(output);
    for (std::string line; std::getline(lines, line);) {
      if (std::regex_search(line, match, pattern)) return line;
    }
    return std::string();
  };
  static const std::regex kOom(
      "out of memory|CUDA error: out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED",
      std::regex::icase);
  static const std::regex kNan("non-finite|the loss is nan|the loss is inf", std::regex::icase);
  if (code == 124 || (code == 137 && elapsed >= timeout_seconds)) {
    return {Outcome::kTimeout, "no result within " + std::to_string(timeout_seconds) + " s"};
  }
  // Killed (SIGKILL) before the deadline: on Linux that is the kernel's out-of-memory killer.
  if (code == 137)
    return {Outcome::kOutOfMemory,
            "killed by SIGKILL before the deadline (the kernel's OOM killer)"};
  if (code == 0) return {Outcome::kFits, ""};
  if (std::string line = line_with(kOom); code == kExitOutOfMemory || !line.empty()) {
    return {Outcome::kOutOfMemory, line};
  }
  if (std::string line = line_with(kNan); code == kExitNumerical || !line.empty())
    return {Outcome::kNaN, line};
  std::string last;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty() && line.find("----") == std::string::npos) last = line;
  }
  return {Outcome::kFailure, "exit " + std::to_string(code) + ": " + last};
}

Try RunTry(const std::string& command, int timeout_seconds) {
  const util::ChildResult child = util::RunChild(command, timeout_seconds);
  Try result = Classify(child, timeout_seconds);
  result.output = child.output;
  return result;
}

// The comparison `plan --check` makes, for a try that ran: the plan's predicted peak per pipeline
// rank at micro-batch `mbs` (the layout the tries run, `overrides` applied) against the try's
// [memory] lines. One line; `*worst` keeps the largest |error|, `*compared` says whether any
// rank was compared.
std::string MemoryAgainstPlan(const std::string& config_file,
                              const std::vector<std::string>& overrides, int world, int mbs,
                              const std::string& output, double* worst, bool* compared) {
  std::vector<std::string> sets = overrides;
  sets.push_back("train.micro_batch_size=" + std::to_string(mbs));
  const config::ResolvedConfig resolved =
      config::Resolve(config::LoadConfig(config_file, sets), world, "tune-mbs");
  const std::vector<plan::PolicyPlan> plans =
      plan::PlanPolicies(resolved, plan::EstimateLayerTimes(resolved, 20));
  const std::string policy = partition::PolicyName(resolved.policy);
  const auto it = std::find_if(plans.begin(), plans.end(),
                               [&](const plan::PolicyPlan& p) { return p.policy == policy; });
  if (it == plans.end() || !it->valid) return "no plan for policy " + policy;
  std::string line;
  for (const plan::MemoryCheck& check : plan::CheckMemory(*it, ReadMemoryLines(output))) {
    if (check.measured_mib <= 0) continue;
    *worst = std::max(*worst, std::fabs(check.error()));
    *compared = true;
    line +=
        util::Format("%spp %d %.1f / %.1f MiB (%+.1f%%)", line.empty() ? "" : ", ", check.pp_rank,
                     check.predicted_mib, check.measured_mib, 100 * check.error());
  }
  return line.empty() ? "no [memory] line in the try's output"
                      : "plan's predicted / measured peak: " + line;
}

// Sets train.micro_batch_size in the YAML file, on its line if the file sets it, else under train:.
bool WriteMicroBatch(const std::string& file, const config::LoadedConfig& loaded, int value,
                     std::string* error) {
  std::string text;
  if (std::string problem = util::ReadUserFile(file, config::kMaxConfigBytes, "config file", &text);
      !problem.empty()) {
    *error = problem;
    return false;
  }
  std::istringstream in(text);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  const config::Source& source = loaded.sources.Get("train.micro_batch_size");
  const std::regex key(R"(^(\s*micro_batch_size\s*:\s*)([^#\s]+)(.*)$)");
  std::smatch match;
  // The line the file sets it on, or else any micro_batch_size line in the file (it may have been
  // overridden by --set), or else a new line under train:.
  int target = -1;
  if (source.kind == config::Source::Kind::kFile && source.file == file && source.line >= 1 &&
      source.line <= static_cast<int>(lines.size()) &&
      std::regex_match(lines[source.line - 1], match, key)) {
    target = source.line - 1;
  }
  for (size_t i = 0; target < 0 && i < lines.size(); ++i) {
    if (std::regex_match(lines[i], match, key)) target = static_cast<int>(i);
  }
  if (target >= 0) {
    std::regex_match(lines[target], match, key);
    lines[target] = match[1].str() + std::to_string(value) + match[3].str();
  } else {
    size_t train = lines.size();
    for (size_t i = 0; i < lines.size(); ++i) {
      if (lines[i].rfind("train:", 0) == 0) train = i;
    }
    if (train == lines.size()) {
      lines.push_back("train:");
      train = lines.size() - 1;
    }
    lines.insert(lines.begin() + static_cast<long>(train) + 1,
                 "  micro_batch_size: " + std::to_string(value) + "   # bigmac tune-mbs");
  }
  std::string contents;
  for (const std::string& line : lines) contents += line + "\n";
  *error = util::WriteWholeFile(file, contents);
  return error->empty();
}

}  // namespace

int RunTuneMbs(const TuneMbsOptions& options) {
  config::LoadedConfig loaded;
  config::ResolvedConfig resolved;
  std::vector<std::string> single = options.overrides;  // the layout the tries run
  try {
    loaded = config::LoadConfig(options.config, options.overrides);
    const int world = options.pipeline
                          ? loaded.values.parallel().pp_size() * loaded.values.parallel().tp_size()
                          : 1;
    if (!options.pipeline) {
      for (const char* set :
           {"parallel.pp_size=1", "parallel.tp_size=1", "parallel.virtual_stages=1",
            "parallel.schedule=gpipe", "parallel.num_microbatches=1",
            "train.gradient_accumulation_steps=1", "model.partition=spread_first",
            "model.layers_per_stage=[]", "model.split_points=[]"}) {
        single.push_back(set);
      }
    }
    resolved = config::Resolve(config::LoadConfig(options.config, single), world, "tune-mbs");
  } catch (const config::ConfigError& error) {
    std::fprintf(stderr, "bigmac: invalid configuration:\n%s\n", error.what());
    return kExitConfig;
  }
  // --write's file is checked before the search, which may take hours.
  if (std::string problem = OutputFileProblem("--write", options.config,
                                              /*overwrite=*/true);  // --write means to edit it
      options.write && !problem.empty()) {
    return ReportFailure(problem, kExitOutput);
  }
  if (options.lo < 1 || options.hi <= options.lo) {
    std::fprintf(stderr, "bigmac: tune-mbs needs 1 <= --lo < --hi (got %d, %d)\n", options.lo,
                 options.hi);
    return kExitConfig;
  }
  const int world = resolved.world_size;
  std::string base = options.child_command;
  if (base.empty()) {
    std::string command =
        util::ShellQuote(util::SelfPath()) + " train --config " + util::ShellQuote(options.config);
    for (const std::string& set : options.overrides) command += " --set " + util::ShellQuote(set);
    if (!options.pipeline) {
      command +=
          " --set parallel.pp_size=1 --set parallel.tp_size=1 --set parallel.virtual_stages=1"
          " --set parallel.schedule=gpipe --set parallel.num_microbatches=1"
          " --set train.gradient_accumulation_steps=1 --set model.partition=spread_first"
          " --set 'model.layers_per_stage=[]' --set 'model.split_points=[]'";
    }
    // The model, precision, sequence length and recomputation stay as configured; only the
    // micro-batch changes, over a few steps with no checkpoints, traces or evaluation.
    command +=
        " --set train.micro_batch_size={mbs} --set train.max_steps=" +
        std::to_string(options.steps) +
        " --set train.log_interval=1 --set train.eval_batches=1 --set train.eval_interval=0"
        " --set 'checkpoint.dir=\"\"' --set 'train.output_dir=\"\"' --set optim.warmup_steps=0";
    base = options.pipeline
               ? Replace(options.launcher, "{np}", std::to_string(world)) + " " + command
               : command;
  }
  std::printf("tune-mbs: bisection over micro_batch_size in [%d, %d], %d step(s) per try, %s\n",
              options.lo, options.hi, options.steps,
              options.pipeline
                  ? ("the real pipeline on " + std::to_string(world) + " ranks").c_str()
                  : "one rank with the whole model");
  double worst_error = 0;
  int compared = 0;
  auto run = [&](int mbs) {
    const Try t = RunTry(Replace(base, "{mbs}", std::to_string(mbs)), options.timeout_seconds);
    std::printf("  try micro_batch_size=%-4d %s%s%s\n", mbs, OutcomeName(t.outcome),
                t.detail.empty() ? "" : ": ", t.detail.c_str());
    if (t.outcome == Outcome::kFits && options.child_command.empty()) {
      try {
        bool made = false;
        std::printf("    %s\n", MemoryAgainstPlan(options.config, single, world, mbs, t.output,
                                                  &worst_error, &made)
                                    .c_str());
        compared += made;
      } catch (const std::exception& error) {
        std::printf("    no plan for micro_batch_size=%d: %s\n", mbs, error.what());
      }
    }
    std::fflush(stdout);
    return t;
  };
  int lo = options.lo;
  int hi = options.hi + 1;  // --hi is the largest size tried; the search keeps hi as "does not fit"
  const Try first = run(lo);
  if (first.outcome != Outcome::kFits) {
    std::printf(
        "stopped: the lower bound %d does not run (%s); nothing fits or the run is broken\n", lo,
        OutcomeName(first.outcome));
    return kExitFailure;
  }
  std::string reason = "converged (lo + 1 == hi)";
  std::string binding;
  std::vector<int> uncertain;  // sizes that failed for another reason than memory
  Outcome previous = Outcome::kFits;
  while (lo + 1 < hi) {
    const int mid = lo + (hi - lo) / 2;
    const Try t = run(mid);
    if (t.outcome == Outcome::kFits) {
      lo = mid;
    } else if (t.outcome == Outcome::kOutOfMemory) {
      hi = mid;
      binding = t.detail;
    } else if (t.outcome == Outcome::kTimeout) {
      reason = "a try timed out (" + t.detail + "); the search stops rather than guess";
      break;
    } else {
      // A failure that is not out of memory says nothing about fitting: stop if failures mix,
      // otherwise search below it and say that the maximum is uncertain.
      if (previous == Outcome::kOutOfMemory) {
        reason = "two tries in a row mixed out-of-memory and other failures";
        break;
      }
      uncertain.push_back(mid);
      hi = mid;
    }
    if (t.outcome == Outcome::kOutOfMemory &&
        (previous == Outcome::kFailure || previous == Outcome::kNaN)) {
      reason = "two tries in a row mixed out-of-memory and other failures";
      break;
    }
    previous = t.outcome;
  }
  const int recommended = std::max(1, lo * 4 / 5);
  std::printf("stopped: %s\n", reason.c_str());
  for (int size : uncertain) {
    std::printf(
        "note: micro_batch_size=%d failed for a reason other than memory; the true maximum may be "
        "higher\n",
        size);
  }
  std::printf(
      "max micro_batch_size = %d; recommended %d (about 80%%, leaving room for the pipeline's "
      "buffers)\n",
      lo, recommended);
  if (compared > 0) {
    std::printf(
        "memory model: the plan's peaks were within %.1f%% of the measured ones over %d "
        "tr%s that ran (%s; bigmac plan --check makes the same comparison)\n",
        100 * worst_error, compared, compared == 1 ? "y" : "ies",
        worst_error <= 0.10 ? "within 10%" : "OUTSIDE 10%: the plan is off for this model");
  }
  if (options.pipeline && !binding.empty()) {
    const std::regex rank_pattern(R"(cpu:(\d+)|rank (\d+))");
    std::smatch match;
    if (std::regex_search(binding, match, rank_pattern)) {
      const int rank = std::stoi(match[1].matched ? match[1].str() : match[2].str());
      std::printf("binding stage: rank %d (pp %d) ran out of memory first\n", rank,
                  rank / resolved.tp);
    }
  }
  if (options.write) {
    std::string error;
    if (!WriteMicroBatch(options.config, loaded, recommended, &error)) {
      std::fprintf(stderr, "bigmac: %s\n", error.c_str());
      return kExitOutput;
    }
    std::printf("wrote train.micro_batch_size: %d into %s\n", recommended, options.config.c_str());
  }
  return kExitOk;
}

}  // namespace bigmac::cli
