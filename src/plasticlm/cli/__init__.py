"""The ``plasticlm`` command line: one module per subcommand, each with ``register(sub)``."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from importlib import metadata

from plasticlm import __version__
from plasticlm.errors import PlasticError, Stopped
from plasticlm.runs import THREADS_ENV, threads

# Subcommands, in the order --help lists them; each module defines register(subparsers).
COMMANDS = ("demo", "models", "data", "memory", "fednl", "refine", "scol", "report", "bench")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="plasticlm",
        description="LLMs that keep learning after pre-training: FedNL, FedRefine and SCoL "
        "on Hugging Face checkpoints or on a generated sandbox world.",
    )
    parser.add_argument("--version", action="version",
                        version=f"plasticlm {__version__} (torch {_version('torch')}, "
                        f"transformers {_version('transformers')}, flwr {_version('flwr')})")
    parser.add_argument("--log-level", default="WARNING",
                        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                        help="level of plasticlm's log messages on stderr (default WARNING)")
    parser.add_argument("--threads", dest="global_threads", type=int, default=None, metavar="N",
                        help=f"torch intra-op threads for the whole command (default: "
                        f"${THREADS_ENV}, else every core); use 1 when other jobs share the "
                        "cores. Options of a subcommand (e.g. `memory mqar --threads`) win.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"plasticlm.cli.{name}").register(sub)
    return parser


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


class LogLines:
    """stderr redirected to a log: each progress-bar frame (tqdm redraws a line with a
    carriage return) becomes a line of its own, so the log reads as plain periodic lines."""

    def __init__(self, stream):
        self.stream, self._at_line_start = stream, True

    def write(self, text: str) -> int:
        out = text.replace("\r", "\n")
        if self._at_line_start:
            out = out.lstrip("\n")
        while "\n\n" in out:
            out = out.replace("\n\n", "\n")
        if out:
            self._at_line_start = out.endswith("\n")
            self.stream.write(out)
        return len(text)

    def __getattr__(self, name):
        return getattr(self.stream, name)


def main(argv: list[str] | None = None) -> int:
    stderr = sys.stderr
    if not stderr.isatty() and not isinstance(stderr, LogLines):
        # redirected to a log: a progress line every 30 s (tqdm reads TQDM_* defaults from
        # the environment), each its own line
        os.environ.setdefault("TQDM_MININTERVAL", "30")
        sys.stderr = LogLines(stderr)
    try:
        return _run(argv)
    finally:
        sys.stderr = stderr


def _run(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("plasticlm").setLevel(args.log_level)
    try:
        with threads(args.global_threads):  # the thread policy, set once (plasticlm.runs)
            return args.func(args) or 0
    except Stopped as e:
        print(f"plasticlm: {e}", file=sys.stderr)
        return e.status
    except PlasticError as e:
        print(f"plasticlm: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("plasticlm: interrupted", file=sys.stderr)
        return 130

if __name__ == "__main__":
    sys.exit(main())
