#!/usr/bin/env python3
"""The reference trainer of bench/vs_pytorch.py: BigMac's GPT-2 and llama models and optimizer in
PyTorch.

GPT-2: same architecture (pre-LayerNorm blocks, causal attention, tanh GELU, learned positions,
output head tied to the token embedding). Llama (--arch llama): RMSNorm, rotary positions (Hugging
Face's half rotation), grouped-query attention through F.scaled_dot_product_attention(is_causal,
enable_gqa), SwiGLU, untied head, weights under LlamaForCausalLM's names. Same AdamW (decoupled decay on matrices and embeddings, bias
correction), warm-up + cosine schedule and global-norm clipping, same initial weights (a
safetensors file with Hugging Face GPT-2 names, the one `bigmac ckpt import` reads) and the same
batches (`bigmac data batches`). Prints one JSON line: per-step losses and milliseconds.

  pytorch_gpt.py --weights W.safetensors --batches B.bin --layers L --hidden C --heads H
                 --vocab V --lr ... --min-lr ... --warmup ... --max-steps ... --threads 2
                 [--attention sdpa|explicit] [--no-fused] [--compile] [--profile TABLE.txt]
  pytorch_gpt.py --init OUT.safetensors --layers ... --seq T --seed S   (write initial weights)
  both with --arch llama --kv-heads K --inner I [--rope-theta 10000] for the llama model
"""
import argparse
import json
import math
import struct
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F


