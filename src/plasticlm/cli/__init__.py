"""The ``plasticlm`` command line: one module per subcommand, each with ``register(sub)``."""

from __future__ import annotations

import argparse
import importlib
import sys

from plasticlm.errors import PlasticError

# Subcommands, in the order --help lists them; each module defines register(subparsers).
COMMANDS = ("demo", "models", "data", "memory", "fednl", "refine", "scol")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="plasticlm",
        description="LLMs that keep learning after pre-training: FedNL, FedRefine and SCoL "
        "on Hugging Face checkpoints or on a generated sandbox world.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"plasticlm.cli.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except PlasticError as e:
        print(f"plasticlm: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("plasticlm: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
