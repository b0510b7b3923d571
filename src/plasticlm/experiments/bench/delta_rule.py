"""The delta rule timed side by side: the chunkwise kernel against transformers'
``torch_chunk_gated_delta_rule`` and the recurrent form, and against the matmul floor."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from transformers.models.qwen3_next.modeling_qwen3_next import torch_chunk_gated_delta_rule

from plasticlm.memory.ops import delta_rule_chunkwise, delta_rule_recurrent


def delta_rule_inputs(t: int, b: int = 1, h: int = 4, d: int = 64, seed: int = 0):
    """(q, k, v, beta) of shapes [B, H, T, D] x3 and [B, H, T]; keys L2-normalised."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, t, d, generator=gen)
    k = F.normalize(torch.randn(b, h, t, d, generator=gen), dim=-1)
    v = torch.randn(b, h, t, d, generator=gen)
    beta = torch.rand(b, h, t, generator=gen)
    return q, k, v, beta


def delta_rule_runners(chunk: int = 64) -> dict[str, Callable]:
    """Ours (chunkwise, recurrent) and transformers' reference on the same inputs; the
    reference takes [B, T, H, D] and scales q by Dk^-0.5, so ours get q * Dk^-0.5."""
    def chunkwise(q, k, v, beta):
        return delta_rule_chunkwise(q * q.shape[-1] ** -0.5, k, v, beta, chunk_size=chunk)

    def recurrent(q, k, v, beta):
        return delta_rule_recurrent(q * q.shape[-1] ** -0.5, k, v, beta)

    def transformers_ref(q, k, v, beta):
        b, h, t, _ = q.shape
        o, s = torch_chunk_gated_delta_rule(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), torch.zeros(b, t, h),
            beta.transpose(1, 2), chunk_size=64, output_final_state=True)
        return o.transpose(1, 2), s

    return {"chunkwise": chunkwise, "recurrent": recurrent, "transformers": transformers_ref}


def run_once(fn: Callable, inputs, backward: bool):
    """Seconds of one ``fn(*inputs)`` (with a backward pass through outputs and state when
    ``backward``) and its outputs."""
    leaves = [x.clone().requires_grad_(backward) for x in inputs]
    start = time.perf_counter()
    if backward:
        o, s = fn(*leaves)
        (o.sum() + s.sum()).backward()
    else:
        with torch.no_grad():
            o, s = fn(*leaves)
    return time.perf_counter() - start, (o.detach(), s.detach())


def timed_side_by_side(fns: dict[str, Callable], inputs, backward: bool, reps: dict[str, int]):
    """Best-of-``reps[name]`` seconds of each runner after one untimed warm-up, the runners
    taking turns in every round, and their last outputs. The minimum, as timeit advises:
    another job on a shared machine only ever adds time, and taking turns exposes every
    runner to the same drift."""
    best, outs = {}, {}
    for r in range(max(reps.values()) + 1):
        for name, fn in fns.items():
            if r > reps[name]:
                continue
            seconds, outs[name] = run_once(fn, inputs, backward)
            if r:
                best[name] = min(best.get(name, float("inf")), seconds)
    return best, outs


def matmul_gflops(size: int = 512, reps: int = 10) -> float:
    """This machine's dense float32 GEMM rate (GFLOP/s) at the current thread count."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return 2 * size**3 / min(times) / 1e9


def chunkwise_flops(b: int, h: int, t: int, d: int, chunk: int = 64) -> float:
    """Matmul FLOPs of the ungated chunkwise forward (d = dk = dv): per chunk five C x C x d
    products (K K^T, two solves' right sides, Q K^T, intra x U), the block-doubling inverse
    (~4/3 C^3) and three C x d x d state products."""
    c = chunk
    per_chunk = 2 * (5 * c * c * d + 3 * c * d * d) + 4 * c**3 / 3
    return b * h * -(-t // c) * per_chunk


def delta_rule_rows(lengths: list[int], reps: int = 5, chunk: int = 64) -> list[dict]:
    """Per T and mode (fwd, fwd+bwd): seconds of each runner, the ratios, the largest
    difference of outputs and final state against each peer, and the chunkwise kernel's
    multiple of the matmul floor (its FLOPs at the dense-GEMM rate; fwd+bwd counted as 3x
    the forward's FLOPs)."""
    fns = delta_rule_runners(chunk)
    rate = matmul_gflops() * 1e9
    rows = []
    for t in lengths:
        inputs = delta_rule_inputs(t)
        for backward in (False, True):
            row = {"T": t, "mode": "fwd+bwd" if backward else "fwd"}
            n = {name: 1 if name == "recurrent" and t >= 4096 else reps for name in fns}
            best, outs = timed_side_by_side(fns, inputs, backward, n)
            row.update({f"{name}_s": seconds for name, seconds in best.items()})
            for name in ("recurrent", "transformers"):
                row[f"max_abs_diff_o_vs_{name}"] = float(
                    (outs["chunkwise"][0] - outs[name][0]).abs().max())
                row[f"max_abs_diff_state_vs_{name}"] = float(
                    (outs["chunkwise"][1] - outs[name][1]).abs().max())
            row["speedup_vs_transformers"] = row["transformers_s"] / row["chunkwise_s"]
            row["speedup_vs_recurrent"] = row["recurrent_s"] / row["chunkwise_s"]
            b, h, _, d = inputs[0].shape
            row["floor_s"] = (3 if backward else 1) * chunkwise_flops(b, h, t, d, chunk) / rate
            row["over_floor"] = row["chunkwise_s"] / row["floor_s"]
            row["gemm_gflops"] = rate / 1e9
            rows.append(row)
    return rows
