#!/usr/bin/env python3
"""BigMac against PyTorch 2.x on the same GPT or llama, same CPU, side by side (bench/README.md).

For each model: one set of initial weights (written as Hugging Face GPT-2 safetensors, imported
into BigMac with `bigmac ckpt import`), one set of batches (`bigmac data batches`), the same
optimizer settings and thread count. PyTorch (from PyPI, in the venv `launch/setup.sh --bench`
makes) runs at its best: `F.scaled_dot_product_attention(is_causal=True)` and
`AdamW(fused=True)` ("sdpa"), the same under `torch.compile` ("compile"), and optionally the
hand-written attention of older PyTorch code ("explicit"). BigMac and each PyTorch variant
(once per GEMM library in --gemms, BIGMAC_CPU_GEMM) alternate for --rounds rounds; the report gives the median tokens/s of each (steps after
--warmup), the ratio against the fastest PyTorch variant, the achieved GFLOP/s against an sgemm
peak measured in the same run, and how far the losses agree step by step.

  bench/vs_pytorch.py [--models tiny,20m,llama_tiny,llama_20m] [--variants sdpa,compile] [--rounds 3]
                      [--threads 2]
                      [--gemms bigmac,openblas] [--out bench/out]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIGMAC = REPO / "bazel-bin" / "bigmac"
SGEMM = REPO / "bazel-bin" / "bench" / "sgemm_peak"
PYTORCH = REPO / "bench" / "pytorch_gpt.py"
# PyTorch 2.x from PyPI lives in the venv launch/setup.sh --bench makes (BIGMAC_BENCH_VENV).
VENV = Path(os.environ.get("BIGMAC_BENCH_VENV", Path.home() / ".cache" / "bigmac" / "bench-venv"))
TORCH_PYTHON = os.environ.get("BIGMAC_TORCH_PYTHON", str(VENV / "bin" / "python"))
VARIANTS = {"sdpa": [], "compile": ["--compile"], "explicit": ["--attention", "explicit"]}

# name: (layers, hidden, heads, seq, micro_batch, accum, steps)
MODELS = {
    "tiny": (4, 128, 4, 128, 16, 1, 30),   # configs/tiny.yaml: 0.84M parameters
    "20m": (6, 512, 8, 256, 8, 1, 8),      # 19.3M parameters
    "llama_tiny": (4, 128, 4, 128, 16, 1, 30),  # configs/llama_tiny.yaml: 0.85M parameters
    "llama_20m": (6, 512, 8, 256, 8, 1, 8),     # 18.4M parameters
}
# The llama models' (key/value heads, SwiGLU width); PyTorch runs them with SDPA's enable_gqa.
LLAMA = {"llama_tiny": (2, 384), "llama_20m": (2, 1536)}
LOSS_TOLERANCE = 1e-3  # float32 kernels that sum in different orders drift apart slowly
OPTIM = {"lr": 2e-3, "min_lr": 2e-4, "warmup": 5, "weight_decay": 0.1, "grad_clip": 1.0}


def run(cmd, env=None):
    result = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        sys.exit(f"vs_pytorch: {' '.join(map(str, cmd))} failed ({result.returncode}):\n"
                 f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result.stdout


def block_matrix_parameters(name, hidden, heads):
    """Multiply-adds per token of a block's matmuls: GPT-2's 12 C^2, or llama's q, k, v, o, gate,
    up and down."""
    if name not in LLAMA:
        return 12 * hidden * hidden
    kv_heads, inner = LLAMA[name]
    kv = kv_heads * (hidden // heads)
    return 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * inner


def parameters(name, layers, hidden, heads, vocab, seq):
    if name in LLAMA:  # no biases, RMSNorms, untied head, no position table
        return layers * (block_matrix_parameters(name, hidden, heads) + 2 * hidden) + \
            2 * vocab * hidden + hidden
    return layers * (12 * hidden * hidden + 13 * hidden) + vocab * hidden + seq * hidden + 2 * hidden


def train_flops_per_token(name, layers, hidden, heads, vocab, seq):
    # Forward: 2 per multiply-add of every matmul (the block's and the head's) plus attention's
    # QK^T and AV over the full T x T square (what both trainers compute); training = 3 x forward.
    forward = 2 * (layers * block_matrix_parameters(name, hidden, heads) + vocab * hidden) + \
        4 * layers * seq * hidden
    return 3 * forward


def fortunes_data():
    """The demo corpus, prepared once (bigmac data prep)."""
    data = REPO / "data" / "fortunes"
    if not data.is_dir():
        texts = sorted(p for p in Path("/usr/share/games/fortunes").iterdir()
                       if p.is_file() and "." not in p.name)
        run([BIGMAC, "data", "prep", "--input", *texts, "--output", data])
    return data


def model_sets(name, layers, hidden, heads, seq, mbs, accum, steps, data, output_dir):
    """BigMac's --set overrides for the model, batches and optimizer both trainers share."""
    arch = []
    if name in LLAMA:
        arch = ["model.arch=llama", f"model.num_kv_heads={LLAMA[name][0]}",
                f"model.intermediate_size={LLAMA[name][1]}"]
    return arch + [f"model.num_layers={layers}", f"model.hidden_size={hidden}",
            f"model.num_heads={heads}", "model.vocab_size=256", f"train.seq_length={seq}",
            f"train.micro_batch_size={mbs}", f"train.gradient_accumulation_steps={accum}",
            f"train.max_steps={steps}", f"optim.lr={OPTIM['lr']}",
            f"optim.min_lr={OPTIM['min_lr']}", f"optim.warmup_steps={OPTIM['warmup']}",
            f"optim.weight_decay={OPTIM['weight_decay']}",
            f"optim.grad_clip={OPTIM['grad_clip']}", f"data.dir={data}",
            "train.eval_interval=0", "train.eval_batches=1", "train.log_interval=1000",
            "train.trace_steps=0", f"train.output_dir={output_dir}"]


