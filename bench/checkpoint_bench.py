#!/usr/bin/env python3
"""Checkpoint speed (issue 31), in one run, side by side:

1. Throughput: the 124M GPT-2 shape with its AdamW moments (about 1.48 GB per checkpoint) saved
   synchronously (three saves per run: the first, which also faults in the snapshot buffer, is
   reported apart) and loaded by `bigmac train`, against `dd` writing as many bytes (bs=1M,
   conv=fsync) and reading the checkpoint's own files (bs=1M) on the same disk; every read from a
   cold page cache where the machine lets us drop it, BigMac and dd reading first in turn. Medians
   and the ratios to dd.
2. The step-time cost of saving: a 20M run (L6 C512 H8, T256, micro-batch 8) saving every N steps,
   with no saves, with asynchronous saves (the default) and with synchronous ones. A step's time is
   its compute plus what the step loop spent on checkpoints (metrics.jsonl: step_ms +
   checkpoint_ms); the first step is left out (warm-up).

  bench/checkpoint_bench.py [--scratch DIR] [--rounds 3] [--cost-rounds 2] [--interval 5]
Writes bench/out/checkpoint_bench.md. Needs bazel-bin/bigmac and data/fortunes
(bench/checkpoint_throughput.sh makes both).
"""
import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIGMAC = REPO / "bazel-bin" / "bigmac"
SAVED = re.compile(r"\[ckpt\] saved step \d+ to \S+: ([0-9.]+) MB in ([0-9.]+) s")
RESUMED = re.compile(r"\[ckpt\] resumed from \S+ at step \d+: read ([0-9.]+) MB in ([0-9.]+) s")
SNAPSHOT = re.compile(r"the step waited ([0-9.]+) s for the snapshot, written in the background "
                      r"in ([0-9.]+) s")
DD = re.compile(r"(\d+) bytes .* copied, ([0-9.e+-]+) s")

GPT2_124M = {"model.num_layers": 12, "model.hidden_size": 768, "model.num_heads": 12,
             "model.vocab_size": 50257, "train.seq_length": 64, "train.micro_batch_size": 1}
GPT_20M = {"model.num_layers": 6, "model.hidden_size": 512, "model.num_heads": 8,
           "train.seq_length": 256, "train.micro_batch_size": 8}


def run(cmd):
    result = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"checkpoint_bench: {' '.join(map(str, cmd))} failed:\n{result.stdout[-3000:]}"
                 f"\n{result.stderr[-3000:]}")
    return result.stdout + result.stderr


def drop_caches():
    """True when the page cache could be dropped (root, and /proc/sys writable)."""
    subprocess.run(["sync"], check=True)
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def train(a, sets, *flags):
    cmd = [BIGMAC, "train", "--config", REPO / "configs" / "tiny.yaml", *flags]
    for key, value in {"data.dir": a.data, "train.eval_batches": 1, "train.eval_interval": 0,
                       "train.log_interval": 1000, **sets}.items():
        cmd += ["--set", f"{key}={value}"]
    return run(cmd)


def dd(*args):
    match = DD.search(run(["dd", *args]))
    return int(match.group(1)) / 1e6 / float(match.group(2))  # MB/s


def throughput_round(a, scratch, index):
    """MB/s of bigmac's saves and load and of dd's write and read, for one round. The run saves
    three times: the first save also faults in the snapshot buffer, the later ones reuse it."""
    ckpt = scratch / f"ckpt_{index}"
    shutil.rmtree(ckpt, ignore_errors=True)
    out = train(a, {**GPT2_124M, "train.max_steps": 3, "checkpoint.interval": 1,
                    "checkpoint.dir": ckpt, "checkpoint.async": "false",
                    "train.output_dir": scratch / "run"})
    saves = [(float(m.group(1)), float(m.group(2))) for m in SAVED.finditer(out)]
    mb = saves[0][0]
    row = {"mb": mb, "first_save": mb / saves[0][1],
           "save": statistics.median(m / s for m, s in saves[1:])}
    step_dir = ckpt / "step_000003"

    def bigmac_load():
        row["cold"] = drop_caches()
        out = train(a, {**GPT2_124M, "train.max_steps": 4, "train.output_dir": scratch / "run"},
                    "--resume", step_dir)
        read_mb, seconds = map(float, RESUMED.search(out).groups())
        row["load"] = read_mb / seconds

    def dd_read():  # the checkpoint's own files, as they lie on the disk
        drop_caches()
        total, seconds = 0, 0.0
        for f in sorted(step_dir.iterdir()):
            match = DD.search(run(["dd", f"if={f}", "of=/dev/null", "bs=1M"]))
            total += int(match.group(1))
            seconds += float(match.group(2))
        row["dd_read"] = total / 1e6 / seconds

    # In turn, so that neither always reads first.
    for measure in ((bigmac_load, dd_read) if index % 2 == 0 else (dd_read, bigmac_load)):
        measure()
    shutil.rmtree(ckpt, ignore_errors=True)
    count = int(mb * 1e6 / (1 << 20)) + 1
    dd_file = scratch / "dd.bin"
    row["dd_write"] = dd("if=/dev/zero", f"of={dd_file}", "bs=1M", f"count={count}", "conv=fsync")
    dd_file.unlink()
    return row


