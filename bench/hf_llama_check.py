#!/usr/bin/env python3
"""Hugging Face's own LlamaForCausalLM on a BigMac llama checkpoint: the same validation loss.

Trains configs/llama_tiny.yaml for a few steps (untied head, then tied), exports the checkpoint
(`bigmac ckpt export --safetensors`: weights under LlamaForCausalLM's names plus config.json),
loads it with transformers' `LlamaForCausalLM.from_pretrained`, and computes the validation loss
on the batches BigMac's `[val]` line averaged (TokenDataset::EvalBatch: window w of the val shard
is tokens [w(T+1), w(T+1)+T), targets one further). The two must agree to 1e-4 relative. Then
`bigmac ckpt import` reads the export back and a second export must hold the same tensors.
Exit 1 on any disagreement. PyTorch and transformers come from the venv `launch/setup.sh --bench`
makes. Writes bench/out/hf_llama_check.md.
"""
import argparse
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIGMAC = REPO / "bazel-bin" / "bigmac"
VENV = Path(os.environ.get("BIGMAC_BENCH_VENV", Path.home() / ".cache/bigmac/bench-venv"))
TORCH_PYTHON = os.environ.get("BIGMAC_TORCH_PYTHON", str(VENV / "bin" / "python"))


def run(cmd):
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"failed ({result.returncode}): {' '.join(map(str, cmd))}\n{result.stdout}{result.stderr}")
    return result.stdout


def read_bigmac_shard(path):
    """Tokens of a BMTK shard (docs/data.md): 32-byte header, then little-endian tokens."""
    data = Path(path).read_bytes()
    magic, _version, _vocab, width, count = struct.unpack_from("<4sIIIQ", data, 0)
    if magic != b"BMTK":
        sys.exit(f"{path}: not a BigMac shard")
    code = {2: "H", 4: "I"}[width]
    return list(struct.unpack_from(f"<{count}{code}", data, 32))


