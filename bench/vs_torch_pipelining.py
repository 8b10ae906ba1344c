#!/usr/bin/env python3
"""BigMac's mpirun pipeline against torch.distributed.pipelining on the same GPT, same stages.

One GPT (default L8 C512 H8 T256, micro-batch 4, 8 micro-batches per step), one set of initial
weights and batches (as bench/vs_pytorch.py makes them), one thread per rank, for each pp and
schedule: `mpirun -np pp bigmac train` against bench/torch_pipelining_gpt.py on pp gloo ranks
(loopback), the same schedule on both (gpipe, 1f1b, interleaved_1f1b with 2 chunks per rank).
Rounds alternate the order. The report gives median tokens/s, the ratio, GFLOP/s against the
sgemm peak measured in the same run (one thread per rank: peak = pp threads' sgemm), and the
largest step-wise relative loss difference.

  bench/vs_torch_pipelining.py [--pp 2,4] [--schedules 1f1b,gpipe,interleaved_1f1b]
      [--mpi-paths cma,tcp,copy] [--layers 8 --hidden 512 --heads 8 --seq 256 --micro-batch 4
      --m 8] [--steps 4] [--rounds 2] [--out bench/out]

--mpi-paths picks how Open MPI moves BigMac's messages (one BigMac row each; gloo is measured once):
  cma   shared memory with single-copy (the default on one host)
  tcp   `--mca btl self,tcp`, as between hosts
  copy  shared memory without single-copy (`--mca btl_vader_single_copy_mechanism none`, as in
        containers without ptrace rights)
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vs_pytorch  # noqa: E402  (the shared preparation and constants)
from mpi_paths import MPI_PATHS  # noqa: E402
from vs_pytorch import LOSS_TOLERANCE, REPO, SGEMM, TORCH_PYTHON, run  # noqa: E402

WORKER = REPO / "bench" / "torch_pipelining_gpt.py"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torch_pipeline(a, pp, schedule, weights, batches, env):
    virtual = 2 if schedule.startswith("interleaved") else 1
    port = free_port()
    cmd = [TORCH_PYTHON, WORKER, "--weights", weights, "--batches", batches, "--layers",
           str(a.layers), "--hidden", str(a.hidden), "--heads", str(a.heads), "--schedule",
           schedule, "--virtual", str(virtual), "--threads", "1",
           *vs_pytorch.torch_optim_args(a.steps)]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=dict(env, RANK=str(r), WORLD_SIZE=str(pp), LOCAL_RANK=str(r),
                                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)))
             for r in range(pp)]
    outputs = [p.communicate() for p in procs]
    for p, (out, err) in zip(procs, outputs):
        if p.returncode != 0:
            sys.exit(f"vs_torch_pipelining: torch rank failed ({p.returncode}):\n{err[-3000:]}")
    report = json.loads(outputs[-1][0].strip().splitlines()[-1])
    return report["step_ms"], report["losses"]


def bigmac_pipeline(a, pp, schedule, set_args, ckpt, work, env, path):
    virtual = 2 if schedule.startswith("interleaved") else 1
    run_dir = work / f"bigmac_pp{pp}_{schedule}_{path}"
    run(["mpirun", "-np", str(pp), "--oversubscribe", "--bind-to", "none", *MPI_PATHS[path],
         vs_pytorch.BIGMAC,
         "train", "--config", REPO / "configs" / "tiny.yaml", *set_args,
         "--set", f"parallel.pp_size={pp}", "--set", f"parallel.schedule={schedule}",
         "--set", f"parallel.virtual_stages={virtual}",
         "--set", f"train.output_dir={run_dir}", "--resume", ckpt / "step_000000"], env)
    metrics = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    return [m["step_ms"] for m in metrics], [m["loss"] for m in metrics]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pp", default="2,4")
    ap.add_argument("--schedules", default="1f1b,gpipe,interleaved_1f1b")
    ap.add_argument("--mpi-paths", default="cma", help="comma list of: " + ",".join(MPI_PATHS))
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--m", type=int, default=8, help="micro-batches per step (one flush)")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=1, help="steps left out of the timings")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=str(REPO / "bench" / "out"))
    ap.add_argument("--no-build", action="store_true", help="use the bazel-bin binaries as built")
    ap.add_argument("--bigmac", default=None, help="the bigmac binary")
    a = ap.parse_args()
    paths = a.mpi_paths.split(",")
    if any(path not in MPI_PATHS for path in paths):
        ap.error(f"--mpi-paths {a.mpi_paths}: each must be one of " + ", ".join(MPI_PATHS))
    run([REPO / "launch" / "setup.sh", "--bench"])
    if not a.no_build:
        run(["bazel", "build", "//:bigmac", "//bench:sgemm_peak"], dict(os.environ))
    if a.bigmac:
        vs_pytorch.BIGMAC = Path(a.bigmac)
    out = Path(a.out)
    work = out / f"pipelining_L{a.layers}_C{a.hidden}"
    work.mkdir(parents=True, exist_ok=True)
    # One thread per rank on both sides; ranks of a shared machine wait politely.
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_WAIT_POLICY="passive")
    data = vs_pytorch.fortunes_data()
    sets = vs_pytorch.model_sets("gpt", a.layers, a.hidden, a.heads, a.seq, a.micro_batch, a.m,
                                 a.steps, data, work / "bigmac_prepare")
    sets.append(f"parallel.num_microbatches={a.m}")
    set_args = [arg for s in sets for arg in ("--set", s)]
    weights, ckpt, batches = vs_pytorch.prepare(work, "gpt", a.layers, a.hidden, a.heads, a.seq,
                                                a.steps, set_args, env)
    peak_line = run([SGEMM, "1", "2048"], env).strip()
    single_peak = float(peak_line.split()[1])
    print(f"vs_torch_pipelining: one-thread {peak_line}", flush=True)
    flops_per_token = vs_pytorch.train_flops_per_token("gpt", a.layers, a.hidden, a.heads, 256,
                                                       a.seq)
    tokens_per_step = a.micro_batch * a.seq * a.m
    rows = []
    for pp in map(int, a.pp.split(",")):
        for schedule in a.schedules.split(","):
            trainers = [f"bigmac:{path}" for path in paths] + ["torch"]
            results = {t: [] for t in trainers}
            losses = {}
            for round_index in range(a.rounds):
                order = trainers if round_index % 2 == 0 else trainers[::-1]
                for trainer in order:
                    if trainer.startswith("bigmac"):
                        step_ms, run_losses = bigmac_pipeline(a, pp, schedule, set_args, ckpt,
                                                              work, env, trainer.split(":")[1])
                    else:
                        step_ms, run_losses = torch_pipeline(a, pp, schedule, weights, batches,
                                                             env)
                    timed = step_ms[a.warmup:]
                    results[trainer].append(tokens_per_step * len(timed) / (sum(timed) / 1000))
                    losses.setdefault(trainer, run_losses)
                    print(f"vs_torch_pipelining: pp={pp} {schedule} round {round_index + 1} "
                          f"{trainer}: {results[trainer][-1]:.0f} tok/s", flush=True)
            pt = statistics.median(results["torch"])
            for path in paths:
                name = f"bigmac:{path}"
                bm = statistics.median(results[name])
                agree = max(abs(b - p) / abs(p) for b, p in zip(losses[name], losses["torch"]))
                rows.append({"pp": pp, "schedule": schedule, "mpi_path": path,
                             "bigmac_tok_s": bm, "torch_tok_s": pt, "ratio": bm / pt,
                             "bigmac_gflops": bm * flops_per_token / 1e9,
                             "torch_gflops": pt * flops_per_token / 1e9,
                             "max_rel_loss_diff": agree,
                             "last_loss": [losses[name][-1], losses["torch"][-1]],
                             "rounds": {"bigmac": results[name], "torch": results["torch"]}})
    end_line = run([SGEMM, "1", "2048"], env).strip()
    if float(end_line.split()[1]) > single_peak:
        peak_line, single_peak = end_line, float(end_line.split()[1])
    cores = os.cpu_count() or 1
    version = run([TORCH_PYTHON, "-c", "import torch; print(torch.__version__)"]).strip()
    lines = [
        f"BigMac (mpirun) vs torch.distributed.pipelining {version} (gloo), GPT L{a.layers} "
        f"C{a.hidden} H{a.heads} T{a.seq}, micro-batch {a.micro_batch}, {a.m} micro-batches per "
        f"step, one thread per rank, {cores} cores, {a.rounds} alternating rounds, median "
        f"tokens/s over steps {a.warmup + 1}-{a.steps}. Peak = min(pp, cores) x the one-thread "
        f"sgemm ({single_peak:.1f} GFLOP/s, {peak_line.split('(')[1][:-1]}). Losses agree when "
        f"every step's relative difference is below {LOSS_TOLERANCE:g}.",
        "",
        "| pp | schedule | Open MPI path | BigMac tok/s | torch.distributed.pipelining tok/s | ratio | BigMac GFLOP/s (% peak) | torch GFLOP/s (% peak) | max rel. loss diff | losses agree |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        peak = single_peak * min(r["pp"], cores)
        lines.append(
            f"| {r['pp']} | {r['schedule']} | {r['mpi_path']} | {r['bigmac_tok_s']:.0f} | {r['torch_tok_s']:.0f} | "
            f"**{r['ratio']:.2f}x** | {r['bigmac_gflops']:.1f} ({100 * r['bigmac_gflops'] / peak:.0f}%) | "
            f"{r['torch_gflops']:.1f} ({100 * r['torch_gflops'] / peak:.0f}%) | "
            f"{r['max_rel_loss_diff']:.1e} | "
            f"{'yes' if r['max_rel_loss_diff'] < LOSS_TOLERANCE else 'NO'} |")
    report = "\n".join(lines)
    print(report)
    (out / "vs_torch_pipelining.md").write_text(report + "\n")
    (out / "vs_torch_pipelining.json").write_text(json.dumps(rows, indent=1) + "\n")
    if any(r["max_rel_loss_diff"] >= LOSS_TOLERANCE for r in rows):
        sys.exit("vs_torch_pipelining: the losses of BigMac and PyTorch disagree (see the table)")


if __name__ == "__main__":
    main()
