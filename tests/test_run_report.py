"""The run report: every table and plot of a run folder on one self-contained page, rendered
by a real browser when one is installed."""

import json
from html.parser import HTMLParser

import pytest
from browser_page import BROWSER, NO_BROWSER, rendered_counts

from plasticlm.cli import main
from plasticlm.errors import PlasticError
from plasticlm.plotting import plt
from plasticlm.run_report import markdown_to_html, write_report

TABLE = "| method | accuracy |\n|---|---|\n| fednl | 61.3 [58.0, 64.5] |\n| fedavg | 57.2 |\n"


class Count(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.cells, self.images = [], [], []
        self._cell = False

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self._cell = tag in ("td", "th")
        if tag == "img":
            self.images.append(dict(attrs)["src"])

    def handle_data(self, data):
        if self._cell:
            self.cells.append(data)


@pytest.fixture
def run_dir(tmp_path):
    # a long path with no break in it, as pytest's and CI's are: the page's title holds it
    run = tmp_path / ("a_run_folder_whose_name_is_long_" * 5) / "run"
    (run / "refine").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"quick": True}))
    (run / "metrics.jsonl").write_text(json.dumps({"time": 1.0, "stage": "end",
                                                   "wall_seconds": 12.5, "cpu_seconds": 20.1})
                                       + "\n")
    (run / "table.md").write_text("Note with `code`.\n\n" + TABLE)
    (run / "refine" / "table.md").write_text(TABLE.replace("fednl", "c2c")
                                             + "| " + " | ".join(["x" * 90] * 12)
                                             + " |\n")   # a table wider than the page
    for name in ("a.png", "refine/b.png"):
        fig, ax = plt.subplots(figsize=(2, 2))
        ax.plot([0, 1], [1, 0])
        fig.savefig(run / name)
        plt.close(fig)
    return run


def test_report_holds_every_table_plot_and_config_of_the_run(run_dir):
    page, md = write_report(run_dir)
    parsed = Count()
    parsed.feed(page.read_text())
    assert parsed.tags.count("table") == 2 + 1           # the run's two tables + provenance
    assert len(parsed.images) == 2 and all(s.startswith("data:image/png;base64,")
                                           for s in parsed.images)
    assert "61.3 [58.0, 64.5]" in parsed.cells and "c2c" in parsed.cells
    text = page.read_text()
    assert "wall seconds 12.5" in text and "cpu seconds 20.1" in text and "torch" in text
    assert '&quot;quick&quot;: true' in text and "http" not in text.replace("http-equiv", "")
    assert "| fednl | 61.3 [58.0, 64.5] |" in md.read_text()
    # the page's own files are not reported again
    again, _ = write_report(run_dir)
    assert again.read_text().count("<h3>Index") == 0


def test_markdown_tables_headers_and_lists_become_html():
    out = markdown_to_html("# T\n\n- one\n  more\n- two\n\n" + TABLE + "\n```\nx < 1\n```")
    assert "<h3>T</h3>" in out and "<li>one more</li>" in out and "<li>two</li>" in out
    assert out.count("<tr>") == 3 and "<pre>x &lt; 1</pre>" in out


def test_report_errors_say_what_to_give(tmp_path):
    with pytest.raises(PlasticError, match="not a run folder"):
        write_report(tmp_path / "nope")
    with pytest.raises(PlasticError, match="no tables"):
        write_report(tmp_path)
    assert main(["report", str(tmp_path / "nope")]) == 2


@pytest.mark.skipif(BROWSER is None, reason=NO_BROWSER)
def test_a_browser_renders_every_table_and_plot(run_dir):
    page, _ = write_report(run_dir)
    counts = rendered_counts(page)
    assert counts["tables"] == 3 and counts["images"] == 2
    assert counts["images-rendered"] == 2, "a plot did not decode in the browser"
    assert counts["errors"] == 0, "the page raised a script error"
    assert counts["overflowing"] == 0, counts["overflow-what"]


