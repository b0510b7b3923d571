"""FedRefine across real processes on loopback: a fuser registry, two transmitter peers
(sandbox Llama and Qwen2) and the receiver (sandbox Qwen3), each `plasticlm refine serve` /
`refine registry` in its own process. For held-out sandbox MC items it asks the receiver's
/ask in every served mode and, for cache modes, with caches sent as float32, bf16, int8 and
fp8, and reports:

- accuracy with 95% intervals, and each quantisation against float32 on the same items
  (paired difference and share of identical choices): the codec's cost in accuracy;
- bytes per transmitted token per quantisation (measured on /prefill payloads);
- like for like: c2c and t2t with one transmitter, multi and t2t with both (the transmitters
  asked at the same time), beside the receiver alone; time to first token (the receiver's
  state ready and the choices' first-token distribution out) and time per step (rephrase,
  transmitter prefill, transfer, fuse, decode), and the latency an answer would have over
  slower links (compute + 20 ms + bytes / bandwidth).

The fusers are the general ones from `plasticlm refine pretrain-fuser` (default registry
runs/refine-network/fusers, one per transmitter -> receiver).

    python bench/refine_network.py --items 300 --out bench/results/refine_network
    python bench/refine_network.py --smoke   # the quick sandbox, 2 items; a temp folder

``--smoke`` serves the quick sandbox family instead (its receiver; transmitter-llama and the
specialist as the two transmitters) with untrained rank-4 fusers in a temp registry, asks 2
items in every mode and writes into a temp folder.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from plasticlm.eval import bootstrap_ci, qa_prompt
from plasticlm.experiments.refine.experiment import ExperimentConfig, load_questions
from plasticlm.refine.report import LINK_MB_PER_S, link_latency_ms
from plasticlm.refine.wire.codec import read_metadata
from plasticlm.refine.wire.quant import QUANTS
from plasticlm.runs import write_text_atomic

TRANSMITTERS = ("transmitter-llama", "transmitter-qwen2")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(args: list[str], port: int) -> subprocess.Popen:
    env = {**os.environ, "PLASTICLM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "plasticlm.cli", "refine", *args, "--port",
                             str(port)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def _wait(url: str, limit: float = 300.0) -> None:
    t0 = time.time()
    while time.time() - t0 < limit:
        try:
            if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.5)
    raise SystemExit(f"{url} did not start")


def _untrained_fusers(preset: str, transmitters: tuple[str, ...], registry: Path) -> None:
    """A fresh (untrained) rank-4 fuser from each transmitter into the receiver, saved where
    the registry serves it (a smoke check's stand-in for ``refine pretrain-fuser``)."""
    from plasticlm.refine import Fuser
    from plasticlm.refine.peer import load_peer
    from plasticlm.refine.wire.fuser_registry import pair_folder

    receiver = load_peer(f"{preset}:receiver")
    for t in transmitters:
        peer = load_peer(f"{preset}:{t}")
        Fuser.for_pair(receiver.layout, peer.layout, rank=4).save_pretrained(
            pair_folder(registry, peer.name, receiver.name))


def _ci(xs: list[float], base: list[float] | None = None) -> dict:
    c = bootstrap_ci(xs, base)
    return {"mean": 100 * c.mean, "low": 100 * c.low, "high": 100 * c.high, "n": c.n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--items", type=int, default=300)
    ap.add_argument("--registry", default="runs/refine-network/fusers")
    ap.add_argument("--out", default="bench/results/refine_network")
    ap.add_argument("--smoke", action="store_true", help="the quick sandbox with untrained "
                    "fusers, 2 items, written to a temp folder (a quick check)")
    args = ap.parse_args()
    preset, transmitters = "sandbox", TRANSMITTERS
    if args.smoke:
        preset, transmitters, args.items = "quick", ("transmitter-llama", "specialist"), 2
        tmp = Path(tempfile.mkdtemp(prefix="bench-smoke-"))
        args.registry, args.out = str(tmp / "fusers"), str(tmp / "refine_network")
        _untrained_fusers(preset, transmitters, Path(args.registry))
    _, questions, _ = load_questions(ExperimentConfig(receiver=f"{preset}:receiver"))
    questions = questions[: args.items]
    ports = {k: _port() for k in ("registry", "receiver", *transmitters)}
    url = {k: f"http://127.0.0.1:{p}" for k, p in ports.items()}
    procs = [_start(["registry", "--folder", args.registry], ports["registry"])]
    procs += [_start(["serve", "--model", f"{preset}:{t}"], ports[t]) for t in transmitters]
    procs.append(_start(["serve", "--model", f"{preset}:receiver", "--registry", url["registry"],
                         *[a for t in transmitters for a in ("--peer", url[t])]],
                        ports["receiver"]))
    client = httpx.Client(timeout=120.0)
    try:
        for u in url.values():
            _wait(u)
        # like for like: each cache row beside the text row with the same transmitters
        n_all = len(transmitters)
        runs = [("alone", "float32", None), ("t2t", "float32", 1)]
        runs += [("c2c", q, 1) for q in QUANTS]
        runs += [("t2t", "float32", n_all)] + [("multi", q, n_all) for q in QUANTS]
        results: dict[str, dict] = {}
        for mode, quant, n in runs:
            rows = []
            for q in questions:
                body = {"prompt": qa_prompt(q.question), "mode": mode,
                        "choices": list(q.choices), "quant": quant, "transmitters": n}
                t0 = time.perf_counter()
                r = client.post(f"{url['receiver']}/ask", json=body)
                r.raise_for_status()
                out = r.json()
                rows.append({"correct": float(out["choice"] == q.choices["ABCD".index(q.answer)]),
                             "choice": out["choice"], "scores": out["scores"],
                             "wire_bytes": out["wire_bytes"],
                             "seconds": out["seconds"], "took_part": out["took_part"],
                             "ttft": out["ttft"], "client_seconds": time.perf_counter() - t0})
            results[_key(mode, n, quant)] = {"mode": mode, "transmitters": n or 0,
                                             "quant": quant, "rows": rows}
            acc = 100 * statistics.mean(x["correct"] for x in rows)
            ms = 1000 * statistics.median(x["client_seconds"] for x in rows)
            print(f"{_key(mode, n, quant):22s} acc {acc:.1f}%  {ms:.0f} ms", flush=True)
        # Bytes per token of a question's cache, and of a long one (20 questions as one
        # text), where the payload's fixed part (header, key scales) is spread thinner.
        texts = {"question": [qa_prompt(q.question) for q in questions[:20]],
                 "20 questions": [" ".join(qa_prompt(q.question) for q in questions[:20])]}
        per_token = {}
        for length, batch in texts.items():
            for quant in QUANTS:
                sizes, tokens = [], []
                for text in batch:
                    r = client.post(f"{url['transmitter-llama']}/prefill",
                                    json={"text": text, "quant": quant})
                    r.raise_for_status()
                    tokens.append(read_metadata(r.content, "plasticlm")["caches"][0]["tokens"])
                    sizes.append(len(r.content))
                per_token.setdefault(length, {})[quant] = {
                    "tokens": statistics.mean(tokens), "bytes_per_token": sum(sizes) / sum(tokens)}
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)
    report = summarise(results, per_token, len(questions))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out.with_suffix(".json"), json.dumps(report, indent=1) + "\n")
    write_text_atomic(out.with_suffix(".md"), "\n".join(markdown(report)) + "\n")
    print("\n".join(markdown(report)))
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}")


