"""Peak resident memory of streaming over T tokens: memory stream (capped caches) vs full attention.

Each (mode, T) runs in a fresh subprocess that reads its own ru_maxrss, so peaks do not mix.
Model: a random tiny Qwen3-shaped Llama (hidden 256, 4 layers, 4 heads, 2 kv heads, head_dim 64),
fed in chunks of 512 tokens. "stream" = attach_memory(all layers, window 512) + MemoryStream;
"full" = the same base model with a growing DynamicCache (full attention).

    python bench/streaming_memory.py          # writes bench/results/streaming_memory.{json,png}
    python bench/streaming_memory.py --smoke  # T = 640 (two chunks) each way; a temp folder
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
SIZES = dict(vocab_size=1024, hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=64,
             intermediate_size=768, max_position_embeddings=65536)
CHUNK = 512
WINDOW = 512


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def child(mode: str, tokens: int, threads: int) -> dict:
    os.environ["HF_HUB_OFFLINE"] = "1"
    import torch

    from plasticlm.memory import MemoryStream, attach_memory
    from plasticlm.models import build_tiny

    torch.set_num_threads(threads)
    model = build_tiny("llama", seed=0, **SIZES)
    ids = torch.randint(0, SIZES["vocab_size"], (1, tokens), generator=torch.Generator().manual_seed(0))
    # warm-up on a short input so one-off allocations count in the baseline, not the stream
    with torch.no_grad():
        model(ids[:, :CHUNK], use_cache=False)
    start_rss = rss_mb()
    start = time.perf_counter()
    carried = 0
    if mode == "stream":
        attach_memory(model, layers="all", window=WINDOW, rank=8)
        stream = MemoryStream(model, chunk_tokens=CHUNK)
        last = stream.feed(ids, keep="last")
        carried = stream.state_bytes()
    else:
        from transformers import DynamicCache

        cache = DynamicCache(config=model.config)
        with torch.no_grad():
            for s in range(0, tokens, CHUNK):
                last = model(ids[:, s:s + CHUNK], cache=cache, use_cache=True).logits[:, -1:]
        carried = sum(layer.keys.numel() * layer.keys.element_size() * 2 for layer in cache.layers)
    return {"mode": mode, "tokens": tokens, "peak_rss_mb": round(rss_mb(), 1),
            "rss_after_model_mb": round(start_rss, 1), "carried_state_mb": round(carried / 2**20, 2),
            "seconds": round(time.perf_counter() - start, 1), "finite": bool(last.isfinite().all())}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384, 32768])
    ap.add_argument("--modes", nargs="+", default=["stream", "full"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--child", nargs=2, metavar=("MODE", "TOKENS"))
    ap.add_argument("--out", default=str(RESULTS / "streaming_memory.json"))
    ap.add_argument("--smoke", action="store_true", help="T = 640 (two chunks) in both modes, "
                    "written to a temp folder (a quick check)")
    args = ap.parse_args()
    if args.smoke and not args.child:
        args.tokens = [CHUNK + 128]
        args.out = str(Path(tempfile.mkdtemp(prefix="bench-smoke-")) / "streaming_memory.json")
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]), args.threads)))
        return
    rows = []
    for mode in args.modes:
        for tokens in args.tokens:
            done = subprocess.run([sys.executable, __file__, "--child", mode, str(tokens),
                                   "--threads", str(args.threads)], capture_output=True, text=True)
            if done.returncode:
                raise SystemExit(f"{mode} T={tokens} failed:\n{done.stderr[-2000:]}")
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(json.dumps(rows[-1]), flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"setup": {**SIZES, "chunk": CHUNK, "window": WINDOW, "threads": args.threads},
                               "rows": rows}, indent=2) + "\n")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    for mode, label in (("stream", f"memory stream (window {WINDOW})"), ("full", "full attention (KV cache)")):
        sub = [r for r in rows if r["mode"] == mode]
        if sub:
            ax.plot([r["tokens"] for r in sub], [r["peak_rss_mb"] for r in sub], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens streamed")
    ax.set_ylabel("peak RSS (MB)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=120)
    print(f"wrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
