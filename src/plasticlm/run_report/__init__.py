"""A run folder as one page: ``index.html`` (self-contained: plots embedded, no network) and
``index.md``, with every table and plot the run wrote, its configuration, the versions and
commit it ran with, and its wall and CPU times.

Works on any folder a command writes (a FedNL run or experiment, a FedRefine or SCoL
experiment, the demo): each folder that holds tables (``*.md``), plots (``*.png``) or a
``config.json`` becomes a section, nested folders after their parent.

>>> html, md = write_report("runs/demo")          # doctest: +SKIP
"""

from __future__ import annotations

import base64
import html
import json
import re
import subprocess
import time
from importlib import metadata
from pathlib import Path

from plasticlm.config_files import loads_json
from plasticlm.errors import PlasticError
from plasticlm.outputs import prepare_output, read_marker
from plasticlm.run_report.page import CHECK, ERRORS, STYLE
from plasticlm.runs import read_metrics, write_text_atomic

REPORT_NAMES = ("index.html", "index.md")
REPORT_FOLDER = "report"   # RUN/report/: the report's own marked folder
PACKAGES = ("plasticlm", "torch", "transformers", "peft", "flwr")


def _inline(text: str) -> str:
    """Escape ``text`` and render Markdown's inline code and bold."""
    out = html.escape(text)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    return re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", out)


def markdown_to_html(text: str) -> str:
    """The Markdown the package writes (tables, headers, lists, code, paragraphs) as HTML."""
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            out.append("<pre>" + html.escape("\n".join(lines[i + 1: j])) + "</pre>")
            i = j + 1
        elif line.startswith("|"):
            rows = []
            while i < len(lines) and lines[i].startswith("|"):
                cells = [c.strip() for c in lines[i].strip().strip("|").split("|")]
                if not all(re.fullmatch(r":?-{3,}:?", c) for c in cells):
                    rows.append(cells)
                i += 1
            head, body = rows[0], rows[1:]
            out.append('<div class="wide"><table><tr>'
                       + "".join(f"<th>{_inline(c)}</th>" for c in head) + "</tr>"
                       + "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>"
                                 for r in body) + "</table></div>")
        elif m := re.match(r"(#{1,6}) (.*)", line):
            level = min(6, len(m.group(1)) + 2)
            out.append(f"<h{level}>{_inline(m.group(2))}</h{level}>")
            i += 1
        elif re.match(r"\s*[-*] ", line):
            items = []
            while i < len(lines) and re.match(r"\s*[-*] |\s{2,}\S", lines[i]):
                if re.match(r"\s*[-*] ", lines[i]):
                    items.append(re.sub(r"^\s*[-*] ", "", lines[i]))
                else:
                    items[-1] += " " + lines[i].strip()
                i += 1
            out.append("<ul>" + "".join(f"<li>{_inline(x)}</li>" for x in items) + "</ul>")
        elif line.strip():
            para = []
            while i < len(lines) and lines[i].strip() and not re.match(r"[|#`]|\s*[-*] ",
                                                                      lines[i]):
                para.append(lines[i])
                i += 1
            out.append(f"<p>{_inline(' '.join(para))}</p>")
        else:
            i += 1
    return "\n".join(out)


def provenance(root: Path) -> dict:
    """Versions of the packages a run depends on, the commit of the checkout, and when."""
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=10, cwd=Path(__file__).parent).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10,
                               cwd=Path(__file__).parent).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit, dirty = "", ""
    return {"versions": versions,
            "commit": (commit + (" (with uncommitted changes)" if dirty else "")) or "unknown",
            "written": time.strftime("%Y-%m-%d %H:%M:%S")}