def _key(mode: str, n: int | None, quant: str) -> str:
    return f"{mode} x{n or 0}/{quant}"


def summarise(results: dict, per_token: dict, n: int) -> dict:
    rows = []
    for r in results.values():
        correct = [x["correct"] for x in r["rows"]]
        base = results.get(_key(r["mode"], r["transmitters"], "float32"))
        entry = {"mode": r["mode"], "transmitters": r["transmitters"], "quant": r["quant"],
                 "accuracy": _ci(correct), "took_part": r["rows"][0]["took_part"],
                 "wire_bytes": statistics.mean(x["wire_bytes"] for x in r["rows"]),
                 "ttft_ms": 1000 * statistics.median(x["ttft"] for x in r["rows"]),
                 "client_ms": 1000 * statistics.median(x["client_seconds"] for x in r["rows"]),
                 "steps_ms": {s: 1000 * statistics.median(x["seconds"].get(s, 0.0)
                                                          for x in r["rows"])
                              for s in ("rephrase", "prefill", "transmitter", "transfer", "fuse",
                                        "decode")}}
        if base is not None and r["quant"] != "float32":
            entry["minus_float32"] = _ci(correct, [x["correct"] for x in base["rows"]])
            entry["same_choice"] = 100 * statistics.mean(
                float(a["choice"] == b["choice"]) for a, b in zip(r["rows"], base["rows"]))
            entry["score_change"] = statistics.mean(
                max(abs(x - y) for x, y in zip(a["scores"], b["scores"]))
                for a, b in zip(r["rows"], base["rows"]))
        compute = entry["client_ms"] - entry["steps_ms"]["transfer"]
        entry["link_ms"] = {f"{s:g} MB/s": link_latency_ms(compute, entry["wire_bytes"], s)
                            for s in LINK_MB_PER_S}
        rows.append(entry)
    for by_quant in per_token.values():
        for e in by_quant.values():
            e["float32_over"] = by_quant["float32"]["bytes_per_token"] / e["bytes_per_token"]
    return {"items": n, "rows": rows, "bytes_per_token": per_token}


