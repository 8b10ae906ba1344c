#!/usr/bin/env python3
"""Tensor parallelism on the CPU: tp = 2 against tp = 1 tokens/s, and the tp all-reduce's share
of the step.

Trains the same model at tp = 1 (one rank) and tp = 2 (two ranks, one OpenMP thread each, so
tp = 2 uses two cores where tp = 1 uses one: the comparison a single-node user makes), in
alternating rounds because the machine is shared and noisy. Per round it reads metrics.jsonl:
the median tokens/s over the steps after warm-up, and at tp = 2 each rank's tp_allreduce_ms
(time inside PipelineComm::AllReduceTp, waiting for the peer included) over step_ms. Reports the
median and the spread (min..max over rounds) of each, and the all-reduce bytes per step against
the planning model (`bigmac plan`). Writes bench/out/tp.md.

  bench/tp.py [--rounds 5] [--steps 12] [--hidden 256] [--layers 4] [--seq 64] [--batch 8]
              [--data DIR] [--no-build]
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
    result = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env)
    if result.returncode != 0:
        sys.exit(f"tp: {' '.join(map(str, cmd))} failed:\n{result.stdout[-2000:]}"
                 f"\n{result.stderr[-2000:]}")
    return result.stdout


def settings(a, tp, run_dir):
    return {
        "parallel.tp_size": tp, "model.num_layers": a.layers, "model.hidden_size": a.hidden,
        "model.num_heads": 8, "train.seq_length": a.seq, "train.micro_batch_size": a.batch,
        "train.gradient_accumulation_steps": 1, "train.max_steps": a.steps,
        "train.eval_interval": 0, "train.eval_batches": 1, "train.log_interval": 1000,
        "train.output_dir": run_dir, "data.dir": a.data,
    }


def command(a, tp, run_dir, verb="train"):
    cmd = ["mpirun", "-np", tp, "--oversubscribe", "--bind-to", "none", "--mca", "btl",
           "self,vader", "--mca", "btl_vader_single_copy_mechanism", "none",
           BIGMAC, verb, "--config", REPO / "configs" / "tiny.yaml"]
    for key, value in settings(a, tp, run_dir).items():
        cmd += ["--set", f"{key}={value}"]
    return cmd


def train(a, env, out, tp, round_index):
    run_dir = out / f"tp{tp}_{round_index}"
    run(command(a, tp, run_dir), env)
    steps = [json.loads(line) for line in open(run_dir / "metrics.jsonl")][a.warmup:]
    result = {"tokens_per_s": statistics.median(s["tokens_per_s"] for s in steps)}
    if tp > 1:
        result["share"] = statistics.median(
            max(r["tp_allreduce_ms"] for r in s["ranks"]) / s["step_ms"] for s in steps)
        result["bytes"] = steps[0]["ranks"][0]["tp_allreduce_bytes"]
    return result


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--data", default=str(REPO / "data" / "fortunes"))
    parser.add_argument("--no-build", action="store_true", help="use bazel-bin/bigmac as it is")
    a = parser.parse_args()
    if not a.no_build:
        subprocess.run([REPO / "launch" / "setup.sh"], check=True)
        subprocess.run(["bazel", "build", "//:bigmac"], cwd=REPO, check=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    out = REPO / "bench" / "out"
    out.mkdir(parents=True, exist_ok=True)
    rounds = {1: [], 2: []}
    for i in range(a.rounds):
        for tp in (1, 2) if i % 2 == 0 else (2, 1):  # alternate the order too
            rounds[tp].append(train(a, env, out, tp, i))
    ratios = [r2["tokens_per_s"] / r1["tokens_per_s"] for r1, r2 in zip(rounds[1], rounds[2])]
    shares = [r["share"] for r in rounds[2]]
    plan = run(command(a, 2, out / "tp_plan", "plan") + ["--world-size", "2"], env)
    planned = re.findall(r"^\[plan\]\s+0\s+0\s.*?(\d+\.\d+)\s+embedding", plan, re.M)
    spread = lambda v: f"{statistics.median(v):.3g} ({min(v):.3g}..{max(v):.3g})"
    lines = [
        f"# tp = 2 against tp = 1 on the CPU ({a.rounds} alternating rounds)", "",
        f"model: {a.layers} blocks, hidden {a.hidden}, 8 heads, seq {a.seq}, micro-batch "
        f"{a.batch}; one OpenMP thread per rank", "",
        "| | median (min..max over rounds) |", "|---|---|",
        f"| tp=1 tokens/s | {spread([r['tokens_per_s'] for r in rounds[1]])} |",
        f"| tp=2 tokens/s | {spread([r['tokens_per_s'] for r in rounds[2]])} |",
        f"| tp=2 / tp=1 (same round) | {spread(ratios)} |",
        f"| tp all-reduce share of the tp=2 step (slowest rank) | {spread(shares)} |",
        f"| tp all-reduce MiB per step per rank, measured | "
        f"{rounds[2][0]['bytes'] / 2**20:.2f} |",
        f"| the same, `bigmac plan` | {planned[0] if planned else '(not found)'} |",
    ]
    (out / "tp.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
