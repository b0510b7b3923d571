"""Writing without following a symbolic link: every file plasticlm creates or replaces is
opened with ``O_NOFOLLOW``, and every folder it creates under a root it owns (the cache home,
an output folder) is checked component by component, so that a link planted there never
redirects a write onto a user's file (``plasticlm.outputs``, the shipped-family installer)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from plasticlm.errors import PlasticError, clip

_WRITE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC


def _refuse_link(path: Path) -> PlasticError:
    return PlasticError(f"{clip(path)} is a symbolic link: plasticlm never writes through one "
                        "(it could land on another file); remove the link or choose another "
                        "folder")


def check_no_links(path: str | Path, root: str | Path | None = None) -> Path:
    """``path`` itself and each of its components below ``root`` (exclusive; ``root`` is the
    caller's to trust) that exist must not be symbolic links; returns ``path``."""
    path = Path(path)
    stop = Path(root) if root is not None else path.parent
    below = [path, *path.parents]
    for part in below:
        if part == stop or part in stop.parents:
            break
        if part.is_symlink():
            raise _refuse_link(part)
    return path


def make_dirs(path: str | Path, root: str | Path) -> Path:
    """Create ``path`` and its missing parents below ``root``, refusing a symbolic link at any
    component below ``root``."""
    path = Path(path)
    check_no_links(path, root)
    path.mkdir(parents=True, exist_ok=True)
    return check_no_links(path, root)   # a link swapped in meanwhile


def open_for_write(path: str | Path, append: bool = False) -> int:
    """A descriptor of ``path`` opened for writing (truncated, or appended to), refused when
    ``path`` is a symbolic link."""
    flags = (_WRITE & ~os.O_TRUNC) | os.O_APPEND if append else _WRITE
    try:
        return os.open(path, flags, 0o644)
    except OSError as e:
        if Path(path).is_symlink():
            raise _refuse_link(Path(path)) from None
        raise e


def write_bytes(path: str | Path, data: bytes, append: bool = False) -> Path:
    """Write (or append) ``data`` to ``path`` without following a link there."""
    with os.fdopen(open_for_write(path, append), "wb") as f:
        f.write(data)
    return Path(path)


def write_text(path: str | Path, text: str, append: bool = False) -> Path:
    return write_bytes(path, text.encode("utf-8"), append)


def copy_file(src: str | Path, dst: str | Path) -> Path:
    """Copy ``src`` onto ``dst`` without following a link at ``dst``."""
    with open(src, "rb") as fin, os.fdopen(open_for_write(dst), "wb") as fout:
        shutil.copyfileobj(fin, fout, 1 << 20)
    return Path(dst)
