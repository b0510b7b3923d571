"""Output folders that never destroy a user's files: every folder plasticlm writes holds a
marker (``.plasticlm``, a small JSON: kind, created, version); a command refuses, with one
line, to delete, replace or write into a non-empty folder without one.

``--overwrite`` (``overwrite_allowed``) lets a command add its files to a non-empty unmarked
folder, never remove or replace one there: it is refused when the folder already holds a
name plasticlm writes (``OWN_NAMES``), and the names it held are kept by every later clear.

A folder inside a marked one is plasticlm's too (round folders, checkpoints, fusers). A run
folder from before the marker (``config.json`` beside one of ``LEGACY_RUN_FILES``) is
accepted and marked; a Hugging Face model folder (``config.json`` and weights) is not.

>>> prepare_output("runs/demo", "run", fresh=True)   # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import contextvars
import fnmatch
import json
import logging
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

from plasticlm import __version__
from plasticlm.errors import PlasticError

MARKER = ".plasticlm"
KINDS = ("run", "experiment", "report", "model", "fuser", "registry", "data", "checkpoint",
         "tensorboard")
# Files a run of an older plasticlm left beside its config.json (a Hugging Face model folder
# holds none of them).
LEGACY_RUN_FILES = ("metrics.jsonl", "checkpoint.json", "summary.json", "result.json",
                    "results.json", "stop-requested")
# Names (globs) plasticlm writes at the top of an output folder: --overwrite never adds to a
# folder that already holds one, so that nothing of the user's is replaced.
OWN_NAMES = ("*.json", "*.jsonl", "*.md", "*.html", "*.png", "*.safetensors", "*.bin",
             "*.txt", "*.model", "*.log", "*.partial", "round_*", "final", "fusers", "clients",
             "consolidated", "checkpoint", "report", "tensorboard", "seed-*", "meta_*",
             "taught", "corpus", "mmlu", "specialist_mmlu", "squad", "longbench", "tokenizers")
_OVERWRITE = contextvars.ContextVar("plasticlm_overwrite", default=False)
log = logging.getLogger(__name__)


@contextlib.contextmanager
def overwrite_allowed(allowed: bool = True) -> Iterator[None]:
    """Within the block, non-empty unmarked folders may be added to (the CLI's
    ``--overwrite``); they are still never removed."""
    token = _OVERWRITE.set(bool(allowed))
    try:
        yield
    finally:
        _OVERWRITE.reset(token)


def read_marker(folder: str | Path) -> dict | None:
    """The marker of ``folder`` (None when it has none or it is not one of ours)."""
    path = Path(folder) / MARKER
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("kind") in KINDS else None


def _legacy_run(folder: Path) -> bool:
    return (folder / "config.json").is_file() and any(
        (folder / name).exists() for name in LEGACY_RUN_FILES)


def cache_root() -> Path:
    """``$PLASTICLM_HOME`` or ``~/.cache/plasticlm`` (not created here)."""
    home = os.environ.get("PLASTICLM_HOME")
    return Path(home) if home else Path.home() / ".cache" / "plasticlm"


def _in_cache(folder: Path) -> bool:
    """The cache is plasticlm's own home: its sandbox models predate the markers."""
    try:
        return folder.resolve().is_relative_to(cache_root().resolve())
    except OSError:
        return False


def _state(folder: Path) -> str:
    """absent | file | empty | ours | legacy | foreign."""
    if not folder.exists() and not folder.is_symlink():
        return "absent"
    if not folder.is_dir() or folder.is_symlink():
        return "file"
    if read_marker(folder) is not None or _in_cache(folder):
        return "ours"
    parent = read_marker(folder.parent)   # a folder inside a marked one is plasticlm's
    if parent is not None and folder.name not in parent.get("kept", []):
        return "ours"
    if not any(folder.iterdir()):
        return "empty"
    return "legacy" if _legacy_run(folder) else "foreign"


