#!/usr/bin/env python3
"""bf16 against fp32 on the CPU backend: tokens/s and bytes moved between stages, side by side.

Trains the same model (configs/tiny.yaml, optionally cut into --pp stages under mpirun) with
precision.dtype=fp32 and =bf16 in alternating rounds, and reads from metrics.jsonl each step's
tokens/s and the activation/gradient bytes every rank sent to its pipeline neighbours (counted by
the transport). Reports the medians, the ratios and the final losses.

  bench/bf16_vs_fp32.py [--pp 1,2] [--steps 12] [--rounds 3]

On the CPU the kernels compute in fp32 either way (bf16 in, fp32 arithmetic, rounded out), so
bf16 costs the conversions; what it buys on the CPU is half the pipeline traffic. On a GPU the
same numerics run on bf16 tensor cores.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIGMAC = REPO / "bazel-bin" / "bigmac"


def run(cmd, env):
    result = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env)
    if result.returncode != 0:
        sys.exit(f"bf16_vs_fp32: {' '.join(map(str, cmd))} failed:\n{result.stdout[-2000:]}"
                 f"\n{result.stderr[-2000:]}")
    return result.stdout


def train(a, env, out, pp, dtype, round_index):
    run_dir = out / f"bf16_vs_fp32_pp{pp}_{dtype}_{round_index}"
    cmd = []
    if pp > 1:
        cmd += ["mpirun", "-np", str(pp), "--oversubscribe", "--bind-to", "none"]
    cmd += [BIGMAC, "train", "--config", REPO / "configs" / "tiny.yaml",
            "--set", f"data.dir={a.data}", "--set", f"precision.dtype={dtype}",
            "--set", f"parallel.pp_size={pp}", "--set", f"train.max_steps={a.steps}",
            "--set", "parallel.schedule=1f1b", "--set", f"parallel.num_microbatches={a.m}",
            "--set", f"train.gradient_accumulation_steps={a.m}",
            "--set", "train.micro_batch_size=4", "--set", "train.eval_interval=0",
            "--set", "train.eval_batches=2", "--set", f"train.output_dir={run_dir}"]
    run(cmd, env)
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    timed = steps[a.warmup:]
    return {
        "tokens_per_s": statistics.median(s["tokens_per_s"] for s in timed),
        "bytes_per_step": statistics.median(
            sum(r["activation_bytes_sent"] for r in s["ranks"]) for s in timed),
        "loss": steps[-1]["loss"],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pp", default="1,2")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--m", type=int, default=4, help="micro-batches per flush")
    ap.add_argument("--data", default=str(REPO / "data" / "fortunes"))
    ap.add_argument("--out", default=str(REPO / "bench" / "out"))
    a = ap.parse_args()
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_WAIT_POLICY="passive")
    run([REPO / "launch" / "setup.sh"], env)
    run(["bazel", "build", "//:bigmac"], env)
    if not Path(a.data).exists():
        corpus = sorted(p for p in Path("/usr/share/games/fortunes").iterdir()
                        if p.is_file() and "." not in p.name)
        run([BIGMAC, "data", "prep", "--input", *corpus, "--output", a.data], env)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    lines = ["| pp | fp32 tok/s | bf16 tok/s | bf16/fp32 | fp32 bytes/step | bf16 bytes/step | "
             "ratio | fp32 loss | bf16 loss |", "|---|---|---|---|---|---|---|---|---|"]
    for pp in map(int, a.pp.split(",")):
        results = {"fp32": [], "bf16": []}
        for round_index in range(a.rounds):  # alternating, so drift hits both
            for dtype in ("fp32", "bf16"):
                results[dtype].append(train(a, env, out, pp, dtype, round_index))
        med = {d: {k: statistics.median(r[k] for r in rs) for k in rs[0]}
               for d, rs in results.items()}
        f, b = med["fp32"], med["bf16"]
        ratio = b["bytes_per_step"] / f["bytes_per_step"] if f["bytes_per_step"] else float("nan")
        lines.append(f"| {pp} | {f['tokens_per_s']:.0f} | {b['tokens_per_s']:.0f} | "
                     f"{b['tokens_per_s'] / f['tokens_per_s']:.2f}x | {f['bytes_per_step']:.0f} | "
                     f"{b['bytes_per_step']:.0f} | {ratio:.2f} | {f['loss']:.4f} | "
                     f"{b['loss']:.4f} |")
        print(lines[-1], flush=True)
    table = "\n".join(lines)
    (out / "bf16_vs_fp32.md").write_text(
        f"bf16 vs fp32, configs/tiny.yaml, {a.steps} steps, m={a.m}, median of {a.rounds} "
        f"alternating rounds\n\n{table}\n")
    print(table)


if __name__ == "__main__":
    main()