def cost_run(a, scratch, mode, index):
    """Median per-step ms (compute + checkpointing) of a 20M run in `mode`: none, async or sync."""
    run_dir = scratch / f"cost_{mode}_{index}"
    ckpt = scratch / f"cost_ckpt_{mode}_{index}"
    shutil.rmtree(run_dir, ignore_errors=True)
    shutil.rmtree(ckpt, ignore_errors=True)
    sets = {**GPT_20M, "train.max_steps": a.cost_steps, "train.output_dir": run_dir}
    if mode != "none":
        sets.update({"checkpoint.dir": ckpt, "checkpoint.interval": a.interval,
                     "checkpoint.async": "true" if mode == "async" else "false",
                     "checkpoint.keep_last": 1})
    out = train(a, sets)
    steps = [json.loads(line) for line in open(run_dir / "metrics.jsonl")][1:]
    total = [s["step_ms"] + s.get("checkpoint_ms", 0) for s in steps]
    saving = [t for s, t in zip(steps, total) if s["step"] % a.interval == 0]
    result = {"step_ms": statistics.mean(total), "save_step_ms": statistics.mean(saving),
              "wait_ms": max(s.get("checkpoint_wait_ms", 0) for s in steps)}
    snapshots = [float(m.group(1)) for m in SNAPSHOT.finditer(out)]
    if snapshots:
        result["snapshot_s"] = statistics.median(snapshots)
    saved = [float(m.group(2)) for m in SAVED.finditer(out)]
    if saved:
        result["sync_save_s"] = statistics.median(saved)
    shutil.rmtree(ckpt, ignore_errors=True)
    return result


def paired(rows, mine, theirs):
    """The median of the per-round ratios: each round's pair ran under the same conditions."""
    return statistics.median(r[mine] / r[theirs] for r in rows)


def ratios(rows, mine, theirs):
    return ", ".join(f"{r[mine] / r[theirs]:.2f}" for r in rows)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--scratch", default="/tmp/bigmac_ckpt_bench")
    ap.add_argument("--data", default=str(REPO / "data" / "fortunes"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cost-rounds", type=int, default=2)
    ap.add_argument("--cost-steps", type=int, default=21)
    ap.add_argument("--interval", type=int, default=5)
    ap.add_argument("--skip-cost", action="store_true")
    a = ap.parse_args()
    scratch = Path(a.scratch)
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    lines = ["# Checkpoint speed (bench/checkpoint_bench.py)", ""]

    rows = [throughput_round(a, scratch, i) for i in range(a.rounds)]
    med = {k: statistics.median(r[k] for r in rows)
           for k in ("mb", "first_save", "save", "load", "dd_write", "dd_read")}
    cold = all(r["cold"] for r in rows)
    lines += [
        f"124M GPT-2 with AdamW moments: {med['mb']:.0f} MB per checkpoint; median of {a.rounds} "
        f"rounds; reads from a {'cold' if cold else 'WARM (could not drop the page cache)'} "
        "page cache.", "",
        "| | BigMac MB/s | dd MB/s | BigMac / dd (median of the rounds') | per round |",
        "|---|---|---|---|---|",
        f"| write (fsync), a run's later saves | {med['save']:.0f} | {med['dd_write']:.0f} | "
        f"**{paired(rows, 'save', 'dd_write'):.2f}** | "
        f"{ratios(rows, 'save', 'dd_write')} |",
        f"| write (fsync), a run's first save | {med['first_save']:.0f} | {med['dd_write']:.0f} | "
        f"{paired(rows, 'first_save', 'dd_write'):.2f} | "
        f"{ratios(rows, 'first_save', 'dd_write')} |",
        f"| read | {med['load']:.0f} | {med['dd_read']:.0f} | "
        f"**{paired(rows, 'load', 'dd_read'):.2f}** | "
        f"{ratios(rows, 'load', 'dd_read')} |", ""]

    if not a.skip_cost:
        results = {mode: [] for mode in ("none", "async", "sync")}
        for i in range(a.cost_rounds):
            order = ("none", "async", "sync") if i % 2 == 0 else ("sync", "async", "none")
            for mode in order:
                results[mode].append(cost_run(a, scratch, mode, i))
        step = {m: statistics.median(r["step_ms"] for r in rs) for m, rs in results.items()}
        save_step = {m: statistics.median(r["save_step_ms"] for r in rs) for m, rs in results.items()}
        lines += [
            f"20M GPT (L6 C512 H8, T256, micro-batch 8), {a.cost_steps} steps, a save every "
            f"{a.interval} steps; mean per-step time (compute + checkpointing) over steps 2 to "
            f"{a.cost_steps}, median of {a.cost_rounds} rounds.", "",
            "| saves | ms per step | vs no saves | ms of the steps that save | notes |",
            "|---|---|---|---|---|",
            f"| none | {step['none']:.0f} | 1.00 | {save_step['none']:.0f} | |",
            f"| asynchronous | {step['async']:.0f} | **{step['async'] / step['none']:.3f}** | "
            f"{save_step['async']:.0f} | snapshot "
            f"{statistics.median(r.get('snapshot_s', 0) for r in results['async']) * 1000:.0f} ms"
            f"; longest wait for a write in flight "
            f"{max(r['wait_ms'] for r in results['async']):.0f} ms |",
            f"| synchronous | {step['sync']:.0f} | {step['sync'] / step['none']:.3f} | "
            f"{save_step['sync']:.0f} | each save "
            f"{statistics.median(r.get('sync_save_s', 0) for r in results['sync']) * 1000:.0f} ms |",
            ""]
    text = "\n".join(lines)
    print(text)
    out = REPO / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / "checkpoint_bench.md").write_text(text + "\n")
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