def _collisions(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()
                  if any(fnmatch.fnmatch(p.name, g) for g in OWN_NAMES))


def check_output(folder: str | Path, hint: str = "choose another output folder") -> str:
    """Refuse (``PlasticError``, one line ending with ``hint``) when a command may not write
    ``folder``; writes nothing. Returns its state (absent, empty, ours, legacy, foreign)."""
    folder = Path(folder)
    state = _state(folder)
    if state == "file":
        raise PlasticError(f"{folder} exists and is not a folder; nothing was written: {hint}")
    if state == "foreign":
        if not _OVERWRITE.get():
            raise PlasticError(f"{folder} is not empty and was not written by plasticlm (no "
                               f"{MARKER} marker); nothing was removed or written: {hint}, or "
                               "pass --overwrite to add files to it")
        clash = _collisions(folder)
        if clash:
            raise PlasticError(f"{folder} was not written by plasticlm and holds "
                               f"{', '.join(clash[:3])}, which --overwrite would replace; "
                               f"nothing was written: {hint}")
    return state


def _write_marker(folder: Path, kind: str, kept: list[str]) -> None:
    marker = {"kind": kind, "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
              "version": __version__}
    if kept:
        marker["kept"] = kept   # the user's files --overwrite added to: never removed
    tmp = folder / (MARKER + ".partial")
    tmp.write_text(json.dumps(marker) + "\n")
    tmp.replace(folder / MARKER)


def prepare_output(folder: str | Path, kind: str, *, fresh: bool = False,
                   hint: str = "choose another output folder") -> Path:
    """Make ``folder`` a marked output folder of ``kind`` (created with its parents when
    absent). ``fresh``: empty a marked folder first (what an earlier plasticlm run left;
    never a name it ``kept``). Refuses as :func:`check_output` does."""
    if kind not in KINDS:
        raise ValueError(f"unknown output kind {kind!r}")
    folder = Path(folder)
    state = check_output(folder, hint)
    marker = read_marker(folder) or {}
    kept = list(marker.get("kept", []))
    if state == "legacy":
        log.info("%s: a run folder from before output markers; marking it", folder)
    if state == "foreign":
        kept = sorted(p.name for p in folder.iterdir())
    if fresh and state in ("ours", "legacy"):
        for entry in folder.iterdir():
            if entry.name in kept or entry.name == MARKER:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    folder.mkdir(parents=True, exist_ok=True)
    if state != "ours":
        _write_marker(folder, kind, kept)
    return folder


@contextlib.contextmanager
def atomic_output(folder: str | Path, kind: str) -> Iterator[Path]:
    """A fresh marked folder beside ``folder`` to write into; when the block ends without
    error it replaces ``folder`` (a crash never leaves half a model there). A folder without
    a marker is never removed: refused, or with ``--overwrite`` the new files are added."""
    folder = Path(folder)
    state = check_output(folder)
    tmp = folder.with_name(folder.name + ".partial")
    if _state(tmp) not in ("absent", "empty", "ours"):
        raise PlasticError(f"{tmp} exists and was not written by plasticlm; nothing was "
                           "written: move it or choose another output folder")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    _write_marker(tmp, kind, [])
    try:
        yield tmp
    except BaseException:   # an error, not a kill: nothing half-written is left behind
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    kept = sorted(p.name for p in folder.iterdir()) if state == "foreign" else \
        list((read_marker(folder) or {}).get("kept", []))
    if not kept:
        shutil.rmtree(folder, ignore_errors=True)
        tmp.rename(folder)
        return
    # --overwrite: add, never replace (the user's names cannot clash: check_output)
    for entry in tmp.iterdir():
        dest = folder / entry.name
        if dest.is_dir() and not dest.is_symlink():
            shutil.rmtree(dest)
        entry.replace(dest)
    tmp.rmdir()
    _write_marker(folder, kind, kept)