def test_report_leaves_out_model_folders_and_follows_the_run_order(run_dir):
    """Only plasticlm's own pages: a PEFT adapter folder's model card and config are not the
    run's; stages appear in the order they ran, with titles, not file names."""
    import os

    adapter = run_dir / "scol" / "consolidated"
    adapter.mkdir(parents=True)
    (adapter / "README.md").write_text("---\nlibrary_name: peft\n---\n# Model Card\n")
    (adapter / "adapter_config.json").write_text("{}")
    (adapter / "adapter_model.safetensors").write_bytes(b"x")
    (run_dir / "scol" / "scol_table.md").write_text(TABLE)
    (run_dir / "fednl").mkdir()
    (run_dir / "fednl" / "table.md").write_text(TABLE)
    os.utime(run_dir / "refine" / "table.md", (3e9, 3e9))   # refine ran last
    for png in run_dir.rglob("*.png"):
        os.utime(png, (3e9, 3e9))
    os.utime(run_dir / "fednl" / "table.md", (1e9, 1e9))
    os.utime(run_dir / "scol" / "scol_table.md", (2e9, 2e9))
    page, md = write_report(run_dir)
    text = page.read_text()
    assert "Model Card" not in text and "consolidated" not in text
    assert text.index("<code>fednl</code>") < text.index("<code>scol</code>") \
        < text.index("<code>refine</code>")
    assert "<h3>SCoL table</h3>" in text and "scol_table.md" not in text


def test_tensorboard_export_holds_every_metric_of_every_record(tmp_path, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from plasticlm.cli import main
    from plasticlm.runs import RunDir

    run = RunDir.create("run", {"rounds": 3}, root=tmp_path)
    for r in (1, 2, 3):
        run.log(round=r, fed_acc=0.1 * r, detail={"drop": -0.01 * r}, name="x", ok=True)
    inner = RunDir(tmp_path / "run" / "meta_scol")
    for i in range(4):
        inner.log(loss=1.0 / (i + 1))
    with (run.path / "metrics.jsonl").open("a") as f:
        f.write('{"round": 4, "fed_ac')                 # torn by a kill: dropped
    assert main(["report", str(run.path), "--tensorboard"]) == 0
    assert "tensorboard: 13 scalars" in capsys.readouterr().out   # 3 x 3 + 4
    acc = EventAccumulator(str(run.path / "tensorboard" / "run")).Reload()
    assert sorted(acc.Tags()["scalars"]) == ["detail/drop", "fed_acc", "round"]
    assert [(e.step, round(e.value, 6)) for e in acc.Scalars("fed_acc")] == \
        [(1, 0.1), (2, 0.2), (3, 0.3)]
    meta = EventAccumulator(str(run.path / "tensorboard" / "meta_scol")).Reload()
    assert [round(e.value, 6) for e in meta.Scalars("loss")] == [1.0, 0.5, 0.333333, 0.25]


def test_a_smoke_run_says_so_and_names_read_as_written(run_dir):
    """A --quick run's page and markdown carry the smoke warning the terminal prints; headings
    write FedNL, SCoL and stories260K as they are written; a page of several sections opens
    with a table of contents that links each; the run's own section names its folder."""
    (run_dir / "fednl").mkdir()
    (run_dir / "fednl" / "scol_report.md").write_text(TABLE)
    page, md = write_report(run_dir)
    text, mdtext = page.read_text(), md.read_text()
    assert "numbers mean nothing" in text and "numbers mean nothing" in mdtext
    assert "FedNL" in text and "SCoL report" in text and "Fednl" not in text
    assert '<nav><h2>Contents</h2>' in text and 'href="#s-fednl"' in text
    assert 'id="s-fednl"' in text
    assert "The run (`.`)" not in mdtext and f"The run (`{run_dir.name}`)" in mdtext


def test_a_full_run_has_no_smoke_warning(run_dir):
    (run_dir / "config.json").write_text(json.dumps({"quick": False}))
    page, _ = write_report(run_dir)
    assert "numbers mean nothing" not in page.read_text()
