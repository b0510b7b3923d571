"""``plasticlm models``: import, build, inspect and sample causal LMs."""

from __future__ import annotations

import argparse
import json
import math

from plasticlm.cli.options import (
    SEED,
    SIZE,
    add_option_config,
    add_overwrite_option,
    add_runtime_options,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="import, build, inspect and sample causal LMs",
                       description="Import, build, inspect and sample causal LMs.")
    msub = p.add_subparsers(dest="models_command", required=True, metavar="ACTION")
    from plasticlm.cli.pretrain_cmd import add_pretrain_parser

    add_pretrain_parser(msub)

    q = msub.add_parser("import-llama2c", help="convert a llama2.c v0 checkpoint to an HF folder",
                        description="Convert karpathy's llama2.c v0 model.bin and tokenizer.bin "
                        "into a folder that AutoModelForCausalLM/AutoTokenizer load.")
    q.add_argument("model_bin")
    q.add_argument("tokenizer_bin")
    q.add_argument("out_dir")
    add_overwrite_option(q, "out_dir")
    add_option_config(q)
    q.set_defaults(func=_import_llama2c)

    q = msub.add_parser("info", help="load a model and print its shape",
                        description="Load a model (local folder, hub id, sandbox:NAME or "
                        "shape:NAME) and print a summary.")
    q.add_argument("model")
    add_runtime_options(q)
    q.set_defaults(func=_info)

    q = msub.add_parser("generate", help="greedy or sampled continuation of a prompt",
                        description="Load a model and continue a prompt.")
    q.add_argument("model")
    q.add_argument("--prompt", default="", help="text to continue (empty: start from BOS)")
    q.add_argument("--max-new-tokens", type=SIZE, default=64)
    q.add_argument("--temperature", type=float, default=0.0, help="0 means greedy")
    add_runtime_options(q)
    add_option_config(q)
    q.set_defaults(func=_generate)

    q = msub.add_parser("build-tiny", help="save a random-initialised tiny Llama/Qwen2/Qwen3",
                        description="Build a random-initialised model and save it as an HF folder "
                        "(weights only; pair it with a tokenizer of the same vocabulary size).")
    q.add_argument("arch", choices=("llama", "qwen2", "qwen3"))
    q.add_argument("out_dir")
    q.add_argument("--vocab-size", type=SIZE, default=1024)
    q.add_argument("--hidden-size", type=SIZE, default=128)
    q.add_argument("--num-layers", type=SIZE, default=4)
    q.add_argument("--num-heads", type=SIZE, default=4)
    q.add_argument("--num-kv-heads", type=SIZE, default=None)
    q.add_argument("--seed", type=SEED, default=0)
    add_overwrite_option(q, "out_dir")
    add_option_config(q)
    q.set_defaults(func=_build_tiny)


def _import_llama2c(args) -> int:
    from plasticlm.models import import_llama2c
    from plasticlm.runs import atomic_folder

    with atomic_folder(args.out_dir) as tmp:   # marked; nothing left when the import fails
        import_llama2c(args.model_bin, args.tokenizer_bin, tmp)
    out = args.out_dir
    print(f"wrote {out} (load with AutoModelForCausalLM/AutoTokenizer.from_pretrained)")
    return 0


def _info(args) -> int:
    from plasticlm.models import describe, load_causal_lm
    from plasticlm.models.specs import resolve_model

    model, _ = load_causal_lm(resolve_model(args.model))
    print(json.dumps(describe(model), indent=2))
    return 0


def _generate(args) -> int:
    import torch

    from plasticlm.errors import PlasticError
    from plasticlm.eval import decodable_only
    from plasticlm.models import load_causal_lm

    if args.max_new_tokens < 1:
        raise PlasticError(f"--max-new-tokens must be >= 1, not {args.max_new_tokens}")
    if not math.isfinite(args.temperature) or args.temperature < 0:
        raise PlasticError(f"--temperature must be a number >= 0 (0: greedy), not "
                           f"{args.temperature}")
    from plasticlm.models.specs import resolve_model

    model, tok = load_causal_lm(resolve_model(args.model))
    ids = tok(args.prompt).input_ids if args.prompt else []
    if not ids or ids[0] != tok.bos_token_id:
        ids = [tok.bos_token_id, *ids] if tok.bos_token_id is not None else ids
    sample = args.temperature > 0
    out = model.generate(torch.tensor([ids], device=model.device),
                         max_new_tokens=args.max_new_tokens,
                         do_sample=sample, temperature=args.temperature if sample else None,
                         top_p=None, top_k=None, pad_token_id=tok.pad_token_id,
                         logits_processor=decodable_only(tok))
    print(tok.decode(out[0], skip_special_tokens=True))
    return 0


def _build_tiny(args) -> int:
    from plasticlm.models import build_tiny, describe
    from plasticlm.runs import atomic_folder

    model = build_tiny(args.arch, seed=args.seed, vocab_size=args.vocab_size,
                       hidden_size=args.hidden_size, num_layers=args.num_layers,
                       num_heads=args.num_heads, num_kv_heads=args.num_kv_heads)
    with atomic_folder(args.out_dir) as tmp:
        model.save_pretrained(tmp)
    print(json.dumps(describe(model)), "->", args.out_dir)
    return 0