def hf_val_loss(export_dir, val_tokens, batches, batch, seq):
    """Runs in the venv's Python: LlamaForCausalLM's mean loss over the val batches."""
    program = r"""
import json, sys, torch
from transformers import LlamaForCausalLM
export_dir, batches, batch, seq = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
tokens = json.load(sys.stdin)
model = LlamaForCausalLM.from_pretrained(export_dir, torch_dtype=torch.float32,
                                         attn_implementation="eager").eval()
windows = len(tokens) // (seq + 1)
losses = []
with torch.no_grad():
    for i in range(batches):
        rows = [(i * batch + r) % windows for r in range(batch)]
        x = torch.tensor([tokens[w * (seq + 1): w * (seq + 1) + seq] for w in rows])
        y = torch.tensor([tokens[w * (seq + 1) + 1: w * (seq + 1) + seq + 1] for w in rows])
        logits = model(input_ids=x).logits.double()
        losses.append(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                        y.reshape(-1)).item())
print(json.dumps({"loss": sum(losses) / len(losses), "tied": model.config.tie_word_embeddings,
                  "transformers": __import__("transformers").__version__}))
"""
    result = subprocess.run([TORCH_PYTHON, "-c", program, str(export_dir), str(batches), str(batch),
                             str(seq)], input=json.dumps(val_tokens), capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit("transformers failed:\n" + result.stderr[-4000:])
    return json.loads(result.stdout.strip().splitlines()[-1])


def same_tensors(a, b):
    program = r"""
import sys
from safetensors.numpy import load_file
a, b = load_file(sys.argv[1]), load_file(sys.argv[2])
bad = [k for k in a if k not in b or a[k].shape != b[k].shape or (a[k] != b[k]).any()]
print(len(a), len(bad) + len(set(b) - set(a)))
"""
    out = subprocess.run([TORCH_PYTHON, "-c", program, str(a), str(b)], capture_output=True,
                         text=True, check=True).stdout.split()
    return int(out[0]), int(out[1]) == 0


def check(name, extra, args, work):
    ckpt = work / f"ckpt_{name}"
    log = run([BIGMAC, "train", "--config", "configs/llama_tiny.yaml",
               "--set", f"train.max_steps={args.steps}", "--set", f"train.eval_interval={args.steps}",
               "--set", f"train.eval_batches={args.eval_batches}",
               "--set", f"checkpoint.dir={ckpt}", "--set", f"checkpoint.interval={args.steps}",
               "--set", f"train.output_dir={work / ('runs_' + name)}"] + extra)
    val = re.findall(r"\[val\] step %d \| val_loss ([0-9.]+) \| \d+ batches of (\d+)x(\d+)" % args.steps, log)
    if not val:
        sys.exit("no [val] line at the last step:\n" + log[-2000:])
    batch, seq = int(val[-1][1]), int(val[-1][2])
    # The full-precision value from metrics.jsonl (the [val] line rounds to 4 decimals).
    metrics = [json.loads(line) for line in (work / ("runs_" + name) / "metrics.jsonl").open()]
    bigmac_loss = [m["val_loss"] for m in metrics if "val_loss" in m][-1]
    export = work / f"hf_{name}"
    export.mkdir()
    run([BIGMAC, "ckpt", "export", ckpt, "--safetensors", export / "model.safetensors"])
    config = json.loads((export / "config.json").read_text())
    val_tokens = read_bigmac_shard(REPO / "data/fortunes/val_000.bin")
    hf = hf_val_loss(export, val_tokens, args.eval_batches, batch, seq)
    # Round trip: import the export, export it again, same tensors.
    run([BIGMAC, "ckpt", "import", "--safetensors", export / "model.safetensors",
         "--config", "configs/llama_tiny.yaml",
         "--output", work / f"imported_{name}"] + extra)
    again = work / f"hf_{name}_again"
    again.mkdir()
    run([BIGMAC, "ckpt", "export", work / f"imported_{name}",
         "--safetensors", again / "model.safetensors"])
    count, identical = same_tensors(export / "model.safetensors", again / "model.safetensors")
    relative = abs(hf["loss"] - bigmac_loss) / abs(bigmac_loss)
    ok = relative <= 1e-4 and identical and hf["tied"] == (name == "tied")
    return {"name": name, "bigmac": bigmac_loss, "hf": hf["loss"], "relative": relative,
            "tensors": count, "round_trip": identical, "kv_heads": config["num_key_value_heads"],
            "heads": config["num_attention_heads"], "tied": hf["tied"], "ok": ok,
            "transformers": hf["transformers"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--eval-batches", type=int, default=4)
    parser.add_argument("--no-build", action="store_true")
    args = parser.parse_args()
    if not args.no_build:
        subprocess.run(["launch/setup.sh", "--bench"], cwd=REPO, check=True)
        subprocess.run(["bazel", "build", "//:bigmac"], cwd=REPO, check=True)
    if not (REPO / "data/fortunes/val_000.bin").exists():
        sys.exit("data/fortunes is missing: run launch/demo.sh (or bigmac data prep) first")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        rows = [check("untied", [], args, work),
                check("tied", ["--set", "model.tie_embeddings=true"], args, work)]
    lines = ["# transformers' LlamaForCausalLM on BigMac llama checkpoints", "",
             f"configs/llama_tiny.yaml, {args.steps} steps, validation over {args.eval_batches} batches; "
             f"transformers {rows[0]['transformers']}.", "",
             "| head | heads / kv heads | BigMac val_loss | LlamaForCausalLM | relative | tensors | import/export round trip | agree |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['name']} | {r['heads']} / {r['kv_heads']} | {r['bigmac']:.6f} | {r['hf']:.6f} | "
                     f"{r['relative']:.2e} | {r['tensors']} | {'identical' if r['round_trip'] else 'DIFFERENT'} | "
                     f"{'yes' if r['ok'] else 'NO'} |")
    text = "\n".join(lines) + "\n"
    print(text)
    out = REPO / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / "hf_llama_check.md").write_text(text)
    sys.exit(0 if all(r["ok"] for r in rows) else 1)


if __name__ == "__main__":
    main()
