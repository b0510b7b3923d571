"""Output folders that never destroy a user's files: every folder plasticlm writes holds a
marker (``.plasticlm``, a small JSON: kind, created, version); a command refuses, with one
line, to delete, replace or write into a non-empty folder without one.

``--overwrite`` (``overwrite_allowed``) lets a command add its files to a non-empty unmarked
folder, never remove or replace one there: it is refused when the folder already holds a
name plasticlm writes (``OWN_NAMES``), and the names it held are kept by every later clear.

A marker covers only the names plasticlm creates in its folder: a subfolder is plasticlm's
when it carries its own marker or bears one of those names (``OWN_NAMES``: round folders,
checkpoints, fusers); any other subfolder (a user's ``newdata/``) is neither cleared nor
replaced, and is judged by its own contents when given as an output. A marked folder of
another kind (a run folder given to ``build-tiny``) is refused. Nothing is trusted for lying
in the cache home. A run folder from before the marker (``config.json`` beside one of
``LEGACY_RUN_FILES``) is accepted and marked; a Hugging Face model folder (``config.json``
and weights) is not. No marker or folder is written through a symbolic link.

>>> prepare_output("runs/demo", "run", fresh=True)   # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import contextvars
import fnmatch
import json
import logging
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

from plasticlm import __version__
from plasticlm.errors import PlasticError, clip
from plasticlm.nofollow import write_text

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
             "taught", "corpus", "mmlu", "specialist_mmlu", "squad", "longbench", "tokenizers",
             "server-done", "stop-requested", "*.pem", "*.key", "*.crt", "*.secret", "*.pt",
             "flwr_home", "certs", "keys", "world", "reference", "pretrained", "drills",
             "*.ckpt", "train", "test", "meta", "fednl", "refine", "scol", "memory", "stream",
             "comm", "openbook", "niah")
# Kinds one folder may be prepared as: an experiment folder holds its run's files, and the
# reverse; any other pair is refused (a model never replaces a run's checkpoints).
_SAME_KIND = ({"run", "experiment"},)
_OVERWRITE = contextvars.ContextVar("plasticlm_overwrite", default=False)
log = logging.getLogger(__name__)


NAME_MAX_BYTES = 255   # a folder name's limit on Linux and macOS file systems


def check_folder_name(name: str, what: str = "name") -> str:
    """Refuse, in one line, a name that cannot be one folder: empty, '.' or '..', a '/' or
    '\\', a control character (NUL, newline) or longer than a file system allows."""
    size = len(name.encode("utf-8", "surrogatepass"))
    if name.strip(". ") == "" or any(c in name for c in "/\\") or not name.isprintable() or \
            size > NAME_MAX_BYTES:
        raise PlasticError(f"{what} {clip(repr(name))} must be a folder name: not empty, no '/', "
                           f"no control character, at most {NAME_MAX_BYTES} bytes (it has "
                           f"{size})")
    return name


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


def _state(folder: Path) -> str:
    """absent | file | empty | ours | legacy | foreign."""
    if not folder.exists() and not folder.is_symlink():
        return "absent"
    if not folder.is_dir() or folder.is_symlink():
        return "file"
    if read_marker(folder) is not None or _made_inside(folder):
        return "ours"
    if not any(folder.iterdir()):
        return "empty"
    return "legacy" if _legacy_run(folder) else "foreign"


def _own_name(name: str) -> bool:
    return any(fnmatch.fnmatch(name, g) for g in OWN_NAMES)


def _made_inside(folder: Path) -> bool:
    """A subfolder plasticlm made inside a marked folder: one of the names it creates there
    (a marker covers nothing else), not one the user had there before (``kept``)."""
    parent = read_marker(folder.parent)
    return parent is not None and _own_name(folder.name) and \
        folder.name not in parent.get("kept", [])


def _users(entry: Path, kept: list[str]) -> bool:
    """Whether ``entry`` of a marked folder is the user's (never cleared or replaced): a name
    kept by ``--overwrite``, a subfolder plasticlm neither marked nor names, or a file of a
    name plasticlm never writes (a user's ``analysis.csv`` beside a run's files)."""
    if entry.name in kept:
        return True
    if entry.name.startswith(MARKER):     # the marker, its temporary, the run's lock
        return False
    if entry.is_dir() and not entry.is_symlink():
        return not _own_name(entry.name) and read_marker(entry) is None
    return not _own_name(entry.name)


def _check_kind(folder: Path, kind: str, hint: str) -> None:
    have = (read_marker(folder) or {}).get("kind")
    if have not in (None, kind) and not any({have, kind} <= s for s in _SAME_KIND):
        raise PlasticError(f"{clip(folder)} holds plasticlm's {have} files, not a {kind}: "
                           f"nothing was removed or written: {hint}")


def _collisions(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if _own_name(p.name))


def check_output(folder: str | Path, hint: str = "choose another output folder") -> str:
    """Refuse (``PlasticError``, one line ending with ``hint``) when a command may not write
    ``folder``; writes nothing. Returns its state (absent, empty, ours, legacy, foreign)."""
    folder = Path(folder)
    try:
        state = _state(folder)
    except (OSError, ValueError) as e:   # a name too long, a NUL byte, a folder unreadable
        raise PlasticError(f"{clip(folder)} cannot be used as an output folder "
                           f"({getattr(e, 'strerror', None) or e}); nothing was written: "
                           f"{hint}") from None
    if state == "file":
        raise PlasticError(f"{clip(folder)} exists and is not a folder; nothing was written: "
                           f"{hint}")
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
    write_text(tmp, json.dumps(marker) + "\n")   # never through a link planted there
    tmp.replace(folder / MARKER)


def _mkdir(folder: Path, hint: str) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (OSError, ValueError) as e:   # read-only, /proc, a file on the way, a NUL byte
        raise PlasticError(f"cannot create the output folder {clip(folder)} "
                           f"({getattr(e, 'strerror', None) or e}); nothing was written: "
                           f"{hint}") from None


def prepare_output(folder: str | Path, kind: str, *, fresh: bool = False,
                   hint: str = "choose another output folder") -> Path:
    """Make ``folder`` a marked output folder of ``kind`` (created with its parents when
    absent). ``fresh``: empty a marked folder first (what an earlier plasticlm run left;
    never a name it ``kept`` nor a subfolder of the user's). Refuses as :func:`check_output`
    does, and a folder marked as another kind."""
    if kind not in KINDS:
        raise ValueError(f"unknown output kind {kind!r}")
    folder = Path(folder)
    state = check_output(folder, hint)
    _check_kind(folder, kind, hint)
    kept = list((read_marker(folder) or {}).get("kept", []))
    if state == "legacy":
        log.info("%s: a run folder from before output markers; marking it", folder)
    if state == "foreign":
        kept = sorted(p.name for p in folder.iterdir())
    if fresh and state in ("ours", "legacy"):
        for entry in folder.iterdir():
            if entry.name == MARKER or _users(entry, kept):
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    _mkdir(folder, hint)
    if read_marker(folder) is None:   # its own, also inside a marked folder
        _write_marker(folder, kind, kept)
    return folder


@contextlib.contextmanager
def atomic_output(folder: str | Path, kind: str) -> Iterator[Path]:
    """A fresh marked folder beside ``folder`` to write into; when the block ends without
    error it replaces ``folder`` (a crash never leaves half a model there). A folder without
    a marker is never removed: refused, or with ``--overwrite`` the new files are added; a
    subfolder of the user's in a marked folder stays."""
    folder = Path(folder)
    hint = "choose another output folder"
    state = check_output(folder)
    _check_kind(folder, kind, hint)
    tmp = folder.with_name(folder.name + ".partial")
    if _state(tmp) not in ("absent", "empty", "ours"):
        raise PlasticError(f"{clip(tmp)} exists and was not written by plasticlm; nothing "
                           "was written: move it or choose another output folder")
    shutil.rmtree(tmp, ignore_errors=True)
    _mkdir(tmp, hint)
    _write_marker(tmp, kind, [])
    try:
        yield tmp
    except BaseException:   # an error, not a kill: nothing half-written is left behind
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if state == "foreign":
        kept = sorted(p.name for p in folder.iterdir())
    else:
        marked = list((read_marker(folder) or {}).get("kept", []))
        kept = sorted(p.name for p in folder.iterdir() if _users(p, marked)) \
            if state == "ours" else []
    if not kept:
        shutil.rmtree(folder, ignore_errors=True)
        tmp.rename(folder)
        return
    # add, never replace the user's (their names cannot clash: check_output, _users)
    for entry in tmp.iterdir():
        dest = folder / entry.name
        if dest.is_dir() and not dest.is_symlink():
            shutil.rmtree(dest)
        entry.replace(dest)
    tmp.rmdir()
    _write_marker(folder, kind, kept)
