"""``plasticlm refine experiment``: accuracy, time to first token, latency and bytes per mode.

Sandbox: the receiver answers multiple-choice questions whose facts only the specialist
learned; fusers train on the specialist questions of the dev and val splits and are
evaluated on the test split. Real: MMLU CSVs with any HF checkpoints (fusers train on one
split and are evaluated on another). Writes ``report.json``, ``table.md``, ``metrics.jsonl``
and plots into the run folder.
"""

from __future__ import annotations

import time
from dataclasses import asdict, replace
from pathlib import Path

import torch
from tqdm.auto import tqdm

from plasticlm.config import Field, configclass
from plasticlm.data.mmlu import load_mmlu
from plasticlm.errors import PlasticError
from plasticlm.eval import qa_prompt
from plasticlm.refine.examples import make_examples
from plasticlm.refine.fedrefine import FedRefine
from plasticlm.refine.fusers.fuser import Fuser
from plasticlm.refine.fusers.train import FuserTrainConfig, train_fuser
from plasticlm.refine.leakage import measure_leakage
from plasticlm.refine.link import Link
from plasticlm.refine.modes import RefineConfig
from plasticlm.refine.peer import Peer, load_peer
from plasticlm.refine.rephrase import rephrase
from plasticlm.refine.report import PAPER, markdown_table, plot_report
from plasticlm.runs import RunDir
from plasticlm.runtime import seed_everything
from plasticlm.sandbox import sandbox_world


@configclass
class ExperimentConfig:
    """Which models, which questions, which modes; fusers train with ``fuser``."""

    receiver: str = Field("sandbox:receiver", description="the receiver model (a folder, a "
                          "hub id, or sandbox:NAME / quick:NAME)")
    transmitters: tuple[str, ...] = Field(
        ("sandbox:specialist", "sandbox:transmitter-llama", "sandbox:transmitter-qwen2"),
        min_length=1, description="the transmitter models; the first is partner 0 (private, "
        "co-c2c and leakage rows)")
    mmlu: str = Field("", description="MMLU-layout folder (empty: the specialist questions "
                      "of the receiver's sandbox world)")
    subjects: tuple[str, ...] = Field((), description="subjects to use (empty: all)")
    train_splits: tuple[str, ...] = Field(("dev", "val"), description="splits the fusers "
                                          "train on")
    eval_splits: tuple[str, ...] = Field(("test",), description="splits every mode is "
                                         "scored on (disjoint from the training splits)")
    max_train: int = Field(0, ge=0, description="training questions kept (0: all)")
    max_eval: int = Field(0, ge=0, description="evaluation questions kept (0: all)")
    fuser: FuserTrainConfig = Field(default_factory=FuserTrainConfig,
                                    description="how every fuser trains")
    private_rank: int = Field(32, ge=1, description="rank of the private (prefix) fuser")
    private_draft_tokens: int = Field(2, ge=0, description="tokens the private fuser's "
                                      "transmitter drafts (see FuserConfig.draft_tokens)")
    draft_only_tokens: int = Field(3, ge=0, description="draft-only prefix fusers "
                                   "(FuserConfig.share='draft'), one per transmitter, with "
                                   "this many drafted tokens; 0 leaves their rows out")
    rounds: int = Field(1, ge=1, description="co-c2c exchanges")
    t2t_max_new_tokens: int = Field(8, ge=0, description="t2t: tokens of each background")
    fusers_from: str = Field("", description="a previous run folder whose fusers/ to reuse")
    out: str = Field("", description="run folder (default runs/refine-<time>)")
    seed: int = Field(0, description="seed of the whole run")
    progress: bool = Field(True, description="show progress bars")

    def __post_init__(self):
        if set(self.train_splits) & set(self.eval_splits):
            raise PlasticError(f"train splits {self.train_splits} and eval splits "
                               f"{self.eval_splits} overlap: evaluate on questions the "
                               "fusers never saw")


def sandbox_world_of(model_spec: str) -> Path:
    """The world folder of a ``sandbox:NAME`` / ``quick:NAME`` model's preset."""
    preset = model_spec.split(":", 1)[0]
    if preset not in ("sandbox", "quick"):
        raise PlasticError(f"{model_spec!r} is not a sandbox model: give sandbox:NAME or "
                           "quick:NAME (or, for the modes experiment, --mmlu)")
    return sandbox_world(preset)


