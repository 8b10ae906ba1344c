// `bigmac compare`: a short, fair run of two layouts, a table, the seed's verdict, a report.
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include "core/cli/commands.h"
#include "core/cli/exit_codes.h"
#include "core/cli/run_record.h"
#include "core/cli/startup_checks.h"
#include "core/config/errors.h"
#include "core/config/resolve.h"
#include "core/plan/compare.h"
#include "core/util/dir_lock.h"
#include "core/util/files.h"
#include "core/util/format.h"
#include "core/util/output_file.h"
#include "core/util/process.h"
#include "nlohmann/json.hpp"

namespace bigmac::cli {
using util::Format;

namespace {

// Step time and loss per step for both runs, as an SVG line chart.
std::string Chart(const plan::RunRecord& a, const plan::RunRecord& b, int warmup) {
  const int width = 760, height = 260, margin = 50;
  std::string svg = Format(
      R"(<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">)",
      width, 2 * height + 20);
  svg += R"(<rect width="100%" height="100%" fill="white"/>)";
  auto panel = [&](int top, const std::string& title, const std::vector<double>& ya,
                   const std::vector<double>& yb, int first_step) {
    double lo = 1e300, hi = -1e300;
    for (const auto* ys : {&ya, &yb}) {
      for (double y : *ys) {
        if (std::isfinite(y)) lo = std::min(lo, y), hi = std::max(hi, y);
      }
    }
    if (lo > hi) lo = 0, hi = 1;
    if (hi - lo < 1e-9) hi = lo + 1;
    const size_t n = std::max<size_t>(2, std::max(ya.size(), yb.size()));
    auto x = [&](size_t i) { return margin + double(i) * (width - 2 * margin) / double(n - 1); };
    auto y = [&](double v) {
      return top + height - margin / 2 - (v - lo) / (hi - lo) * (height - margin);
    };
    svg +=
        Format(R"(<text x="%d" y="%d" font-size="13">%s</text>)", margin, top + 14, title.c_str());
    svg += Format(R"(<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#999"/>)", margin, y(lo),
                  width - margin, y(lo));
    svg += Format(R"(<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#999"/>)", margin, y(lo),
                  margin, y(hi));
    svg += Format(R"(<text x="4" y="%.1f">%.3g</text><text x="4" y="%.1f">%.3g</text>)", y(hi) + 4,
                  hi, y(lo), lo);
    svg +=
        Format(R"(<text x="%d" y="%.1f">step %d</text><text x="%d" y="%.1f">step %zu</text>)",
               margin, y(lo) + 14, first_step, width - margin - 40, y(lo) + 14, first_step + n - 1);
    const char* colors[2] = {"#1f77b4", "#ff7f0e"};
    const std::vector<double>* series[2] = {&ya, &yb};
    for (int s = 0; s < 2; ++s) {
      std::string points;
      for (size_t i = 0; i < series[s]->size(); ++i) {
        if (std::isfinite((*series[s])[i]))
          points += Format("%.1f,%.1f ", x(i), y((*series[s])[i]));
      }
      svg += Format(R"(<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>)",
                    colors[s], points.c_str());
    }
  };
  panel(0, "step time (ms), after warm-up", a.step_ms, b.step_ms, warmup + 1);
  panel(height + 20, "loss", a.loss, b.loss, 1);
  svg += Format(R"(<text x="%d" y="14" fill="#1f77b4">baseline: %s</text>)", width - 330,
                a.name.c_str());
  svg += Format(R"(<text x="%d" y="28" fill="#ff7f0e">candidate: %s</text>)", width - 330,
                b.name.c_str());
  return svg + "</svg>\n";
}

}  // namespace

