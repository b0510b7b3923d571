"""MMLU's folder of CSVs: ``<split>/<subject>_<split>.csv``, no header, one question a row."""

from __future__ import annotations

import csv
from collections.abc import Iterable, Sequence
from pathlib import Path

from plasticlm.data.records import LETTERS, MCQuestion
from plasticlm.errors import PlasticError

SPLITS = ("dev", "val", "test")


def _read_csv(path: Path, subject: str, split: str) -> list[MCQuestion]:
    out = []
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        try:
            for row in reader:
                line = reader.line_num
                if not row:
                    raise PlasticError(f"{path}, line {line}: empty row; every row needs "
                                       "question,A,B,C,D,answer")
                if len(row) != 6:
                    raise PlasticError(f"{path}, line {line}: {len(row)} columns, expected 6 "
                                       "(question,A,B,C,D,answer)")
                answer = row[5].strip()
                if answer not in LETTERS:
                    raise PlasticError(f"{path}, line {line}: answer field {row[5]!r} is not one "
                                       "of A, B, C, D")
                out.append(MCQuestion(subject, split, row[0], tuple(row[1:5]), answer, len(out)))
        except csv.Error as e:
            raise PlasticError(f"{path}, line {reader.line_num}: malformed CSV ({e})") from None
        except UnicodeDecodeError as e:
            raise PlasticError(f"{path}: not UTF-8 text ({e})") from None
    return out


def mmlu_subjects(folder: str | Path, split: str = "test") -> list[str]:
    """Sorted subject names found in ``folder/<split>``."""
    d = Path(folder) / split
    return sorted(p.name[: -len(f"_{split}.csv")] for p in d.glob(f"*_{split}.csv"))


def load_mmlu(folder: str | Path, split: str = "test",
              subjects: Iterable[str] | None = None) -> list[MCQuestion]:
    """All questions of ``split`` in an MMLU-layout folder, subject by subject, sorted by name.

    >>> qs = load_mmlu("../shared/data/mmlu", "dev", ["anatomy"])   # doctest: +SKIP
    >>> qs[0].answer_text                                            # doctest: +SKIP
    """
    folder = Path(folder)
    if split not in SPLITS:
        raise PlasticError(f"unknown MMLU split {split!r}; use one of {', '.join(SPLITS)}")
    if not (folder / split).is_dir():
        raise PlasticError(f"{folder} has no {split}/ folder: expected the MMLU layout "
                           f"<folder>/{split}/<subject>_{split}.csv")
    names = list(subjects) if subjects is not None else mmlu_subjects(folder, split)
    if not names:
        raise PlasticError(f"{folder / split} holds no *_{split}.csv files")
    out = []
    for subject in names:
        path = folder / split / f"{subject}_{split}.csv"
        if not path.exists():
            raise PlasticError(f"{path} does not exist: no subject {subject!r} in split {split}")
        out.extend(_read_csv(path, subject, split))
    return out


def load_mmlu_hub(split: str = "test", subjects: Iterable[str] | None = None) -> list[MCQuestion]:
    """MMLU from the Hugging Face hub (``cais/mmlu``) through the ``datasets`` package."""
    try:
        import datasets
    except ImportError:
        raise PlasticError("loading MMLU from the hub needs the `datasets` package "
                           "(pip install datasets); or pass a local folder of CSVs") from None
    hub_split = {"dev": "dev", "val": "validation", "test": "test"}[split]
    try:
        ds = datasets.load_dataset("cais/mmlu", "all", split=hub_split)
    except Exception as e:  # offline or missing: say how to provide it instead
        raise PlasticError(f"could not fetch cais/mmlu from the hub ({type(e).__name__}); "
                           "pass a local MMLU folder of CSVs instead") from None
    wanted = set(subjects) if subjects is not None else None
    out = []
    for row in ds:
        if wanted is None or row["subject"] in wanted:
            out.append(MCQuestion(row["subject"], split, row["question"], tuple(row["choices"]),
                                  LETTERS[row["answer"]], len(out)))
    return out


def write_mmlu(folder: str | Path, questions: Sequence[MCQuestion]) -> list[Path]:
    """Write questions as ``folder/<split>/<subject>_<split>.csv`` files (MMLU layout)."""
    groups: dict[tuple[str, str], list[MCQuestion]] = {}
    for q in questions:
        groups.setdefault((q.split, q.subject), []).append(q)
    paths = []
    for (split, subject), qs in sorted(groups.items()):
        path = Path(folder) / split / f"{subject}_{split}.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            for q in qs:
                w.writerow([q.question, *q.choices, q.answer])
        paths.append(path)
    return paths
