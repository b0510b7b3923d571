"""Taught models shipped with plasticlm: the sandbox oracle (the receiver taught every
specialist fact, 500 drills, about 2.5 min on 2 cores) kept in the package beside a manifest
of SHA-256 hashes, the teaching key, the hash of the base model it was taught from and the
command and versions that produced it.

:func:`plasticlm.experiments.refine.taught.taught_peer` takes the shipped copy instead of teaching when
the teaching key (spec, facts, drill settings) and the base model's weights are the ones it
was taught from; every file is checked against the manifest first, and a differing file is
refused with what to do. ``plasticlm refine experiment ladder --set shipped_taught=false
--ship-oracle`` teaches the oracle and writes a new shipped copy (maintainers).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from plasticlm.errors import PlasticError
from plasticlm.runs import atomic_folder, write_text_atomic
from plasticlm.sandbox.shipped import (
    MANIFEST,
    mismatches,
    read_manifest,
    sha256,
    shipping_facts,
    summarise_mismatches,
)

SHIPPED_TAUGHT = Path(__file__).parent / "shipped"
_SKIPPED = (".plasticlm", MANIFEST)


def weights_sha256(model_folder: Path) -> str | None:
    """The SHA-256 of a local model folder's ``model.safetensors`` (None: no such file)."""
    path = Path(model_folder) / "model.safetensors"
    return sha256(path) if path.is_file() else None


def _checked_manifest(folder: Path) -> dict:
    """``folder``'s manifest, refused in one line unless it names the key, the base weights'
    hash and plain file names including ``taught.json`` and ``model.safetensors``."""
    try:
        manifest = read_manifest(folder)
    except (OSError, ValueError) as e:
        raise PlasticError(f"the shipped taught model's manifest in {folder} is unreadable: "
                           f"{e}") from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if (not isinstance(files, dict) or not {"taught.json", "model.safetensors"} <= set(files)
            or any(Path(rel).name != rel or rel in ("", ".", "..") for rel in files)
            or not all(isinstance(manifest.get(k), str) for k in ("key", "base_sha256"))):
        raise PlasticError(f"the shipped taught model's manifest in {folder} is malformed (it "
                           "needs key, base_sha256 and plain file names with taught.json and "
                           f"model.safetensors); restore it with `git checkout -- {folder}`")
    return manifest


def shipped_taught(name: str, key: str, base_folder: Path,
                   root: Path | None = None) -> Path | None:
    """The shipped folder of taught model ``name`` when it was taught with ``key`` from the
    weights in ``base_folder`` (hashed only when a manifest with that key exists); None
    otherwise. Refused when the manifest is malformed or a file differs from its hash."""
    folder = (root or SHIPPED_TAUGHT) / name
    if not (folder / MANIFEST).is_file():
        return None
    manifest = _checked_manifest(folder)
    if manifest["key"] != key or manifest["base_sha256"] != weights_sha256(base_folder):
        return None
    bad = mismatches(folder, manifest)
    if bad:
        raise PlasticError(f"the shipped taught model in {folder} does not match its manifest: "
                           f"{summarise_mismatches(bad)}; restore the repository's copy (`git checkout -- "
                           f"{folder}`) or delete the folder to teach it again")
    return folder


def copy_shipped(folder: Path, dest: Path) -> None:
    """Copy a checked shipped taught model into ``dest`` (a run's ``taught/NAME``) at once
    (a crash leaves the old folder or the whole copy), its ``taught.json`` saying it is the
    shipped copy."""
    manifest = _checked_manifest(folder)
    with atomic_folder(dest) as tmp:
        for rel in manifest["files"]:
            shutil.copyfile(folder / rel, tmp / rel)
        stamp = json.loads((tmp / "taught.json").read_text())
        (tmp / "taught.json").write_text(json.dumps({**stamp, "shipped": True}) + "\n")


def in_source_checkout() -> bool:
    """Whether the shipped folder lies in a source checkout (``src/plasticlm/refine``
    beside a ``pyproject.toml``), where writing a new shipped copy is a maintainer's change
    and not an edit of an installed package."""
    src = SHIPPED_TAUGHT.parents[2]
    return src.name == "src" and (src.parent / "pyproject.toml").is_file()


def write_shipped_taught(source: Path, base_sha256: str, command: str,
                         root: Path | None = None) -> Path:
    """Copy a run's taught model folder ``source`` (``taught/NAME``, its ``taught.json``
    holding the key) into ``root/NAME`` with its manifest; returns that folder."""
    stamp = source / "taught.json"
    if not stamp.is_file() or not (source / "model.safetensors").is_file():
        raise PlasticError(f"{source} holds no taught model (taught.json and "
                           "model.safetensors)")
    if json.loads(stamp.read_text()).get("shipped"):
        raise PlasticError(f"{source} is a copy of the shipped model, not taught here: run "
                           "again with --set shipped_taught=false and another --out")
    dest = (root or SHIPPED_TAUGHT) / source.name
    if dest.exists():
        shutil.rmtree(dest)   # the package's own copy, written only by this function
    dest.mkdir(parents=True)
    manifest = {"name": source.name, "key": json.loads(stamp.read_text())["key"],
                "base_sha256": base_sha256, "command": command,
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                **shipping_facts(), "files": {}}
    for path in sorted(p for p in source.iterdir() if p.is_file() and p.name not in _SKIPPED):
        shutil.copyfile(path, dest / path.name)
        manifest["files"][path.name] = {"sha256": sha256(path), "bytes": path.stat().st_size}
    write_text_atomic(dest / MANIFEST, json.dumps(manifest, indent=1) + "\n")
    return dest
