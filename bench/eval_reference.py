"""Reference numbers of the metrics on real data: stories260K perplexity, MMLU by letters
and by continuation (stories260K and a random Qwen3), streaming CE of a long stream.

Run from the repository root: python -u bench/eval_reference.py (needs ../shared/data).
``--smoke``: 3 stories, 1 question of 2 MMLU subjects, a 129-token stream; seconds, prints
only (and skips, exit 0, when ../shared/data is absent)."""

import argparse
import csv
import json
import sys
import time
from pathlib import Path

import torch

from plasticlm.eval import (
    MCConfig,
    chunked_token_losses,
    encode_with_bos,
    evaluate_mc,
    perplexity,
    streaming_ce,
)
from plasticlm.models import build_tiny, from_llama2c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, seconds; prints only")
    args = ap.parse_args()
    # sizes: stories, MMLU subjects (None: all) and questions per subject, stream tokens,
    # streaming bucket
    stories_n, subjects, per_subject, stream_tokens, bucket = (
        (3, 2, 1, 129, 64) if args.smoke else (100, None, 5, 2049, 256))
    data = Path("../shared/data")
    if not data.is_dir():
        if args.smoke:
            print(f"eval_reference --smoke: skipped, no real data folder at {data.resolve()}")
            return
        sys.exit(f"eval_reference: no real data folder at {data.resolve()}")
    torch.set_num_threads(1 if args.smoke else 2)
    model, tok = from_llama2c(data / "models/stories260K/stories260K.bin",
                              data / "models/stories260K/tok512.bin")
    text = (data / "tinystories/tinystories_sample.txt").read_text()
    stories = [s.strip() for s in text.split("<|endoftext|>")[:stories_n] if s.strip()]
    t = time.time()
    p = perplexity(model, tok, stories)
    print("perplexity", p.nll, p.perplexity, p.num_tokens, f"{time.time() - t:.1f}s", flush=True)
    rows = []
    for f in sorted((data / "mmlu/test").glob("*.csv"))[:subjects]:
        with f.open(newline="", encoding="utf-8") as fh:
            rows += [r for r in csv.reader(fh) if len(r) == 6][:per_subject]
    q, c, a = [r[0] for r in rows], [r[1:5] for r in rows], [r[5] for r in rows]
    rand = build_tiny("qwen3", seed=0, vocab_size=512, hidden_size=64, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=16)
    for name, m in (("stories260K", model), ("random qwen3", rand)):
        for method in ("letters", "continuation"):
            t = time.time()
            r = evaluate_mc(m, tok, q, c, a, MCConfig(method=method, batch_size=16))
            print("mmlu", name, method, f"{r.accuracy:.3f}", r.n, f"{time.time() - t:.1f}s",
                  flush=True)
    ids = torch.tensor(encode_with_bos(tok, " ".join(stories))[:stream_tokens])
    s = streaming_ce(chunked_token_losses(model, bucket), [ids], bucket_size=bucket)
    print("streaming", json.dumps({"mean_ce": [round(x, 3) for x in s.mean_ce],
                                   "normalised": [round(x, 3) for x in s.normalised]}),
          flush=True)


if __name__ == "__main__":
    main()
