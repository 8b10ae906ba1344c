#!/usr/bin/env python3
"""Overlap of the data-parallel all-reduce with the backward: step time on against off.

For each layout (pp x dp), trains the same model under mpirun (one thread per rank, ranks
oversubscribed when there are more than cores) with parallel.overlap_dp_reduce=false and =true,
alternating rounds, and reports the median step time of each and their ratio. The prediction
comes from the schedule simulator (`bigmac schedule ... --allreduce-ms`): it is fed each rank's
measured forward and backward time per micro-batch and the measured serial all-reduce time (the
ReduceDp span of the overlap-off runs: nothing else runs then), split into the rank's buckets
(the tied embedding's bucket waits for the flush's end), and predicts the step's saving; the
predicted ratio is (step_off - saving) / step_off.

  bench/overlap.py [--layouts 1x2,2x2] [--rounds 3] [--steps 10] [--bucket 4MiB]
      [--mpi-path cma|tcp|copy]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mpi_paths import DESCRIPTIONS, MPI_PATHS  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
BIGMAC = REPO / "bazel-bin" / "bigmac"


def run(cmd, env):
    result = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env)
    if result.returncode != 0:
        sys.exit(f"overlap: {' '.join(map(str, cmd))} failed:\n{result.stdout[-2000:]}"
                 f"\n{result.stderr[-2000:]}")
    return result.stdout


def train(a, env, out, pp, dp, overlap, round_index):
    run_dir = out / f"overlap_pp{pp}_dp{dp}_{'on' if overlap else 'off'}_{round_index}"
    sets = {
        "parallel.pp_size": pp, "parallel.schedule": "1f1b",
        "parallel.overlap_dp_reduce": "true" if overlap else "false",
        "parallel.dp_bucket_size": a.bucket,
        "train.gradient_accumulation_steps": a.m, "parallel.num_microbatches": a.m,
        "train.micro_batch_size": a.micro_batch, "train.seq_length": a.seq,
        "model.num_layers": a.layers, "model.hidden_size": a.hidden, "model.num_heads": a.heads,
        "train.max_steps": a.steps, "train.eval_interval": 0, "train.eval_batches": 1,
        "train.log_interval": 1000, "train.trace_steps": 2, "train.output_dir": run_dir,
        "data.dir": a.data,
    }
    cmd = ["mpirun", "-np", pp * dp, "--oversubscribe", "--bind-to", "none",
           *MPI_PATHS[a.mpi_path], BIGMAC, "train", "--config", REPO / "configs" / "tiny.yaml"]
    for key, value in sets.items():
        cmd += ["--set", f"{key}={value}"]
    run(cmd, env)
    steps = [json.loads(line) for line in open(run_dir / "metrics.jsonl")][a.warmup:]
    ranks = pp * dp
    median = lambda key, r: statistics.median(s["ranks"][r][key] for s in steps)
    return {
        "step_ms": statistics.median(s["step_ms"] for s in steps),
        "forward_ms": [median("forward_ms", r) / a.m for r in range(ranks)],
        "backward_ms": [median("backward_ms", r) / a.m for r in range(ranks)],
        "allreduce_ms": [median("allreduce_ms", r) for r in range(ranks)],
        "inflight_ms": [median("dp_reduce_inflight_ms", r) for r in range(ranks)],
        "buckets": [steps[0]["ranks"][r]["dp_buckets"] for r in range(ranks)],
        "overlapped": [median("dp_buckets_overlapped", r) for r in range(ranks)],
        "bytes": [steps[0]["ranks"][r]["dp_reduce_bytes"] for r in range(ranks)],
        "tied_bytes": [steps[0]["ranks"][r]["dp_tied_bytes"] for r in range(ranks)],
        "pp_ranks": [r % pp for r in range(ranks)],
    }


def per_pp_rank(values, off, pp):
    """Mean over the dp replicas of each pp rank (world rank r has pp rank r % pp)."""
    return [statistics.mean(v for v, p in zip(values, off["pp_ranks"]) if p == rank)
            for rank in range(pp)]


def predict(a, env, out, pp, off):
    """The simulator's saving for the measured stage and all-reduce times of an off run."""
    forward = per_pp_rank(off["forward_ms"], off, pp)
    backward = per_pp_rank(off["backward_ms"], off, pp)
    allreduce = per_pp_rank(off["allreduce_ms"], off, pp)
    # The tied embedding's bucket only starts after the flush: its share of the bytes.
    tail = [ar * t / max(b, 1) for ar, t, b in
            zip(allreduce, per_pp_rank(off["tied_bytes"], off, pp),
                per_pp_rank(off["bytes"], off, pp))]
    tied_buckets = [1 if t else 0 for t in per_pp_rank(off["tied_bytes"], off, pp)]
    buckets = max(1, round(statistics.median(
        b - t for b, t in zip(per_pp_rank(off["buckets"], off, pp), tied_buckets))))
    sim = run([BIGMAC, "schedule", "--kind", "1f1b", "--pp", pp, "--microbatches", a.m,
               "--trace", out / f"overlap_pp{pp}_simulated.json", "--overwrite",
               "--forward-ms", ",".join(f"{x:.4f}" for x in forward),
               "--backward-ms", ",".join(f"{x:.4f}" for x in backward),
               "--allreduce-ms", ",".join(f"{x:.4f}" for x in allreduce),
               "--allreduce-tail-ms", ",".join(f"{x:.4f}" for x in tail),
               "--dp-buckets", buckets], env)
    m = re.search(r"dp all-reduce step: serial ([0-9.]+), overlapped ([0-9.]+), saved ([0-9.]+)",
                  sim)
    return {"serial": float(m.group(1)), "overlapped": float(m.group(2)),
            "saved_ms": float(m.group(3)), "buckets": buckets, "allreduce_ms": allreduce,
            "tail_ms": tail}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layouts", default="1x2,2x2", help="pp x dp, comma-separated")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--m", type=int, default=2, help="micro-batches per flush (one flush a step)")
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--bucket", default="4MiB")
    ap.add_argument("--data", default=str(REPO / "data" / "fortunes"))
    ap.add_argument("--mpi-path", default="cma", choices=list(MPI_PATHS),
                    help="how Open MPI moves the messages (bench/mpi_paths.py)")
    ap.add_argument("--no-cma", action="store_true", help="the same as --mpi-path copy")
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--out", default=str(REPO / "bench" / "out"))
    a = ap.parse_args()
    if a.no_cma:
        a.mpi_path = "copy"
    if not a.no_build:
        run([REPO / "launch" / "setup.sh"], dict(os.environ))
        run(["bazel", "build", "//:bigmac"], dict(os.environ))
    if not Path(a.data).exists():
        corpus = sorted(p for p in Path("/usr/share/games/fortunes").iterdir()
                        if p.is_file() and "." not in p.name)
        run([BIGMAC, "data", "prep", "--input", *corpus, "--output", a.data], dict(os.environ))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cores = os.cpu_count() or 1
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_WAIT_POLICY="passive", OMP_NUM_THREADS="1")
    rows = []
    for layout in a.layouts.split(","):
        pp, dp = map(int, layout.split("x"))
        runs = {False: [], True: []}
        for r in range(a.rounds):
            # Alternating, and the order flipped every round, so a neighbour's burst hits both.
            for overlap in ((False, True) if r % 2 == 0 else (True, False)):
                runs[overlap].append(train(a, env, out, pp, dp, overlap, r))
                print(f"pp={pp} dp={dp} overlap={'on' if overlap else 'off'} round {r + 1}: "
                      f"{runs[overlap][-1]['step_ms']:.1f} ms/step", flush=True)
        off = statistics.median(x["step_ms"] for x in runs[False])
        on = statistics.median(x["step_ms"] for x in runs[True])
        ratios = [b["step_ms"] / a_["step_ms"] for a_, b in zip(runs[False], runs[True])]
        # The prediction from the median off run's measurements.
        reference = sorted(runs[False], key=lambda x: x["step_ms"])[len(runs[False]) // 2]
        prediction = predict(a, env, out, pp, reference)
        rows.append({"pp": pp, "dp": dp, "off_ms": off, "on_ms": on,
                     "ratio": statistics.median(ratios),
                     "round_ratios": ratios, "predicted_ratio":
                     (reference["step_ms"] - prediction["saved_ms"]) / reference["step_ms"],
                     "prediction": prediction, "off": runs[False], "on": runs[True]})
        print(f"pp={pp} dp={dp}: on/off {statistics.median(ratios):.3f} (rounds {', '.join(f'{x:.3f}' for x in ratios)}), "
              f"predicted {rows[-1]['predicted_ratio']:.3f}", flush=True)
    write_report(a, out, rows, cores)


def write_report(a, out, rows, cores):
    lines = [f"Overlap of the dp all-reduce, 1f1b, L{a.layers} C{a.hidden} T{a.seq}, micro-batch "
             f"{a.micro_batch}, m={a.m}, buckets of {a.bucket}, one thread per rank, {cores} cores, "
             f"{DESCRIPTIONS[a.mpi_path]}, "
             f"{a.rounds} alternating rounds of {a.steps} steps (median of steps after "
             f"{a.warmup}).", "",
             "Measured on/off: the median over rounds of each round's step-time ratio (the "
             "rounds in brackets). Predicted: the schedule simulator with the all-reduce running "
             "beside the computation (bigmac schedule --allreduce-ms). Backward: ms per step in "
             "backward spans, mean over ranks.", "",
             "| pp x dp | ranks per core | step ms off | step ms on | on/off measured (per round) | "
             "predicted on/off | serial all-reduce ms per pp rank (tail) | buckets | started in the backward (on) | exposed all-reduce ms on | backward ms off -> on |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    # Per step: the backward spans, mean over ranks (m micro-batches), median over the runs.
    backward = lambda runs: statistics.median(statistics.mean(x["backward_ms"]) * a.m
                                              for x in runs)
    for r in rows:
        p = r["prediction"]
        on_exposed = statistics.median(statistics.mean(x["allreduce_ms"]) for x in r["on"])
        overlapped = statistics.median(statistics.mean(x["overlapped"]) for x in r["on"])
        lines.append(
            f"| {r['pp']} x {r['dp']} | {r['pp'] * r['dp'] / cores:.1f} | {r['off_ms']:.1f} | "
            f"{r['on_ms']:.1f} | **{r['ratio']:.3f}** ({', '.join(f'{x:.3f}' for x in r['round_ratios'])}) | "
            f"**{r['predicted_ratio']:.3f}** | "
            f"{', '.join(f'{x:.1f} ({t:.1f})' for x, t in zip(p['allreduce_ms'], p['tail_ms']))} | "
            f"{r['off'][0]['buckets'][0]} | {overlapped:.1f} | {on_exposed:.1f} | "
            f"{backward(r['off']):.1f} -> {backward(r['on']):.1f} |")
    report = "\n".join(lines)
    print(report)
    suffix = {"cma": "", "copy": "_nocma", "tcp": "_tcp"}[a.mpi_path]
    (out / f"overlap{suffix}.md").write_text(report + "\n")
    (out / f"overlap{suffix}.json").write_text(json.dumps(rows, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
