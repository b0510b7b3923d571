"""Taught models shipped with plasticlm: the sandbox oracle (the receiver taught every
specialist fact, 500 drills, about 2.5 min on 2 cores) kept in the package beside a manifest
of SHA-256 hashes, the teaching key, the hash of the base model it was taught from and the
command and versions that produced it.

:func:`plasticlm.refine.taught.taught_peer` takes the shipped copy instead of teaching when
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
from plasticlm.runs import write_text_atomic
from plasticlm.sandbox.shipped import MANIFEST, mismatches, read_manifest, sha256, shipping_facts

SHIPPED_TAUGHT = Path(__file__).parent / "shipped"
_SKIPPED = (".plasticlm", MANIFEST)


def weights_sha256(model_folder: Path) -> str | None:
    """The SHA-256 of a local model folder's ``model.safetensors`` (None: no such file)."""
    path = Path(model_folder) / "model.safetensors"
    return sha256(path) if path.is_file() else None


def shipped_taught(name: str, key: str, base_sha256: str | None,
                   root: Path | None = None) -> Path | None:
    """The shipped folder of taught model ``name`` when it was taught with ``key`` from base
    weights ``base_sha256``; None otherwise. Refused when a file differs from its hash."""
    folder = (root or SHIPPED_TAUGHT) / name
    manifest = read_manifest(folder)
    if manifest is None or base_sha256 is None:
        return None
    if manifest["key"] != key or manifest["base_sha256"] != base_sha256:
        return None
    bad = mismatches(folder, manifest)
    if bad:
        shown = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        raise PlasticError(f"the shipped taught model in {folder} does not match its manifest: "
                           f"{shown}; restore the repository's copy (`git checkout -- "
                           f"{folder}`) or delete the folder to teach it again")
    return folder


def copy_shipped(folder: Path, dest: Path) -> None:
    """Copy a checked shipped taught model into ``dest`` (a run's ``taught/NAME``)."""
    manifest = read_manifest(folder)
    dest.mkdir(parents=True, exist_ok=True)
    for rel in manifest["files"]:
        shutil.copyfile(folder / rel, dest / rel)


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
