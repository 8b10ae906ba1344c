#!/usr/bin/env python3
"""Pipeline overhead: measured busy and wait time per rank against the schedule simulator.

For each pp and m, trains the tiny model under mpirun with the 1F1B schedule (or --schedule),
reads each rank's forward, backward and wait milliseconds per step from metrics.jsonl (the same
spans the Perfetto trace shows), and feeds the measured per-micro-batch forward and backward time
of every stage into `bigmac schedule --forward-ms ... --backward-ms ...`. The simulator then
predicts each rank's waiting for that flush; the gap is what the pipeline costs beyond the
schedule's own bubble (transfers, polling latency, CPU sharing).

  bench/pipeline_overhead.py [--pp 2,4] [--m 4,8,16] [--steps 8] [--schedule 1f1b]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIGMAC = REPO / "bazel-bin" / "bigmac"


def run(cmd, env):
    result = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        sys.exit(f"pipeline_overhead: {' '.join(map(str, cmd))} failed:\n{result.stdout[-2000:]}"
                 f"\n{result.stderr[-2000:]}")
    return result.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pp", default="2,4")
    ap.add_argument("--m", default="4,8,16")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--schedule", default="1f1b")
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--out", default=str(REPO / "bench" / "out"))
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cores = os.cpu_count() or 1
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_WAIT_POLICY="passive")
    rows = []
    for pp in map(int, a.pp.split(",")):
        for m in map(int, a.m.split(",")):
            run_dir = out / f"pipeline_pp{pp}_m{m}"
            run(["mpirun", "-np", str(pp), "--oversubscribe", "--bind-to", "none",
                 BIGMAC, "train", "--config", REPO / "configs" / "tiny.yaml",
                 "--set", f"parallel.pp_size={pp}", "--set", f"parallel.schedule={a.schedule}",
                 "--set", f"train.gradient_accumulation_steps={m}",
                 "--set", f"train.micro_batch_size={a.micro_batch}",
                 "--set", f"train.max_steps={a.steps}", "--set", "train.eval_interval=0",
                 "--set", "train.eval_batches=1", "--set", "train.log_interval=1000",
                 "--set", f"train.output_dir={run_dir}"], env)
            steps = [json.loads(l) for l in open(run_dir / "metrics.jsonl")][a.warmup:]
            mean = lambda key, r: statistics.mean(s["ranks"][r][key] for s in steps)
            forward = [mean("forward_ms", r) / m for r in range(pp)]
            backward = [mean("backward_ms", r) / m for r in range(pp)]
            wait = [mean("wait_ms", r) for r in range(pp)]
            step_ms = statistics.mean(s["step_ms"] for s in steps)
            sim = run([BIGMAC, "schedule", "--kind", a.schedule, "--pp", str(pp),
                       "--microbatches", str(m), "--trace", run_dir / "simulated.json",
                       "--forward-ms", ",".join(f"{x:.4f}" for x in forward),
                       "--backward-ms", ",".join(f"{x:.4f}" for x in backward)], env)
            predicted = [float(x) for x in re.findall(r"waiting ([0-9.]+)", sim)]
            makespan = float(re.search(r"x ([0-9.]+) time units", sim).group(1))
            rows.append({"pp": pp, "m": m, "forward_ms": forward, "backward_ms": backward,
                         "measured_wait_ms": wait, "predicted_wait_ms": predicted,
                         "step_ms": step_ms, "predicted_flush_ms": makespan})
            gap = (sum(wait) - sum(predicted)) / max(sum(predicted), 1e-9)
            print(f"pp={pp} m={m}: wait measured {sum(wait):.1f} ms, predicted {sum(predicted):.1f}"
                  f" ms ({100 * gap:+.1f}%); step {step_ms:.1f} ms, simulated flush {makespan:.1f} ms",
                  flush=True)
    lines = [f"Pipeline overhead, {a.schedule}, tiny model (L4 C128 T128, micro-batch "
             f"{a.micro_batch}), {cores} cores, mean of steps {a.warmup + 1}-{a.steps}. Wait = time "
             "blocked on another rank within a step (trace 'wait' spans); predicted = the "
             "simulator's waiting before each rank's last computation, from the measured "
             "per-stage forward/backward times.", "",
             "| pp | m | ranks per core | measured wait per rank (ms) | predicted (ms) | gap (sum) | step ms | simulated flush ms |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        gap = (sum(r["measured_wait_ms"]) - sum(r["predicted_wait_ms"])) / max(
            sum(r["predicted_wait_ms"]), 1e-9)
        lines.append(
            f"| {r['pp']} | {r['m']} | {r['pp'] / cores:.1f} | "
            f"{', '.join(f'{x:.1f}' for x in r['measured_wait_ms'])} | "
            f"{', '.join(f'{x:.1f}' for x in r['predicted_wait_ms'])} | {100 * gap:+.1f}% | "
            f"{r['step_ms']:.1f} | {r['predicted_flush_ms']:.1f} |")
    report = "\n".join(lines)
    print(report)
    (out / f"pipeline_overhead_{a.schedule}.md").write_text(report + "\n")
    (out / f"pipeline_overhead_{a.schedule}.json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
