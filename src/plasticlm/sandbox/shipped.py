"""The sandbox family shipped with plasticlm: the files of a pre-trained preset folder, kept in
the package beside a manifest of their SHA-256 hashes and of the command and versions that
produced them.

A fresh clone then has the family at once: :func:`install_shipped` checks every hash and
copies the files into the cache (``preset_dir``), where the rest of plasticlm finds them as if
pre-trained there: into marked folders only, never through a symbolic link, each manifest
checked as outside input (``read_manifest``); :func:`verify_installed` re-checks the installed copy when the family is
loaded (once per process while its files keep their size and mtime). ``plasticlm models pretrain --preset sandbox --ship`` rebuilds the family and
writes a new shipped copy (``write_shipped``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import platform
import shutil
import sys
import time
from importlib import metadata
from pathlib import Path

from plasticlm.errors import PlasticError, clip
from plasticlm.home import cache_root
from plasticlm.nofollow import check_no_links, copy_file, make_dirs
from plasticlm.outputs import prepare_output
from plasticlm.runs import write_text_atomic

log = logging.getLogger("plasticlm.sandbox")

SHIPPED_ROOT = Path(__file__).parent / "family"
MANIFEST = "manifest.json"
# what a preset folder holds besides the family itself: resumable checkpoints, half-written
# files and plasticlm's folder markers are not part of what is shipped
_SKIP_PARTS = ("checkpoint", ".partial", ".plasticlm", ".tmp")
_VERSIONED = ("torch", "transformers", "tokenizers", "safetensors", "plasticlm")


def shipped_dir(preset: str) -> Path:
    return SHIPPED_ROOT / preset


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _family_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name != MANIFEST
                  and not any(s in part for part in p.relative_to(root).parts
                              for s in _SKIP_PARTS))


def _plain(rel: object) -> bool:
    """A manifest's file name: a relative path inside its folder (no '..', no absolute path,
    no control character)."""
    if not isinstance(rel, str) or not rel or not rel.isprintable() or "\\" in rel:
        return False
    parts = Path(rel).parts
    return not Path(rel).is_absolute() and all(p not in ("", ".", "..") for p in parts)


def _entry(want: object) -> bool:
    return isinstance(want, dict) and isinstance(want.get("sha256"), str) and \
        type(want.get("bytes")) is int and want["bytes"] >= 0


def read_manifest(folder: Path) -> dict | None:
    """``folder``'s manifest (None when it has none), refused in one line when it is not
    JSON or its ``files`` are not plain relative names with a hash and a size each: a
    manifest in the cache is outside input."""
    path = folder / MANIFEST
    if not path.exists():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        raise PlasticError(f"the manifest {clip(path)} is unreadable ({clip(e)}); delete "
                           f"{clip(folder)} to install or rebuild it") from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not all(_plain(r) and _entry(w) for r, w in files.items()):
        raise PlasticError(f"the manifest {clip(path)} is malformed (it needs 'files': plain "
                           f"relative names, each with sha256 and bytes); delete "
                           f"{clip(folder)} to install or rebuild it")
    return manifest


def mismatches(folder: Path, manifest: dict) -> list[str]:
    """The files of ``manifest`` that are missing from ``folder`` or differ from their hash."""
    bad = []
    for rel, want in manifest["files"].items():
        path = folder / rel
        if not path.is_file():
            bad.append(f"{rel} (missing)")
        elif path.stat().st_size != want["bytes"] or sha256(path) != want["sha256"]:
            bad.append(f"{rel} (sha256 differs)")
    return bad


def summarise_mismatches(bad: list[str]) -> str:
    """The first three of :func:`mismatches`' files, and how many more."""
    return ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")


def _refusal(where: Path, bad: list[str], preset: str, fix: str) -> PlasticError:
    shown = summarise_mismatches(bad)
    return PlasticError(f"the sandbox family in {where} does not match its manifest: {shown}; "
                        f"{fix}, or rebuild it with `plasticlm models pretrain --preset "
                        f"{preset} --force` (about 20 min on 2 cores)")


def shipped_keys(preset: str) -> dict[str, str] | None:
    """Each shipped member's pre-training key (``member_key``), or None without a shipped copy."""
    manifest = read_manifest(shipped_dir(preset))
    return None if manifest is None else manifest["member_keys"]