def _times(folder: Path) -> dict:
    """Wall and CPU seconds a run recorded: ``wall_seconds``/``cpu_seconds`` in its
    ``metrics.jsonl``, else its reports' ``seconds`` totals and the metrics' time span."""
    out: dict = {}
    records = read_metrics(folder / "metrics.jsonl")
    for r in records:
        for key in ("wall_seconds", "cpu_seconds"):
            if key in r:
                out[key] = r[key]
    if "wall_seconds" not in out:
        stamps = [r["time"] for r in records if isinstance(r.get("time"), (int, float))]
        if len(stamps) > 1:
            out["metrics_span_seconds"] = round(max(stamps) - min(stamps), 1)
        for name in ("report.json", "summary.json", "results.json"):
            if (folder / name).exists():
                try:
                    seconds = json.loads((folder / name).read_text()).get("seconds")
                except (json.JSONDecodeError, AttributeError):
                    continue
                if isinstance(seconds, dict):
                    seconds = seconds.get("total")
                if isinstance(seconds, (int, float)):
                    out["seconds_reported"] = seconds
    return out


def _weights_folder(f: Path) -> bool:
    """A model, adapter or checkpoint folder: its Markdown is a library's (PEFT's model card
    template), its config.json a model's, not the run's."""
    return any(f.glob("*.safetensors")) or (f / "adapter_config.json").exists()


def _tables(folder: Path) -> list[Path]:
    """The run's tables in a folder, in the order they were written (the run's order)."""
    return sorted((p for p in folder.glob("*.md")
                   if p.name not in REPORT_NAMES and p.name != "README.md"),
                  key=lambda p: (p.stat().st_mtime, p.name))


def _started(folder: Path) -> float:
    """When a folder's stage ran: its oldest file (sections follow the run's order)."""
    stamps = [p.stat().st_mtime for p in folder.iterdir() if p.is_file()]
    return min(stamps, default=folder.stat().st_mtime)


def _sections(root: Path) -> list[Path]:
    """Folders under ``root`` (itself first, then in the order they ran) holding the run's
    tables, plots or config; model and adapter folders are left out."""
    keep = []
    for f in (p for p in root.rglob("*") if p.is_dir()):
        inner = f.relative_to(root).parts
        if any(x.startswith((".", "__")) or x.endswith(".partial") for x in inner):
            continue
        if (read_marker(f) or {}).get("kind") == "report":   # a report, not the run's
            continue
        if any(_weights_folder(p) for p in (f, *f.parents) if root in p.parents):
            continue
        if _tables(f) or list(f.glob("*.png")) or (f / "config.json").exists():
            keep.append(f)
    keep.sort(key=lambda f: (_started(f), str(f)))
    if _tables(root) or list(root.glob("*.png")) or (root / "config.json").exists():
        keep.insert(0, root)
    return keep


# names a folder or file holds in lower case, as they are written
PROPER = {"fednl": "FedNL", "scol": "SCoL", "refine": "FedRefine", "mmlu": "MMLU",
          "niah": "NIAH", "c2c": "C2C", "t2t": "T2T", "ipo": "IPO", "lora": "LoRA",
          "stories260k": "stories260K", "squad": "SQuAD", "mqar": "MQAR", "kv": "KV"}


def _title(path: Path) -> str:
    """A file's or folder's name as a title: ``scol_report.md`` -> ``SCoL report``."""
    words = [PROPER.get(w.lower(), w) for w in
             path.stem.replace("_", " ").replace("-", " ").split()]
    if words and words[0] not in PROPER.values():
        words[0] = words[0][:1].upper() + words[0][1:]
    return " ".join(words)


SMOKE = "smoke run (--quick, tiny models, a few items): numbers mean nothing"


def _smoke(root: Path) -> bool:
    """Whether the run is a smoke run: its config says ``quick``, or a config inside names
    the quick sandbox family."""
    for config in [root / "config.json", *root.glob("*/**/config.json")]:
        try:
            text = config.read_text(encoding="utf-8")
            if config.parent == root and loads_json(text).get("quick") is True:
                return True
        except (OSError, ValueError, UnicodeDecodeError, AttributeError):
            continue
        if '"sandbox-quick' in text or '"quick:' in text:
            return True
    return False