def _fmt(c: dict) -> str:
    return f"{c['mean']:.1f} [{c['low']:.1f}, {c['high']:.1f}]"


def markdown(report: dict) -> list[str]:
    speeds = list(report["rows"][0]["link_ms"])
    lines = [f"Held-out sandbox MC items: {report['items']}; accuracy in %, mean [95% CI]; "
             "'- float32': paired difference on the same items; score change: mean over items of "
             "the largest change of a choice's log-prob (nats); times are medians in ms on loopback "
             "(2 shared cores, one thread per process); transmitters asked at the same time; "
             "TTFT: the receiver's state ready and the choices' first-token distribution out, "
             "beside 'alone'; 'total at': the link model, compute + 20 ms round trip + bytes / "
             "bandwidth.", "",
             "| mode | transmitters | caches as | took part | accuracy | - float32 | same choice | "
             "score change | bytes/answer | TTFT | TTFT / alone | transmitter | transfer | fuse | "
             "decode | total | " + " | ".join(f"total at {s}" for s in speeds) + " |",
             "|" + "---|" * (16 + len(speeds))]
    alone = next((e["ttft_ms"] for e in report["rows"] if e["mode"] == "alone"), None)
    for e in report["rows"]:
        st = e["steps_ms"]
        cells = [e["mode"], str(e["transmitters"]), e["quant"], ", ".join(e["took_part"]) or "-",
                 _fmt(e["accuracy"]),
                 _fmt(e["minus_float32"]) if "minus_float32" in e else "-",
                 f"{e['same_choice']:.0f}%" if "same_choice" in e else "-",
                 f"{e['score_change']:.3f}" if "score_change" in e else "-",
                 f"{e['wire_bytes']:.0f}", f"{e['ttft_ms']:.0f}",
                 f"{e['ttft_ms'] / alone:.2f}x" if alone else "-",
                 f"{st['prefill'] or st['transmitter']:.1f}",
                 f"{st['transfer']:.1f}", f"{st['fuse']:.1f}", f"{st['decode']:.1f}",
                 f"{e['client_ms']:.0f}", *(f"{v:.0f}" for v in e["link_ms"].values())]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Bytes per transmitted token (transmitter-llama: 6 layers x 2 kv heads x 32 "
              "dims; the payload as sent, header and scales included):", "",
              "| text | tokens | " + " | ".join(QUANTS) + " |", "|---|---|" + "---|" * len(QUANTS)]
    for length, by_quant in report["bytes_per_token"].items():
        tokens = next(iter(by_quant.values()))["tokens"]
        lines.append(f"| {length} | {tokens:.0f} | " + " | ".join(
            f"{e['bytes_per_token']:.0f} ({e['float32_over']:.2f}x fewer)"
            for e in by_quant.values()) + " |")
    return lines


if __name__ == "__main__":
    main()