def load_questions(cfg: ExperimentConfig):
    """(train questions, eval questions, prompt function): the prompt function is the one QA
    template, :func:`plasticlm.eval.qa_prompt`, for the sandbox and for real MMLU alike."""
    folder = Path(cfg.mmlu) if cfg.mmlu else sandbox_world_of(cfg.receiver) / "specialist_mmlu"
    subjects = list(cfg.subjects) or None
    train = [q for s in cfg.train_splits for q in load_mmlu(folder, s, subjects)]
    test = [q for s in cfg.eval_splits for q in load_mmlu(folder, s, subjects)]
    if cfg.max_train:
        train = train[: cfg.max_train]
    if cfg.max_eval:
        test = test[: cfg.max_eval]
    return train, test, qa_prompt


def _fuser(run: Path, name: str, reuse: Path | None, make) -> Fuser:
    if reuse is not None and (reuse / "fusers" / name).is_dir():
        return Fuser.from_pretrained(reuse / "fusers" / name)
    fuser = make()
    fuser.save_pretrained(run / "fusers" / name)
    return fuser


def run_experiment(cfg: ExperimentConfig) -> dict:
    """Train the fusers, evaluate every mode, write the report; returns it."""
    seed_everything(cfg.seed)
    torch.set_grad_enabled(True)
    run = RunDir(Path(cfg.out) if cfg.out else Path("runs") / f"refine-{int(time.time())}")
    run.write_json("config.json", cfg)
    t_start = time.time()
    receiver = load_peer(cfg.receiver)
    peers = [load_peer(t) for t in cfg.transmitters]
    train_q, test_q, prompt_fn = load_questions(cfg)
    reuse = Path(cfg.fusers_from) if cfg.fusers_from else None
    examples = make_examples(train_q, prompt_fn)
    fusers, train_log = [], {}

    def trainer(r, t, examples, fcfg, tag):
        def make():
            t0 = time.time()
            f, losses = train_fuser(r, t, examples, fcfg, progress=cfg.progress,
                                    log=lambda **m: run.log(fuser=tag, **m))
            train_log[tag] = {"seconds": round(time.time() - t0, 1), "steps": len(losses),
                              "first_loss": round(sum(losses[:20]) / len(losses[:20]), 4),
                              "last_loss": round(sum(losses[-20:]) / len(losses[-20:]), 4)}
            return f
        return make

    aligned = replace(cfg.fuser, mode="aligned", private=False)
    for t in peers:
        fusers.append(_fuser(run.path, f"{t.name}-to-{receiver.name}", reuse,
                             trainer(receiver, t, examples, aligned, t.name)))
    private_cfg = replace(cfg.fuser, mode="prefix", private=True, rank=cfg.private_rank,
                          draft_tokens=cfg.private_draft_tokens)
    private_examples = make_examples(train_q, prompt_fn, private=True)
    private = _fuser(run.path, f"{peers[0].name}-to-{receiver.name}-private", reuse,
                     trainer(receiver, peers[0], private_examples, private_cfg,
                             f"{peers[0].name}-private"))
    reverse = _fuser(run.path, f"{receiver.name}-to-{peers[0].name}", reuse,
                     trainer(peers[0], receiver, examples, aligned, f"reverse-{peers[0].name}"))
    draft_fusers = []
    if cfg.draft_only_tokens > 0:
        draft_cfg = replace(cfg.fuser, mode="prefix", private=False, share="draft",
                            draft_tokens=cfg.draft_only_tokens)
        draft_fusers = [_fuser(run.path, f"{t.name}-to-{receiver.name}-draft", reuse,
                               trainer(receiver, t, examples, draft_cfg, f"{t.name}-draft"))
                        for t in peers]

    base = RefineConfig(rounds=cfg.rounds, t2t_max_new_tokens=cfg.t2t_max_new_tokens)
    links = [Link(p, f) for p, f in zip(peers, fusers)]
    systems = {
        "main": FedRefine(receiver, links, base, reverse_fuser=reverse),
        "sequence": FedRefine(receiver, links, replace(base, order="sequence")),
        "private": FedRefine(receiver, [Link(peers[0], private)], replace(base, private=True)),
        "t2t-private": FedRefine(receiver, links[:1], replace(base, private=True)),
        "specialist": FedRefine(peers[0]),
    }
    rows = [("alone", "main", "alone", None), ("transmitter-0 alone", "specialist", "alone", None),
            ("t2t", "main", "t2t", 1), ("c2c", "main", "c2c", 1),
            ("c2c private (prefix, rephrased)", "private", "c2c", 1),
            ("t2t private (rephrased)", "t2t-private", "t2t", 1)]
    for i, p in enumerate(peers[1:], 1):
        systems[f"only-{i}"] = FedRefine(receiver, [links[i]], base)
        rows.append((f"c2c via {p.name} only", f"only-{i}", "c2c", 1))
    for n in range(2, len(peers) + 1):
        rows.append((f"multi x{n} (parallel)", "main", "multi", n))
    if len(peers) > 1:
        rows.append((f"multi x{len(peers)} (sequence)", "sequence", "multi", len(peers)))
        rows.append((f"t2t x{len(peers)}", "main", "t2t", len(peers)))
    rows.append(("co-c2c", "main", "co-c2c", 1))
    if draft_fusers:
        draft_links = [Link(p, f) for p, f in zip(peers, draft_fusers)]
        systems["draft"] = FedRefine(receiver, draft_links, base)
        rows.append(("c2c draft-only (prefix)", "draft", "c2c", 1))
        for i, p in enumerate(peers[1:], 1):
            systems[f"draft-only-{i}"] = FedRefine(receiver, [draft_links[i]], base)
            rows.append((f"c2c draft-only via {p.name} only", f"draft-only-{i}", "c2c", 1))
        if len(peers) > 1:
            rows.append((f"multi x{len(peers)} draft-only (parallel)", "draft", "multi",
                         len(peers)))

    results = {}
    for label, system, mode, n in tqdm(rows, desc="modes", disable=not cfg.progress):
        fr = systems[system]
        correct, partner, ttft, lat, wire = [], [], [], [], []
        for q in test_q:
            s = fr.score(prompt_fn(q.question), list(q.choices), mode, n)
            correct.append(s.choice == q.answer_index)
            ttft.append(s.ttft)
            lat.append(s.latency)
            wire.append(s.wire_bytes)
            if s.partner_choice is not None:
                partner.append(s.partner_choice == q.answer_index)
        entry = {"mode": mode, "transmitters": n or 0, "accuracy": sum(correct) / len(correct),
                 "n": len(correct), "ttft_ms": 1000 * sum(ttft) / len(ttft),
                 "latency_ms": 1000 * sum(lat) / len(lat), "wire_bytes": sum(wire) / len(wire)}
        if partner:
            entry["partner_accuracy"] = sum(partner) / len(partner)
        results[label] = entry
        run.log(row=label, **entry)

    r_params = sum(p.numel() for p in receiver.model.parameters())
    sizes = {f.config.transmitter_name: {"fuser_parameters": f.num_parameters(),
                                         "ratio_to_receiver": f.num_parameters() / r_params}
             for f in fusers}
    sizes["private"] = {"fuser_parameters": private.num_parameters(),
                        "ratio_to_receiver": private.num_parameters() / r_params}
    for f in draft_fusers:
        sizes[f"{f.config.transmitter_name} (draft-only)"] = {
            "fuser_parameters": f.num_parameters(),
            "ratio_to_receiver": f.num_parameters() / r_params}
    a = results["alone"]["accuracy"]
    all_label = f"multi x{len(peers)} (parallel)" if len(peers) > 1 else "c2c"
    ours = {"multi_all_vs_alone_pp": 100 * (results[all_label]["accuracy"] - a),
            "c2c_vs_alone_pp": 100 * (results["c2c"]["accuracy"] - a),
            "private_vs_nonprivate_pp": 100 * (results["c2c private (prefix, rephrased)"]
                                               ["accuracy"] - results["c2c"]["accuracy"]),
            "c2c_vs_t2t_pp": 100 * (results["c2c"]["accuracy"] - results["t2t"]["accuracy"]),
            "c2c_vs_t2t_latency_ratio": results["c2c"]["latency_ms"]
            / max(1e-9, results["t2t"]["latency_ms"])}
    if draft_fusers:
        ours["draft_only_c2c_vs_alone_pp"] = 100 * (results["c2c draft-only (prefix)"]
                                                    ["accuracy"] - a)
    leak = _leakage(peers[0], [prompt_fn(q.question) for q in test_q], fusers[0])
    report = {"out": str(run.path), "receiver": receiver.name, "receiver_parameters": r_params,
              "transmitters": [p.name for p in peers], "n_train": len(train_q),
              "n_eval": len(test_q), "results": results, "fuser_sizes": sizes,
              "fuser_training": train_log, "ours_vs_paper": {"ours": ours, "paper": PAPER},
              "leakage": leak, "seconds": round(time.time() - t_start, 1)}
    run.write_json("report.json", report)
    (run.path / "table.md").write_text(markdown_table(report))
    plot_report(report, run.path)
    return report


def _leakage(peer: Peer, prompts: list[str], fuser: Fuser) -> dict:
    layer = min(fuser.transmitter_layers_read)
    rephrased = [rephrase(p)[0] for p in prompts]
    return asdict(measure_leakage(peer.model, peer.tokenizer, prompts, rephrased, layer))