def _anchor(name: str) -> str:
    return "s-" + "".join(c if c.isalnum() else "-" for c in name)


def write_report(run_dir: str | Path) -> tuple[Path, Path]:
    """Write ``index.html`` and ``index.md`` into ``run_dir/report/`` (a marked folder of its
    own: no file of the run, or of the user's, is ever replaced); returns their paths."""
    root = Path(run_dir)
    if not root.is_dir():
        raise PlasticError(f"{root} is not a run folder; give the folder a command wrote "
                           "(e.g. runs/demo)")
    folders = _sections(root)
    if not folders:
        raise PlasticError(f"{root} holds no tables, plots or config.json to report")
    out = prepare_output(root / REPORT_FOLDER, "report",
                         hint=f"move {root / REPORT_FOLDER} away to write the report")
    prov = provenance(root)
    md = [f"# Run report: {root}", "", f"Written {prov['written']}; commit {prov['commit']}; "
          + ", ".join(f"{k} {v}" for k, v in prov["versions"].items()) + ".", ""]
    smoke = _smoke(root)
    if smoke:
        md[2:2] = [f"**{SMOKE}**", ""]
    body = [f"<h1>Run report: {html.escape(str(root))}</h1>",
            *([f'<p class="smoke"><strong>{html.escape(SMOKE)}</strong></p>'] if smoke else []),
            '<p id="render-check">rendered: (open in a browser)</p>',
            '<table class="meta">' + "".join(
                f"<tr><td>{html.escape(k)}</td><td>{html.escape(str(v))}</td></tr>"
                for k, v in [("commit", prov["commit"]), ("written", prov["written"]),
                             *prov["versions"].items()]) + "</table>"]
    def named(folder: Path) -> tuple[str, str]:
        if folder == root:
            return "The run", root.name
        return (" / ".join(_title(Path(x)) for x in folder.relative_to(root).parts),
                str(folder.relative_to(root)))
    if len(folders) > 1:   # a table of contents for a long page
        items = "".join(f'<li><a href="#{_anchor(n)}">{html.escape(t_)}</a></li>'
                        for t_, n in map(named, folders))
        body.append(f'<nav><h2>Contents</h2><ul>{items}</ul></nav>')
    for folder in folders:
        title, name = named(folder)
        body.append(f'<section id="{_anchor(name)}"><h2>{html.escape(title)} <small><code>'
                    f"{html.escape(name)}</code></small></h2>")
        md += [f"## {title} (`{name}`)", ""]
        times = _times(folder)
        if times:
            text = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in times.items())
            body.append(f"<p>Time: {html.escape(text)}</p>")
            md += [f"Time: {text}", ""]
        for table in _tables(folder):
            text = table.read_text()
            body += [f"<h3>{html.escape(_title(table))}</h3>", markdown_to_html(text)]
            md += [f"### {_title(table)}", "", text.strip(), ""]
        for png in sorted(folder.glob("*.png")):
            data = base64.b64encode(png.read_bytes()).decode()
            body.append(f'<h3>{html.escape(_title(png))}</h3>'
                        f'<img alt="{html.escape(_title(png))}" '
                        f'src="data:image/png;base64,{data}">')
            md += [f"![{png.name}](../{png.relative_to(root).as_posix()})", ""]
        config = folder / "config.json"
        if config.exists():
            text = config.read_text()
            body.append("<details><summary>config.json</summary><pre>" + html.escape(text)
                        + "</pre></details>")
            md += ["<details><summary>config.json</summary>", "", "```json", text.strip(),
                   "```", "", "</details>", ""]
        body.append("</section>")
    page = ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>plasticlm run report: "
            f"{html.escape(str(root))}</title>{STYLE}{ERRORS}</head><body>" + "\n".join(body)
            + CHECK + "</body></html>\n")
    return (write_text_atomic(out / "index.html", page),
            write_text_atomic(out / "index.md", "\n".join(md).rstrip() + "\n"))
