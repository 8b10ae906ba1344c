#!/usr/bin/env python3
"""Two BigMac builds (or one build under two environments) trained at the same time, side by side.

On a shared host one run's step time moves by 5-10% from one half hour to the next, so a lever
worth 1-2% cannot be seen in runs made one after the other. Here A and B train the same model at
the same moment, each pinned to its own cores (`taskset`), so both see the same neighbours; the
next round swaps the cores. Each round gives B's median step time over A's; the report gives every
round's ratio and their mean and spread. The model defaults to the pipeline bench's GPT on one
thread (L8 C512 H8 T256, micro-batch 4; 2 micro-batches per step instead of its 8, so that a
round takes a minute), whose ranks each run on one core.

  bench/paired_ab.py --b /tmp/bigmac_new [--a bazel-bin/bigmac] [--a-env K=V] [--b-env K=V]
      [--threads 1] [--rounds 4] [--steps 10] [--warmup 2] [--set key=value ...]

Needs 2 x --threads CPUs (the first and second --threads of those this process may use; where
those are two hyperthreads of one core, A and B share its units, which this script does not
check). Both runs share the L3 and the memory bandwidth, as two pipeline ranks on one host do, so
a lever that only pays while the other cores idle is not measured here.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vs_pytorch import BIGMAC, REPO, fortunes_data  # noqa: E402

MODEL = ["model.num_layers=8", "model.hidden_size=512", "model.num_heads=8",
         "model.vocab_size=256", "train.seq_length=256", "train.micro_batch_size=4",
         "train.gradient_accumulation_steps=2"]


def pairs(values):
    """KEY=VALUE strings as a dict; exits on one without '='."""
    env = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            sys.exit(f"paired_ab: '{item}' is not KEY=VALUE")
        env[key] = value
    return env


def start(binary, cores, env, sets, out_dir):
    """One training run pinned to `cores`; its output goes to out_dir (and out_dir.log)."""
    cmd = ["taskset", "-c", ",".join(map(str, cores)), binary, "train", "--config",
           REPO / "configs" / "tiny.yaml"]
    for s in sets + [f"train.output_dir={out_dir}"]:
        cmd += ["--set", s]
    with open(f"{out_dir}.log", "w") as log:  # a file, not a pipe: a full pipe would stall it
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)


def median_step_ms(out_dir, warmup):
    steps = [json.loads(line)["step_ms"] for line in open(Path(out_dir) / "metrics.jsonl")
             if '"step_ms"' in line][warmup:]
    if not steps:
        sys.exit(f"paired_ab: no steps after the first {warmup} in {out_dir}/metrics.jsonl")
    return statistics.median(steps)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", default=str(BIGMAC), help="build A (default bazel-bin/bigmac)")
    ap.add_argument("--b", default=None, help="build B (default: A's)")
    ap.add_argument("--a-env", action="append", default=[], help="KEY=VALUE for A only")
    ap.add_argument("--b-env", action="append", default=[], help="KEY=VALUE for B only")
    ap.add_argument("--threads", type=int, default=1, help="OpenMP threads (and cores) per run")
    ap.add_argument("--rounds", type=int, default=4, help="rounds; the cores swap every round")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2, help="steps left out of the medians")
    ap.add_argument("--set", action="append", default=[], help="more config overrides")
    a = ap.parse_args()
    b_binary = a.b or a.a
    a_env, b_env = pairs(a.a_env), pairs(a.b_env)
    if a.threads < 1:
        sys.exit(f"paired_ab: --threads {a.threads}: at least 1")
    if a.rounds < 2 or a.rounds % 2:
        sys.exit(f"paired_ab: --rounds {a.rounds}: an even number, at least 2 (each build runs "
                 "as often on each half of the CPUs)")
    if a.b is None and not a_env and not b_env:
        sys.exit("paired_ab: A and B are the same build under the same environment: give --b, "
                 "--a-env or --b-env")
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2 * a.threads:
        sys.exit(f"paired_ab: {2 * a.threads} cores needed for two runs of {a.threads} "
                 f"thread(s), this process may use {len(cores)}")
    if a.warmup >= a.steps:
        sys.exit(f"paired_ab: --warmup {a.warmup} leaves none of --steps {a.steps}")
    for binary in (a.a, b_binary):
        if not Path(binary).is_file():
            sys.exit(f"paired_ab: no bigmac at {binary} (bazel build //:bigmac)")
    sets = MODEL + [f"data.dir={fortunes_data()}", f"train.max_steps={a.steps}",
                    "train.eval_interval=0", "train.eval_batches=1",
                    "train.log_interval=1000", "train.trace_steps=0"] + a.set
    base = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    halves = [cores[:a.threads], cores[a.threads:2 * a.threads]]
    ratios = []
    with tempfile.TemporaryDirectory(prefix="paired_ab.") as work:
        for r in range(a.rounds):
            a_cores, b_cores = halves if r % 2 == 0 else halves[::-1]
            runs = {"A": (a.a, a_cores, dict(base, **a_env)),
                    "B": (b_binary, b_cores, dict(base, **b_env))}
            procs = {name: start(binary, c, env, sets, f"{work}/{name}{r}")
                     for name, (binary, c, env) in runs.items()}
            for proc in procs.values():
                proc.wait()
            medians = {}
            for name, proc in procs.items():
                if proc.returncode != 0:
                    with open(f"{work}/{name}{r}.log") as log:
                        sys.exit(f"paired_ab: run {name} failed ({proc.returncode}):\n"
                                 f"{log.read()[-3000:]}")
                medians[name] = median_step_ms(f"{work}/{name}{r}", a.warmup)
            ratios.append(medians["B"] / medians["A"])
            print(f"round {r + 1}: A {medians['A']:.1f} ms on cores {a_cores}, B "
                  f"{medians['B']:.1f} ms on cores {b_cores}: B/A {ratios[-1]:.4f}", flush=True)
    mean = statistics.mean(ratios)
    print(f"B/A step time: mean {mean:.4f} ({100 * (mean - 1):+.1f}%), rounds "
          f"{min(ratios):.4f} .. {max(ratios):.4f}")


if __name__ == "__main__":
    main()
