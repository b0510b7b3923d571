"""The cache home, ``$PLASTICLM_HOME`` (default ``~/.cache/plasticlm``): where sandbox and
real-shape models and their worlds are kept. Checked once where it is read: a relative path
(it would move with the working folder), ``/``, the user's home folder itself, a path that
is not a folder, or a folder of another user or that others may write to (``/tmp``) is
refused in one line; ``~`` is expanded. Nothing in it is trusted for being
there: plasticlm writes only into folders that carry its marker (``plasticlm.outputs``)."""

from __future__ import annotations

import os
from pathlib import Path

from plasticlm.errors import PlasticError, clip

HOME_ENV = "PLASTICLM_HOME"


def _refuse(raw: str, why: str) -> PlasticError:
    return PlasticError(f"{HOME_ENV}={clip(raw)!s} {why}; give an absolute folder of plasticlm's "
                        "own (e.g. ~/.cache/plasticlm), or unset it")


def cache_root() -> Path:
    """The checked cache home (not created here)."""
    raw = os.environ.get(HOME_ENV, "")
    if not raw:
        return Path.home() / ".cache" / "plasticlm"
    if "\0" in raw:
        raise _refuse(raw, "holds a NUL character")
    path = Path(raw).expanduser()   # '~/x' is the user's ~/x, never a folder named '~'
    if not path.is_absolute():
        raise _refuse(raw, "is a relative path (the cache would move with the working folder)")
    try:
        resolved, user_home = path.resolve(), Path.home().resolve()
        is_other = path.exists() and not path.is_dir()
    except (OSError, RuntimeError) as e:
        raise _refuse(raw, f"cannot be used ({getattr(e, 'strerror', None) or e})") from None
    if resolved == Path(resolved.anchor) or resolved == user_home:
        raise _refuse(raw, "is / or your home folder: the cache would hold your own files")
    if is_other:
        raise _refuse(raw, "exists and is not a folder")
    if path.exists():
        st = resolved.stat()
        # another user could plant models, worlds and manifests in a shared folder (/tmp)
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise _refuse(raw, "is not a folder of yours that only you may write to (owner "
                          f"uid {st.st_uid}, mode {st.st_mode & 0o777:o})")
    return path


def cache_home() -> Path:
    """The cache home, created when absent; a home that cannot be created (read-only, no
    space) is refused in one line."""
    path = cache_root()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise PlasticError(f"cannot create the cache home {clip(path)} ({e.strerror}); set "
                           f"{HOME_ENV} to a writable folder") from None
    return path
