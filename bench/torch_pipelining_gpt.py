#!/usr/bin/env python3
"""One rank of bench/vs_torch_pipelining.py: the GPT of bench/pytorch_gpt.py cut into the same
stages as BigMac's pipeline, trained with torch.distributed.pipelining over gloo.

The model's layers are split evenly into pp * virtual chunks; chunk s lives on rank s % pp
(torch's and BigMac's interleaving), chunk 0 holds the embedding, the last chunk the final
LayerNorm and the output head with its own copy of the tied token embedding, whose gradient is
summed between the two ranks after the backward (as BigMac's tied-weight all-reduce does).
Global-norm clipping all-reduces the squared norm; AdamW is fused. Rank pp-1 prints one JSON line:
per-step losses and milliseconds. Started by the driver with RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT set (loopback only).

  torch_pipelining_gpt.py --weights W --batches B --layers L --hidden C --heads H
                          --schedule 1f1b|gpipe|interleaved_1f1b [--virtual 2] --lr ...
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed import pipelining

from pytorch_gpt import (Params, add_optim_args, adamw, block, embed, head, learning_rate,
                         read_batches, read_safetensors)

SCHEDULES = {"gpipe": pipelining.ScheduleGPipe, "1f1b": pipelining.Schedule1F1B,
             "interleaved_1f1b": pipelining.ScheduleInterleaved1F1B}


class Chunk(Params):
    """Layers [first, last) of the model, plus the embedding (chunk 0) and the head (last chunk)."""

    def __init__(self, weights, first, last, layers, heads, attention):
        keep = {"wte.weight", "wpe.weight"} if first == 0 else set()
        if last == layers:
            keep |= {"wte.weight", "ln_f.weight", "ln_f.bias"}
        super().__init__({k: v for k, v in weights.items()
                          if k.removeprefix("transformer.") in keep or
                          any(k.startswith(f"transformer.h.{i}.") for i in range(first, last))})
        self.first, self.last, self.layers, self.heads = first, last, layers, heads
        self.attention = attention

    def forward(self, x):
        if self.first == 0:
            x = embed(self.w, x)
        for i in range(self.first, self.last):
            x = block(self.w, i, x, self.heads, self.attention)
        return head(self.w, x) if self.last == self.layers else x


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weights", required=True)
    ap.add_argument("--batches", required=True)
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--hidden", type=int, required=True)
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--schedule", choices=tuple(SCHEDULES), default="1f1b")
    ap.add_argument("--virtual", type=int, default=1, help="chunks per rank (interleaved)")
    ap.add_argument("--attention", choices=("sdpa", "explicit"), default="sdpa")
    ap.add_argument("--threads", type=int, default=1)
    add_optim_args(ap)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo")
    rank, pp = dist.get_rank(), dist.get_world_size()
    chunks = pp * a.virtual
    if a.layers % chunks:
        sys.exit(f"torch_pipelining_gpt: {a.layers} layers do not split into {chunks} chunks")
    per = a.layers // chunks
    weights = read_safetensors(a.weights)
    mine = list(range(rank, chunks, pp))
    modules = [Chunk(weights, s * per, (s + 1) * per, a.layers, a.heads, a.attention)
               for s in mine]
    batches = read_batches(a.batches)
    steps, per_step, _, batch, seq = batches.shape
    tokens_per_step = per_step * batch * seq

    def loss_fn(logits, targets):
        return F.cross_entropy(logits, targets.reshape(-1), reduction="sum") / tokens_per_step

    stages = [pipelining.PipelineStage(m, s, chunks, torch.device("cpu"))
              for m, s in zip(modules, mine)]
    kind = SCHEDULES[a.schedule]
    schedule = (kind(stages, per_step, loss_fn=loss_fn, scale_grads=False) if a.virtual > 1
                else kind(stages[0], per_step, loss_fn=loss_fn, scale_grads=False))
    params = [(n, p) for m in modules for n, p in m.p.items()]
    opt = adamw(params, a, fused=True)
    tied = dist.new_group([0, pp - 1]) if pp > 1 else None
    first_chunk = next((m for m in modules if m.first == 0), None)
    head_chunk = next((m for m in modules if m.last == a.layers), None)
    losses, ms = [], []
    for step in range(min(steps, a.max_steps)):
        dist.barrier()
        start = time.perf_counter()
        for group in opt.param_groups:
            group["lr"] = learning_rate(step, a.lr, a.min_lr, a.warmup, a.max_steps)
        opt.zero_grad(set_to_none=False)
        tokens = batches[step, :, 0].reshape(per_step * batch, seq)
        targets = batches[step, :, 1].reshape(per_step * batch, seq)
        step_losses = []
        inputs = (tokens,) if rank == 0 else ()
        schedule.step(*inputs, target=targets, losses=step_losses)
        # The tied embedding: both copies get the sum of their gradients.
        owners = [m.w("wte.weight") for m in (first_chunk, head_chunk) if m is not None]
        if tied is not None and rank in (0, pp - 1):
            grad = owners[0].grad if len(owners) == 1 else owners[0].grad + owners[1].grad
            dist.all_reduce(grad, group=tied)
            for p in owners:
                p.grad.copy_(grad)
        # Global norm over the model, the tied weight counted once (on rank 0).
        squares = sum(float(p.grad.double().pow(2).sum()) for n, p in params
                      if not (rank == pp - 1 and rank != 0 and n == "wte__weight"))
        norm = torch.tensor([squares], dtype=torch.float64)
        dist.all_reduce(norm)
        if a.grad_clip > 0 and float(norm.sqrt()) > a.grad_clip:  # as BigMac's trainer
            for _, p in params:
                p.grad.mul_(a.grad_clip / float(norm.sqrt()))
        opt.step()
        ms.append((time.perf_counter() - start) * 1000)
        if head_chunk is not None:
            losses.append(float(sum(float(l) for l in step_losses)))
    if rank == pp - 1:
        print(json.dumps({"losses": losses, "step_ms": ms, "tokens_per_step": tokens_per_step,
                          "torch": torch.__version__, "schedule": a.schedule, "pp": pp}))
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