int RunCompare(const CompareOptions& options) {
  if (options.steps <= options.warmup + 1) {
    std::fprintf(stderr, "bigmac: compare needs --steps > --warmup + 1 (got %d and %d)\n",
                 options.steps, options.warmup);
    return kExitConfig;
  }
  if (std::string problem = OutputDirProblem("--out", options.out); !problem.empty()) {
    return ReportFailure(problem, kExitOutput);
  }
  // Its outputs: the reports and the two runs' directories, which each comparison replaces.
  if (std::string problem =
          ReplaceProblem("--out",
                         {options.out + "/report.md", options.out + "/report.svg",
                          options.out + "/baseline", options.out + "/candidate"},
                         options.overwrite || options.out == CompareOptions().out);
      !problem.empty()) {
    return ReportFailure(problem, kExitOutput);
  }
  config::LoadedConfig base_loaded, cand_loaded;
  try {
    base_loaded = config::LoadConfig(options.baseline, options.baseline_overrides);
    cand_loaded = config::LoadConfig(options.candidate, options.candidate_overrides);
  } catch (const config::ConfigError& error) {
    std::fprintf(stderr, "bigmac: %s\n", error.what());
    return kExitConfig;
  }
  // The same data, seed and sequence length for both: the candidate follows the baseline.
  std::vector<std::string> same = {
      "data.dir=" + base_loaded.values.data().dir(),
      "train.seed=" + std::to_string(base_loaded.values.train().seed()),
      "train.seq_length=" + std::to_string(base_loaded.values.train().seq_length())};
  struct Side {
    std::string name, config;
    std::vector<std::string> sets;
    int np;
  };
  auto ranks = [](const config::LoadedConfig& l, int np) {
    return np > 0 ? np : l.values.parallel().pp_size() * l.values.parallel().tp_size();
  };
  std::vector<std::string> cand_sets = options.candidate_overrides;
  cand_sets.insert(cand_sets.end(), same.begin(), same.end());
  const Side sides[2] = {
      {"baseline", options.baseline, options.baseline_overrides,
       ranks(base_loaded, options.np_baseline)},
      {"candidate", options.candidate, cand_sets, ranks(cand_loaded, options.np_candidate)}};
  // Both layouts are checked at their rank counts before either runs: a candidate that cannot
  // start must not cost the baseline's run first.
  for (const Side& side : sides) {
    try {
      config::Resolve(config::LoadConfig(side.config, side.sets), side.np, "--np-" + side.name);
    } catch (const config::ConfigError& error) {
      std::fprintf(stderr, "bigmac: the %s cannot run on %d ranks:\n%s\n", side.name.c_str(),
                   side.np, error.what());
      return kExitConfig;
    }
  }
  // One comparison per --out: a second one would delete the run directories the first is using.
  std::string lock_problem, lock_note;
  const std::unique_ptr<util::DirectoryLock> lock =
      util::DirectoryLock::Acquire(options.out, "--out", "compare", &lock_problem, &lock_note);
  if (!lock) return ReportFailure(lock_problem, kExitOutput);
  if (!lock_note.empty()) std::printf("%s\n", lock_note.c_str());
  plan::RunRecord records[2];
  for (int s = 0; s < 2; ++s) {
    const Side& side = sides[s];
    const std::string dir = options.out + "/" + side.name;
    std::filesystem::remove_all(dir);
    std::string command = options.launcher;
    for (size_t at = command.find("{np}"); at != std::string::npos; at = command.find("{np}")) {
      command.replace(at, 4, std::to_string(side.np));
    }
    command += " " + util::ShellQuote(util::SelfPath()) + " train --config " +
               util::ShellQuote(side.config);
    for (const std::string& set : side.sets) command += " --set " + util::ShellQuote(set);
    command +=
        " --set train.max_steps=" + std::to_string(options.steps) +
        " --set train.output_dir=" + util::ShellQuote(dir) +
        " --set train.log_interval=1000000 --set train.eval_interval=0 --set train.eval_batches=1"
        " --set 'checkpoint.dir=\"\"'";
    std::printf("compare: running %s (%d ranks, %d steps, %d warm-up)\n", side.name.c_str(),
                side.np, options.steps, options.warmup);
    std::fflush(stdout);
    const util::ChildResult run = util::RunChild(command);
    if (run.exit_code != 0) {
      std::fprintf(stderr, "bigmac: the %s run failed with exit code %d:\n%s\n", side.name.c_str(),
                   run.exit_code, run.output.c_str());
      // A run's own documented code (bad data, no space, ...) is the comparison's too.
      return run.exit_code > kExitFailure && run.exit_code <= kExitDevice ? run.exit_code
                                                                          : kExitFailure;
    }
    records[s] = ReadRunRecord(side.config, dir, run.output, options.warmup);
  }
  const plan::Verdict verdict =
      plan::Judge(records[0], records[1], cand_loaded.values.model().partition());

  // The table.
  std::vector<std::array<std::string, 3>> rows;
  auto add = [&rows](const std::string& metric, const std::string& a, const std::string& b) {
    rows.push_back({metric, a, b});
  };
  auto both = [&](const char* metric, auto get) { add(metric, get(records[0]), get(records[1])); };
  both("ranks", [](const plan::RunRecord& r) { return std::to_string(r.ranks.size()); });
  both("micro_batch_size / num_microbatches", [](const plan::RunRecord& r) {
    return std::to_string(r.micro_batch_size) + " / " + std::to_string(r.num_microbatches);
  });
  both("mean step (ms, after warm-up)",
       [](const plan::RunRecord& r) { return Format("%.1f", plan::Mean(r.step_ms)); });
  both("rolling mean step, last 5 steps (ms)", [](const plan::RunRecord& r) {
    const size_t k = std::min<size_t>(5, r.step_ms.size());
    return Format("%.1f", plan::Mean(std::vector<double>(r.step_ms.end() - k, r.step_ms.end())));
  });
  both("step-time drift over the run (ms)", [](const plan::RunRecord& r) {
    return Format("%+.1f", plan::Slope(r.step_ms) * r.step_ms.size());
  });
  both("peak memory, highest rank (% of capacity)", [](const plan::RunRecord& r) {
    double worst = 0;
    for (const auto& k : r.ranks)
      worst = std::max(worst, k.capacity_mib > 0 ? k.peak_mib / k.capacity_mib : 0);
    return Format("%.1f%%", worst * 100);
  });
  both("final loss", [](const plan::RunRecord& r) {
    return r.loss.empty() ? std::string("-") : Format("%.4f", r.loss.back());
  });
  both("NaN steps / clipped steps (after warm-up)", [](const plan::RunRecord& r) {
    return std::to_string(r.nan_steps) + " / " + std::to_string(r.clipped_steps);
  });
  for (int stage = 0; stage < 16; ++stage) {
    std::string cells[2];
    bool any = false;
    for (int s = 0; s < 2; ++s) {
      for (const auto& k : records[s].ranks) {
        if (k.pp == stage && k.dp == 0) {
          cells[s] = Format("fwd %.1f / bwd %.1f / wait %.1f ms, busy %.1f ms, peak %.1f MiB",
                            k.forward_ms, k.backward_ms, k.wait_ms, k.busy_ms, k.peak_mib);
          any = true;
        }
      }
    }
    if (any)
      add("pp rank " + std::to_string(stage) + " (first replica)",
          cells[0].empty() ? "-" : cells[0], cells[1].empty() ? "-" : cells[1]);
  }
  std::string markdown =
      "# bigmac compare\n\nBaseline `" + options.baseline + "`, candidate `" + options.candidate +
      "`: " + std::to_string(options.steps) + " steps each, the first " +
      std::to_string(options.warmup) +
      " left out of the timings; the candidate uses the baseline's data, seed and sequence "
      "length.\n\n| metric | baseline | candidate |\n|---|---|---|\n";
  std::printf("\n%-44s %-48s %s\n", "metric", "baseline", "candidate");
  for (const auto& [metric, a, b] : rows) {
    std::printf("%-44s %-48s %s\n", metric.c_str(), a.c_str(), b.c_str());
    markdown += "| " + metric + " | " + a + " | " + b + " |\n";
  }
  markdown += "\n## Verdict on the candidate\n\n";
  std::printf("\nverdict on the candidate:\n");
  for (const plan::Check& check : verdict.checks) {
    const std::string line = Format("%s %s: %s (rule: %s)", check.pass ? "PASS" : "FAIL",
                                    check.name.c_str(), check.detail.c_str(), check.rule.c_str());
    std::printf("  %s\n", line.c_str());
    markdown += "- " + line + "\n";
  }
  const std::string summary =
      verdict.feasible ? "feasible: all three conditions hold"
                       : "not feasible yet: fix the failed condition(s) before a long run";
  std::printf("  => %s\nbottleneck: %s\n", summary.c_str(), verdict.bottleneck.c_str());
  markdown += "\n**" + summary + "**\n\nBottleneck: " + verdict.bottleneck +
              "\n\n![step time and loss](report.svg)\n";
  for (const auto& [name, contents] :
       {std::pair<std::string, std::string>{"report.md", markdown},
        {"report.svg", Chart(records[0], records[1], options.warmup)}}) {
    if (std::string problem = util::WriteWholeFile(options.out + "/" + name, contents);
        !problem.empty()) {
      return ReportFailure(problem, kExitOutput);
    }
  }
  std::printf("report: %s/report.md, chart: %s/report.svg\n", options.out.c_str(),
              options.out.c_str());
  return kExitOk;
}

}  // namespace bigmac::cli