def torch_model_args(name, layers, hidden, heads):
    """The model options of bench/pytorch_gpt.py."""
    args = ["--layers", str(layers), "--hidden", str(hidden), "--heads", str(heads)]
    if name in LLAMA:
        args += ["--arch", "llama", "--kv-heads", str(LLAMA[name][0]), "--inner", str(LLAMA[name][1])]
    return args


def prepare(work, name, layers, hidden, heads, seq, steps, set_args, env):
    """One set of initial weights (safetensors, imported as BigMac's step-0 checkpoint) and one
    batches file in `work`; returns (weights, checkpoint dir, batches)."""
    config = REPO / "configs" / "tiny.yaml"
    weights = work / "init.safetensors"
    run([TORCH_PYTHON, PYTORCH, "--init", weights, *torch_model_args(name, layers, hidden, heads),
         "--seq", str(seq), "--vocab", "256"], env)
    ckpt = work / "ckpt"
    subprocess.run(["rm", "-rf", ckpt])
    run([BIGMAC, "ckpt", "import", "--safetensors", weights, "--config", config, *set_args,
         "--output", ckpt], env)
    batches = work / "batches.bin"
    run([BIGMAC, "data", "batches", "--config", config, *set_args, "--steps", str(steps),
         "--output", batches, "--overwrite"], env)
    return weights, ckpt, batches


def torch_optim_args(steps):
    """The same optimizer settings for the PyTorch trainers (bench/pytorch_gpt.py options)."""
    return ["--lr", str(OPTIM["lr"]), "--min-lr", str(OPTIM["min_lr"]), "--warmup",
            str(OPTIM["warmup"]), "--max-steps", str(steps), "--weight-decay",
            str(OPTIM["weight_decay"]), "--grad-clip", str(OPTIM["grad_clip"])]


