"""The ``plasticlm`` command line: one module per subcommand, each with ``register(sub)``."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import sys
from importlib import metadata

from pydantic import ValidationError

from plasticlm import __version__, cpu
from plasticlm.cli.options import THREADS, option_tokens
from plasticlm.config import refusal
from plasticlm.env import THREADS_ENV
from plasticlm.errors import PlasticError, Stopped, clip
from plasticlm.outputs import check_output, overwrite_allowed

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
    parser.add_argument("--log-level", default="INFO",
                        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                        help="level of plasticlm's progress and status messages on stderr "
                        "(default INFO; WARNING keeps only problems); results go to stdout")
    parser.add_argument("--threads", dest="global_threads", type=THREADS, default=None, metavar="N",
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


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record comes (the log-line wrapper below,
    a test's capture), not to the stream of the moment it was made."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        pass


_HANDLER = _StderrHandler()
_HANDLER.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s",
                                        datefmt="%H:%M:%S"))


def setup_logging(level: str) -> None:
    """The one logging set-up: the ``plasticlm`` logger (every module logs to a child of it)
    at ``level`` on stderr, timestamped; stdout keeps the results."""
    logger = logging.getLogger("plasticlm")
    logger.setLevel(level)
    if _HANDLER not in logger.handlers:
        logger.addHandler(_HANDLER)


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
    # the command pins the float path before anything imports torch (a library import does
    # not change process-wide settings)
    cpu.configure()
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


def parse(argv: list[str]) -> argparse.Namespace:
    """The command's arguments as it runs them: parsed (``--help`` and ``--version`` exit
    here, before torch loads), ``--config``/``--set`` of a command whose settings are its
    options parsed again with the rest, and ``--quick`` outputs moved beside the full run's."""
    parser = build_parser()
    args = parser.parse_args(argv)
    extra = option_tokens(args, argv) if hasattr(args, "option_parser") else []
    if extra:
        argv = [*argv, *extra]
        args = parser.parse_args(argv)
    _quick_outputs(args, argv)
    return args


def _run(argv: list[str] | None) -> int:
    try:
        args = parse(sys.argv[1:] if argv is None else list(argv))
    except PlasticError as e:
        return _refused(e)
    setup_logging(args.log_level)
    # heavy: imported when the command runs, not when the parser is built
    from plasticlm.runtime import threads

    try:
        # the thread policy and, for commands that load models, their device and dtype:
        # set once here for the whole command (plasticlm.runtime)
        with threads(args.global_threads), _runtime(args), \
                overwrite_allowed(getattr(args, "overwrite", False)):
            for dest in getattr(args, "output_args", ()):   # refused before any work
                if getattr(args, dest, None) == "":   # the working folder, by mistake
                    raise PlasticError(f"{_flag(args, dest)} is empty; give a folder")
                if getattr(args, dest, None) is not None:
                    check_output(getattr(args, dest), f"give another {_flag(args, dest)}")
            return args.func(args) or 0
    except Stopped as e:
        print(f"plasticlm: {_one_line(e)}", file=sys.stderr)
        return e.status
    except PlasticError as e:
        return _refused(e)
    except ValidationError as e:   # a config built in code from the command's values
        return _refused(refusal(e, object))
    except TimeoutError:   # a caller's deadline (a test's alarm), not the system's refusal
        raise
    except OSError as e:   # the system refused: a read-only folder, a full disk, /proc
        where = f" ({clip(e.filename)})" if e.filename else ""
        return _refused(f"{e.strerror or e}{where}: plasticlm could not read or write there; "
                        "give a folder it may write (or PLASTICLM_HOME for the cache)")
    except KeyboardInterrupt:
        print("plasticlm: interrupted", file=sys.stderr)
        return 130


def _one_line(message: object) -> str:
    """A refusal as one line of at most 2,000 characters: a name the user gave
    (newlines, NUL, 100,000 characters) is escaped and cut, never printed whole."""
    return clip(message, 2000)


def _refused(message: object) -> int:
    print(f"plasticlm: error: {_one_line(message)}", file=sys.stderr)
    return 2


def _quick_outputs(args, argv: list[str]) -> None:
    """A ``--quick`` run writes beside the full run's folder, never into it: an output folder
    left at its ``runs/...`` default gains ``-quick`` (``runs/demo`` -> ``runs/demo-quick``)."""
    if not getattr(args, "quick", False):
        return
    given = {a.split("=")[0] for a in argv if a.startswith("--")}
    for dest in getattr(args, "output_args", ()):
        value = getattr(args, dest, None)
        if isinstance(value, str) and value.startswith("runs/") and \
                "--" + dest.replace("_", "-") not in given:
            setattr(args, dest, value + "-quick")


def _flag(args, dest: str) -> str:
    return dest.upper() if dest.endswith("_dir") else "--" + dest


def _runtime(args):
    """The device and dtype of a command that loads models (``add_runtime_options``)."""
    if not hasattr(args, "device"):  # the command loads no model
        return contextlib.nullcontext()
    # heavy: imported when the command runs, not when the parser is built
    from plasticlm.runtime import runtime

    return runtime(args.device, getattr(args, "dtype", None))


if __name__ == "__main__":
    sys.exit(main())