def read_safetensors(path):
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
        data = f.read()
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", name
        begin, end = info["data_offsets"]
        array = np.frombuffer(data[begin:end], dtype=np.float32).reshape(info["shape"])
        tensors[name] = torch.from_numpy(array.copy())
    return tensors


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, tensor in tensors.items():
        blob = tensor.detach().contiguous().numpy().astype(np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def init_weights(layers, hidden, vocab, seq, seed):
    """GPT-2's initialisation: N(0, 0.02), residual projections scaled by 1/sqrt(2L)."""
    g = torch.Generator().manual_seed(seed)
    normal = lambda *shape, std=0.02: torch.randn(*shape, generator=g) * std
    c, residual = hidden, 0.02 / math.sqrt(2 * layers)
    w = {"wte.weight": normal(vocab, c), "wpe.weight": normal(seq, c),
         "ln_f.weight": torch.ones(c), "ln_f.bias": torch.zeros(c)}
    for i in range(layers):
        p = f"h.{i}."
        w.update({
            p + "ln_1.weight": torch.ones(c), p + "ln_1.bias": torch.zeros(c),
            p + "attn.c_attn.weight": normal(c, 3 * c), p + "attn.c_attn.bias": torch.zeros(3 * c),
            p + "attn.c_proj.weight": normal(c, c, std=residual), p + "attn.c_proj.bias": torch.zeros(c),
            p + "ln_2.weight": torch.ones(c), p + "ln_2.bias": torch.zeros(c),
            p + "mlp.c_fc.weight": normal(c, 4 * c), p + "mlp.c_fc.bias": torch.zeros(4 * c),
            p + "mlp.c_proj.weight": normal(4 * c, c, std=residual), p + "mlp.c_proj.bias": torch.zeros(c),
        })
    return {"transformer." + name: value for name, value in w.items()}


def embed(w, tokens):
    return w("wte.weight")[tokens] + w("wpe.weight")[:tokens.shape[1]]


def block(w, i, x, heads, attention="sdpa"):
    """One pre-LayerNorm block; `attention` is "sdpa" (F.scaled_dot_product_attention, causal)
    or "explicit" (softmax of the masked T x T scores, as PyTorch code written before SDPA)."""
    b, t, c = x.shape
    p = f"h.{i}."
    h = F.layer_norm(x, (c,), w(p + "ln_1.weight"), w(p + "ln_1.bias"), 1e-5)
    qkv = torch.addmm(w(p + "attn.c_attn.bias"), h.view(-1, c),
                      w(p + "attn.c_attn.weight")).view(b, t, 3, heads, c // heads)
    q, k, v = qkv.permute(2, 0, 3, 1, 4)
    if attention == "sdpa":
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    else:
        att = (q @ k.transpose(-2, -1)) / math.sqrt(c // heads)
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        y = att.masked_fill(mask, float("-inf")).softmax(-1) @ v
    y = y.transpose(1, 2).reshape(-1, c)
    x = x + torch.addmm(w(p + "attn.c_proj.bias"), y, w(p + "attn.c_proj.weight")).view(b, t, c)
    h = F.layer_norm(x, (c,), w(p + "ln_2.weight"), w(p + "ln_2.bias"), 1e-5)
    h = F.gelu(torch.addmm(w(p + "mlp.c_fc.bias"), h.view(-1, c), w(p + "mlp.c_fc.weight")),
               approximate="tanh")
    return x + torch.addmm(w(p + "mlp.c_proj.bias"), h, w(p + "mlp.c_proj.weight")).view(b, t, c)


def head(w, x):
    """Final LayerNorm and the tied output head: logits of shape (B*T, V)."""
    c = x.shape[-1]
    x = F.layer_norm(x, (c,), w("ln_f.weight"), w("ln_f.bias"), 1e-5)
    return x.reshape(-1, c) @ w("wte.weight").t()


def init_llama_weights(layers, hidden, heads, kv_heads, inner, vocab, seed):
    """BigMac's llama initialisation (stages/llama/params.h) under LlamaForCausalLM's names."""
    g = torch.Generator().manual_seed(seed)
    normal = lambda *shape, std=0.02: torch.randn(*shape, generator=g) * std
    c, kv, residual = hidden, kv_heads * (hidden // heads), 0.02 / math.sqrt(2 * layers)
    w = {"model.embed_tokens.weight": normal(vocab, c), "model.norm.weight": torch.ones(c),
         "lm_head.weight": normal(vocab, c)}
    for i in range(layers):
        p = f"model.layers.{i}."
        w.update({
            p + "input_layernorm.weight": torch.ones(c),
            p + "self_attn.q_proj.weight": normal(c, c), p + "self_attn.k_proj.weight": normal(kv, c),
            p + "self_attn.v_proj.weight": normal(kv, c),
            p + "self_attn.o_proj.weight": normal(c, c, std=residual),
            p + "post_attention_layernorm.weight": torch.ones(c),
            p + "mlp.gate_proj.weight": normal(inner, c), p + "mlp.up_proj.weight": normal(inner, c),
            p + "mlp.down_proj.weight": normal(c, inner, std=residual),
        })
    return w


class Llama(torch.nn.Module):
    """A llama model on LlamaForCausalLM-named weights ([out, in] layout: y = x @ W^T)."""

    def __init__(self, weights, layers, heads, kv_heads, rope_theta, eps=1e-5):
        super().__init__()
        self.p = torch.nn.ParameterDict(
            {k.replace(".", "__"): torch.nn.Parameter(v) for k, v in weights.items()})
        self.layers, self.heads, self.kv_heads, self.theta, self.eps = (
            layers, heads, kv_heads, rope_theta, eps)

    def w(self, name):
        return self.p[name.replace(".", "__")]

    def rope(self, t, d):
        inv = 1.0 / (self.theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
        angles = torch.outer(torch.arange(t, dtype=torch.float64), inv)
        angles = torch.cat([angles, angles], dim=-1)
        return angles.cos().float(), angles.sin().float()

    def forward(self, tokens, targets):
        b, t = tokens.shape
        x = self.w("model.embed_tokens.weight")[tokens]
        c = x.shape[-1]
        d = c // self.heads
        cos, sin = self.rope(t, d)

        def rotate(u):  # (b, heads, t, d), Hugging Face's rotate_half convention
            half = torch.cat([-u[..., d // 2:], u[..., :d // 2]], dim=-1)
            return u * cos + half * sin

        for i in range(self.layers):
            p = f"model.layers.{i}."
            h = F.rms_norm(x, (c,), self.w(p + "input_layernorm.weight"), self.eps)
            q = F.linear(h, self.w(p + "self_attn.q_proj.weight")).view(b, t, self.heads, d).transpose(1, 2)
            k = F.linear(h, self.w(p + "self_attn.k_proj.weight")).view(b, t, self.kv_heads, d).transpose(1, 2)
            v = F.linear(h, self.w(p + "self_attn.v_proj.weight")).view(b, t, self.kv_heads, d).transpose(1, 2)
            y = F.scaled_dot_product_attention(rotate(q), rotate(k), v, is_causal=True,
                                               enable_gqa=True)
            x = x + F.linear(y.transpose(1, 2).reshape(b, t, c), self.w(p + "self_attn.o_proj.weight"))
            h = F.rms_norm(x, (c,), self.w(p + "post_attention_layernorm.weight"), self.eps)
            h = F.silu(F.linear(h, self.w(p + "mlp.gate_proj.weight"))) * F.linear(
                h, self.w(p + "mlp.up_proj.weight"))
            x = x + F.linear(h, self.w(p + "mlp.down_proj.weight"))
        x = F.rms_norm(x, (c,), self.w("model.norm.weight"), self.eps)
        logits = F.linear(x.reshape(-1, c), self.w("lm_head.weight"))
        return F.cross_entropy(logits, targets.reshape(-1), reduction="sum")


class Params(torch.nn.Module):
    """A set of Hugging Face GPT-2 weights (Conv1D layout: y = x @ W + b, W of shape (in, out))."""

    def __init__(self, weights):
        super().__init__()
        self.p = torch.nn.ParameterDict(
            {k.removeprefix("transformer.").replace(".", "__"): torch.nn.Parameter(v)
             for k, v in weights.items()})

    def w(self, name):
        return self.p[name.replace(".", "__")]


class Gpt(Params):
    def __init__(self, weights, layers, heads, attention="sdpa"):
        super().__init__(weights)
        self.layers, self.heads, self.attention = layers, heads, attention

    def forward(self, tokens, targets):
        x = embed(self.w, tokens)
        for i in range(self.layers):
            x = block(self.w, i, x, self.heads, self.attention)
        return F.cross_entropy(head(self.w, x), targets.reshape(-1), reduction="sum")


def adamw(named_params, a, fused):
    """BigMac's AdamW groups: decay on matrices and embeddings, none on vectors."""
    decay = [p for n, p in named_params if p.dim() == 2]
    no_decay = [p for n, p in named_params if p.dim() != 2]
    groups = [{"params": g, "weight_decay": wd}
              for g, wd in ((decay, a.weight_decay), (no_decay, 0.0)) if g]
    return torch.optim.AdamW(groups, lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps,
                             fused=fused or None)


def read_batches(path):
    with open(path, "rb") as f:
        magic, steps, per_step, batch, seq = struct.unpack("<5i", f.read(20))
        assert magic == 0x54424D42, "not a bigmac data batches file"
        data = np.frombuffer(f.read(), dtype=np.int32)
    data = torch.from_numpy(data.copy().astype(np.int64)).view(steps, per_step, 2, batch, seq)
    return data


def learning_rate(step, lr, min_lr, warmup, max_steps):  # optim::LearningRate
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, max_steps - warmup))
    return min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (lr - min_lr)


def add_optim_args(ap):
    """BigMac's optimizer settings (optim.* in its config) as options."""
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--min-lr", type=float, default=1e-4)
    ap.add_argument("--warmup", type=int, default=0)
    ap.add_argument("--max-steps", type=int, default=10)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.95)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--grad-clip", type=float, default=1.0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--init")
    ap.add_argument("--weights")
    ap.add_argument("--batches")
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--hidden", type=int, required=True)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--arch", choices=("gpt", "llama"), default="gpt")
    ap.add_argument("--kv-heads", type=int, default=0, help="llama: key/value heads (0: --heads)")
    ap.add_argument("--inner", type=int, default=0, help="llama: the SwiGLU width")
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    add_optim_args(ap)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--attention", choices=("sdpa", "explicit"), default="sdpa")
    ap.add_argument("--no-fused", action="store_true", help="the for-each AdamW, not fused=True")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    ap.add_argument("--profile", help="write torch.profiler's per-operator table of the last step")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    kv_heads = a.kv_heads or a.heads
    if a.init:
        write_safetensors(a.init, init_llama_weights(a.layers, a.hidden, a.heads, kv_heads, a.inner,
                                                     a.vocab, a.seed)
                          if a.arch == "llama" else
                          init_weights(a.layers, a.hidden, a.vocab, a.seq, a.seed))
        return
    if a.arch == "llama":
        model = Llama(read_safetensors(a.weights), a.layers, a.heads, kv_heads, a.rope_theta)
    else:
        model = Gpt(read_safetensors(a.weights), a.layers, a.heads, a.attention)
    batches = read_batches(a.batches)
    steps, per_step, _, batch, seq = batches.shape
    opt = adamw(list(model.p.items()), a, fused=not a.no_fused)
    forward = torch.compile(model) if a.compile else model
    tokens_per_step = per_step * batch * seq
    losses, ms = [], []
    total_steps = min(steps, a.max_steps)
    for step in range(total_steps):
        profiler = None
        if a.profile and step == total_steps - 1:
            profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            profiler.__enter__()
        start = time.perf_counter()
        for group in opt.param_groups:
            group["lr"] = learning_rate(step, a.lr, a.min_lr, a.warmup, a.max_steps)
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for m in range(per_step):
            loss = forward(batches[step, m, 0], batches[step, m, 1]) / tokens_per_step
            loss.backward()
            total += loss.item()
        if a.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.grad_clip)
        opt.step()
        ms.append((time.perf_counter() - start) * 1000)
        losses.append(total)
        if profiler:
            profiler.__exit__(None, None, None)
            with open(a.profile, "w") as f:
                f.write(profiler.key_averages().table(sort_by="self_cpu_time_total",
                                                      row_limit=40, max_name_column_width=60))
    print(json.dumps({"losses": losses, "step_ms": ms, "tokens_per_step": tokens_per_step,
                      "threads": torch.get_num_threads(), "torch": torch.__version__,
                      "variant": {"arch": a.arch, "attention": a.attention, "fused": not a.no_fused,
                                  "compile": a.compile}}))


if __name__ == "__main__":
    sys.exit(main())
