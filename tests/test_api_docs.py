"""The library's public API (issue 58, item 2): every example on docs/api.md runs as written,
the names the page lists are each package's ``__all__``, and ``import plasticlm.fednl`` stays
light (its names load on first use)."""

import contextlib
import importlib
import io
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

PAGE = Path(__file__).resolve().parents[1] / "docs" / "api.md"
SECTION = re.compile(r"^## `(plasticlm\.\w+)`.*?\n\n(.*?)\n\n```python\n(.*?)```", re.S | re.M)


def _sections() -> list[tuple[str, str, str]]:
    return SECTION.findall(PAGE.read_text())


def test_the_page_covers_each_method_and_the_memory():
    assert [s[0] for s in _sections()] == ["plasticlm.memory", "plasticlm.fednl",
                                           "plasticlm.refine", "plasticlm.scol"]


@pytest.mark.parametrize("package,names,code", _sections(), ids=lambda x: str(x)[:20])
def test_each_example_runs_and_the_listed_names_are_all(package, names, code):
    assert [n.strip("` ") for n in names.split(",")] == list(importlib.import_module(package).__all__)
    torch.manual_seed(0)
    with contextlib.redirect_stdout(io.StringIO()) as out:
        exec(compile(code, f"docs/api.md ({package})", "exec"), {"__name__": "__example__"})
    assert out.getvalue().strip(), "each example prints what it made"


def test_importing_fednl_imports_neither_torch_nor_flower():
    code = ("import sys, plasticlm.fednl as f\nassert f.__all__\n"
            "print(sorted(m for m in ('torch', 'flwr', 'peft') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"