def main():
    global BIGMAC
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="tiny,20m,llama_tiny,llama_20m")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=2, help="steps left out of the timings")
    ap.add_argument("--steps", type=int, default=0, help="override the per-model step count")
    ap.add_argument("--variants", default="sdpa,compile", help=f"of {','.join(VARIANTS)}")
    ap.add_argument("--out", default=str(REPO / "bench" / "out"))
    ap.add_argument("--no-build", action="store_true", help="use the bazel-bin binaries as built")
    ap.add_argument("--bigmac", default=None, help="the bigmac binary (A/B of two builds)")
    ap.add_argument("--gemms", default="bigmac,openblas",
                    help="BigMac's float GEMM libraries to run (BIGMAC_CPU_GEMM), the default first")
    a = ap.parse_args()
    variants = a.variants.split(",")
    # BigMac once per GEMM library: "bigmac" is the first (by default its own blocked GEMM), then
    # "bigmac-openblas", "bigmac-onednn".
    gemms = a.gemms.split(",")
    bigmacs = {("bigmac" if i == 0 else f"bigmac-{g}"): g for i, g in enumerate(gemms)}
    run([REPO / "launch" / "setup.sh", "--bench"])  # PyTorch 2.x in a venv
    if not a.no_build:
        run(["bazel", "build", "//:bigmac", "//bench:sgemm_peak"], dict(os.environ))
    BIGMAC = Path(a.bigmac) if a.bigmac else BIGMAC
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads),
               OPENBLAS_NUM_THREADS=str(a.threads))
    data = fortunes_data()
    # The machine's ceiling, measured now and again at the end (neighbours on a shared machine
    # make single measurements noisy); the higher one is the peak.
    peak_line = run([SGEMM, str(a.threads), "2048"], env).strip()
    peak = float(peak_line.split()[1])
    # PyPI's PyTorch brings MKL and oneDNN; MKL_NUM_THREADS follows OMP_NUM_THREADS.
    core = peak_line.split("core ")[1].rstrip(")")
    torch_env = dict(env, MKL_NUM_THREADS=str(a.threads))
    print(f"vs_pytorch: {peak_line}")
    rows = []
    for name in a.models.split(","):
        layers, hidden, heads, seq, mbs, accum, steps = MODELS[name]
        steps = a.steps or steps
        work = out / name
        work.mkdir(parents=True, exist_ok=True)
        sets = model_sets(name, layers, hidden, heads, seq, mbs, accum, steps, data,
                          work / "bigmac_run")
        sets += ["parallel.pp_size=1", "parallel.schedule=gpipe"]
        set_args = [arg for s in sets for arg in ("--set", s)]
        config = REPO / "configs" / "tiny.yaml"
        weights, ckpt, batches = prepare(work, name, layers, hidden, heads, seq, steps, set_args,
                                         env)
        torch_cmd = [TORCH_PYTHON, PYTORCH, "--weights", weights, "--batches", batches,
                     *torch_model_args(name, layers, hidden, heads),
                     *torch_optim_args(steps), "--threads", str(a.threads)]
        bigmac_cmd = [BIGMAC, "train", "--config", config, *set_args, "--resume",
                      ckpt / "step_000000", "--dump", work / "bigmac_dump", "--overwrite"]
        tokens_per_step = mbs * seq * accum
        trainers = [*bigmacs, *variants]
        results = {trainer: [] for trainer in trainers}
        losses = {}
        for round_index in range(a.rounds):
            for trainer in trainers if round_index % 2 == 0 else trainers[::-1]:
                if trainer in bigmacs:
                    run(bigmac_cmd, dict(env, BIGMAC_CPU_GEMM=bigmacs[trainer]))
                    metrics = [json.loads(l) for l in open(work / "bigmac_run" / "metrics.jsonl")]
                    step_ms = [m["step_ms"] for m in metrics]
                    run_losses = [float(x) for x in open(work / "bigmac_dump" / "losses.txt")]
                else:
                    report = json.loads(
                        run(torch_cmd + VARIANTS[trainer], torch_env).strip().splitlines()[-1])
                    step_ms, run_losses = report["step_ms"], report["losses"]
                timed = step_ms[a.warmup:]
                results[trainer].append(tokens_per_step * len(timed) / (sum(timed) / 1000))
                losses.setdefault(trainer, run_losses)
                print(f"vs_pytorch: {name} round {round_index + 1} {trainer}: "
                      f"{results[trainer][-1]:.0f} tok/s", flush=True)
        medians = {trainer: statistics.median(results[trainer]) for trainer in trainers}
        best = max(variants, key=medians.get)
        bm, pt = medians["bigmac"], medians[best]
        agree = max(abs(b - p) / abs(p) for v in variants for bigmac in bigmacs
                    for b, p in zip(losses[bigmac], losses[v]))
        flops = train_flops_per_token(name, layers, hidden, heads, 256, seq)
        rows.append({
            "model": name, "parameters": parameters(name, layers, hidden, heads, 256, seq),
            "shape": f"L{layers} C{hidden} H{heads} T{seq} B{mbs}", "steps": steps,
            "bigmac_tok_s": bm, "pytorch_tok_s": pt, "pytorch_best": best, "ratio": bm / pt,
            "variant_tok_s": {v: medians[v] for v in variants},
            "bigmac_gemm_tok_s": {g: medians[t] for t, g in bigmacs.items()},
            "bigmac_gflops": bm * flops / 1e9, "pytorch_gflops": pt * flops / 1e9,
            "peak_gflops": peak, "max_rel_loss_diff": agree,
            "first_loss": losses["bigmac"][0], "last_loss": [losses["bigmac"][-1], losses[best][-1]],
            "rounds": results,
        })
    end_line = run([SGEMM, str(a.threads), "2048"], env).strip()
    if float(end_line.split()[1]) > peak:
        peak_line, peak = end_line, float(end_line.split()[1])
    for r in rows:
        r["peak_gflops"] = peak
    lines = [
        f"BigMac vs PyTorch {run([TORCH_PYTHON, '-c', 'import torch; print(torch.__version__)']).strip()}"
        f" (variants {', '.join(variants)}; ratio against the fastest), CPU, {a.threads} threads "
        f"each, {a.rounds} alternating rounds, median tokens/s over the steps after the first "
        f"{a.warmup}; sgemm peak {peak:.1f} GFLOP/s ({peak_line.split('(')[1][:-1]}, best of a "
        f"measurement before and after). GFLOP/s count the model's matmuls with attention over the "
        f"full T x T square. Losses agree when every step's relative difference is below "
        f"{LOSS_TOLERANCE:g}.",
        "",
        "| model | params | shape | BigMac tok/s | " + " | ".join(f"PyTorch {v} tok/s" for v in variants)
        + "".join(f" | BigMac {g} tok/s, ratio" for g in gemms[1:])
        + " | ratio to best | BigMac GFLOP/s (% peak) | PyTorch best GFLOP/s (% peak) | max rel. loss diff | losses agree | final loss BigMac / PyTorch |",
        "|---|---|---|---|" + "---|" * (len(variants) + len(gemms) - 1) + "---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['parameters'] / 1e6:.2f}M | {r['shape']} | {r['bigmac_tok_s']:.0f} | "
            + " | ".join(f"{r['variant_tok_s'][v]:.0f}" for v in variants)
            + "".join(f" | {r['bigmac_gemm_tok_s'][g]:.0f}, "
                      f"**{r['bigmac_gemm_tok_s'][g] / r['pytorch_tok_s']:.2f}x**" for g in gemms[1:]) +
            f" | **{r['ratio']:.2f}x** ({r['pytorch_best']}) | {r['bigmac_gflops']:.1f} "
            f"({100 * r['bigmac_gflops'] / peak:.0f}%) | {r['pytorch_gflops']:.1f} "
            f"({100 * r['pytorch_gflops'] / peak:.0f}%) | {r['max_rel_loss_diff']:.1e} | "
            f"{'yes' if r['max_rel_loss_diff'] < LOSS_TOLERANCE else 'NO'} | "
            f"{r['last_loss'][0]:.4f} / {r['last_loss'][1]:.4f} |")
    report = "\n".join(lines)
    print(report)
    (out / "vs_pytorch.md").write_text(report + "\n")
    (out / "vs_pytorch.json").write_text(json.dumps(rows, indent=1) + "\n")
    if any(r["max_rel_loss_diff"] >= LOSS_TOLERANCE for r in rows):
        sys.exit("vs_pytorch: the losses of BigMac and PyTorch disagree (see the table)")


if __name__ == "__main__":
    main()
