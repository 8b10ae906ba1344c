#!/usr/bin/env python3
"""ZeRO-1 (parallel.zero_stage=1) on the CPU: optimizer memory per rank and step time, on vs off.

For each dp, trains the same model under mpirun (pp = 1, one thread per rank) with
parallel.zero_stage=0 and =1, alternating rounds with the order flipped each round, and reports
per rank the AdamW state from the [memory] summary (elements and MiB), and the median step time
of each setting with the spread (min-max) of the per-round ratios zero / replicated.

  bench/zero.py [--dps 2,4] [--rounds 3] [--steps 12] [--hidden 256]
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
MEMORY = re.compile(r"\[memory\] rank (\d+) .* optimizer state for (\d+) \(([0-9.]+) MiB")


def run(cmd, env):
    result = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env)
    if result.returncode != 0:
        sys.exit(f"zero: {' '.join(map(str, cmd))} failed:\n{result.stdout[-2000:]}"
                 f"\n{result.stderr[-2000:]}")
    return result.stdout + result.stderr


def train(a, env, out, dp, zero, round_index):
    run_dir = out / f"zero_dp{dp}_{zero}_{round_index}"
    sets = {
        "parallel.zero_stage": zero, "parallel.dp_bucket_size": a.bucket,
        "train.gradient_accumulation_steps": a.accum, "train.micro_batch_size": a.micro_batch,
        "train.seq_length": a.seq, "model.num_layers": a.layers, "model.hidden_size": a.hidden,
        "model.num_heads": a.heads, "train.max_steps": a.steps, "train.eval_interval": 0,
        "train.eval_batches": 1, "train.log_interval": 1000, "train.output_dir": run_dir,
        "data.dir": a.data,
    }
    cmd = ["mpirun", "-np", dp, "--oversubscribe", "--bind-to", "none", "--mca", "btl",
           "self,vader", "--mca", "btl_vader_single_copy_mechanism", "none",
           BIGMAC, "train", "--config", REPO / "configs" / "tiny.yaml"]
    for key, value in sets.items():
        cmd += ["--set", f"{key}={value}"]
    output = run(cmd, env)
    steps = [json.loads(line) for line in open(run_dir / "metrics.jsonl")][a.warmup:]
    memory = {int(m.group(1)): (int(m.group(2)), float(m.group(3)))
              for m in MEMORY.finditer(output)}
    return {"step_ms": statistics.median(s["step_ms"] for s in steps), "memory": memory}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dps", default="2,4")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--accum", type=int, default=2)
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--bucket", default="4MiB")
    ap.add_argument("--data", default=str(REPO / "data" / "fortunes"))
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--out", default=str(REPO / "bench" / "out"))
    a = ap.parse_args()
    if not a.no_build:
        run([REPO / "launch" / "setup.sh"], dict(os.environ))
        run(["bazel", "build", "//:bigmac"], dict(os.environ))
    if not Path(a.data).exists():
        corpus = sorted(p for p in Path("/usr/share/games/fortunes").iterdir()
                        if p.is_file() and "." not in p.name)
        run([BIGMAC, "data", "prep", "--input", *corpus, "--output", a.data], dict(os.environ))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_WAIT_POLICY="passive", OMP_NUM_THREADS="1")
    for dp in map(int, a.dps.split(",")):
        runs = {0: [], 1: []}
        for r in range(a.rounds):
            for zero in ((0, 1) if r % 2 == 0 else (1, 0)):
                runs[zero].append(train(a, env, out, dp, zero, r))
                print(f"dp={dp} zero_stage={zero} round {r + 1}: "
                      f"{runs[zero][-1]['step_ms']:.1f} ms/step", flush=True)
        for zero in (0, 1):
            memory = runs[zero][0]["memory"]
            per_rank = ", ".join(f"rank {k}: {n} elements {mib:.3f} MiB"
                                 for k, (n, mib) in sorted(memory.items()))
            print(f"dp={dp} zero_stage={zero}: optimizer state per rank: {per_rank}")
        off = statistics.median(x["step_ms"] for x in runs[0])
        on = statistics.median(x["step_ms"] for x in runs[1])
        ratios = [b["step_ms"] / c["step_ms"] for c, b in zip(runs[0], runs[1])]
        print(f"dp={dp}: step {off:.1f} ms replicated, {on:.1f} ms ZeRO-1, ratio {on / off:.3f} "
              f"(per round {min(ratios):.3f}-{max(ratios):.3f}, {a.rounds} rounds)", flush=True)


if __name__ == "__main__":
    main()