def install_shipped(preset: str, dest: Path) -> bool:
    """Copy the shipped family of ``preset`` into ``dest`` after checking every file's hash;
    False when there is none. A file that differs from the manifest is refused with what to
    do, before anything is copied. ``dest`` and each folder of a member are marked (a folder
    there that plasticlm did not write is refused), and a symbolic link anywhere below the
    cache home (or ``dest``'s parent outside it) is refused, never written through."""
    src = shipped_dir(preset)
    manifest = read_manifest(src)
    if manifest is None:
        return False
    bad = mismatches(src, manifest)
    if bad:
        raise _refusal(src, bad, preset, "restore the repository's copy (`git checkout -- "
                       "src/plasticlm/sandbox/family`)")
    t0 = time.time()
    home = cache_root()
    root = home if dest.is_relative_to(home) else dest.parent
    hint = f"delete {clip(dest)} to install the shipped family again"
    make_dirs(dest.parent, root)
    prepare_output(check_no_links(dest, root), "model", hint=hint)
    for top in sorted({Path(rel).parts[0] for rel in manifest["files"]
                       if len(Path(rel).parts) > 1}):
        prepare_output(check_no_links(dest / top, dest), "data" if top == "world" else
                       "model", hint=hint)
    for rel in manifest["files"]:
        make_dirs((dest / rel).parent, dest)
        copy_file(src / rel, check_no_links(dest / rel, dest))
    write_text_atomic(dest / MANIFEST, json.dumps(manifest, indent=1) + "\n")
    log.info("installed the shipped sandbox family %r (%d files, %.1f MB, checked against "
             "its SHA-256 manifest) in %s in %.1f s", preset, len(manifest["files"]),
             sum(f["bytes"] for f in manifest["files"].values()) / 1e6, dest, time.time() - t0)
    return True


# the installed families this process has checked, each as _checked_state gave it
_VERIFIED: set[tuple] = set()


def _checked_state(folder: Path, manifest: dict) -> tuple | None:
    """What a check of ``folder`` against ``manifest`` holds for: the resolved folder, the
    manifest's files and each file's size and mtime_ns; None when a file is missing."""
    try:
        stats = tuple((rel, (folder / rel).stat()) for rel in sorted(manifest["files"]))
    except OSError:
        return None
    return (str(folder.resolve()), json.dumps(manifest["files"], sort_keys=True),
            tuple((rel, st.st_size, st.st_mtime_ns) for rel, st in stats))


def verify_installed(preset: str, folder: Path) -> None:
    """Re-check an installed shipped family (a folder holding the manifest) before it is used.

    Once per process while its files are unchanged: a later call with every file's size and
    mtime as at the last passing check hashes nothing; a rewritten file is hashed again."""
    manifest = read_manifest(folder)
    if manifest is None:
        return   # pre-trained on this machine: nothing to check against
    state = _checked_state(folder, manifest)
    if state is not None and state in _VERIFIED:
        return
    bad = mismatches(folder, manifest)
    if bad:
        raise _refusal(folder, bad, preset, f"delete {folder} to install the shipped copy "
                       "again")
    if state is not None and _checked_state(folder, manifest) == state:  # unchanged meanwhile
        _VERIFIED.add(state)


def forget_shipped(folder: Path) -> None:
    """A re-trained family is no longer the shipped one: drop the installed manifest."""
    (folder / MANIFEST).unlink(missing_ok=True)


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def shipping_facts() -> dict:
    """What a manifest records of the machine that wrote a shipped copy: Python, platform and
    the versions of the libraries that made the weights."""
    return {"python": sys.version.split()[0], "platform": platform.platform(),
            "versions": {name: _version(name) for name in _VERSIONED}}


def write_shipped(preset: str, source: Path, member_keys: dict[str, str], command: str,
                  report: dict) -> Path:
    """Copy the pre-trained family in ``source`` into the package (``family/<preset>``) with
    its manifest: each file's SHA-256 and size, each member's pre-training key, the command,
    versions and machine that produced it."""
    dest = shipped_dir(preset)
    files = _family_files(source)
    if not files:
        raise PlasticError(f"{source} holds no pre-trained family to ship")
    if dest.exists():
        shutil.rmtree(dest)   # the package's own copy, written only by this function
    manifest = {
        "preset": preset, "sandbox_version": report.get("sandbox_version"),
        "command": command, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **shipping_facts(),
        "machine": report.get("machine"), "torch_threads": report.get("torch_threads"),
        "pretrain_seconds": report.get("total_seconds"),
        "pretrain_cpu_seconds": report.get("total_cpu_seconds"),
        "member_keys": member_keys, "files": {}}
    for path in files:
        rel = path.relative_to(source).as_posix()
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, dest / rel)
        manifest["files"][rel] = {"sha256": sha256(path), "bytes": path.stat().st_size}
    write_text_atomic(dest / MANIFEST, json.dumps(manifest, indent=1) + "\n")
    return dest
