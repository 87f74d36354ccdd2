"""The HTML run report: parses, embeds its images as PNG data URIs, names the final figures, escapes
what it takes from the run, and says in one line what it lacks."""

from __future__ import annotations

import base64
import io
import json
from html.parser import HTMLParser
from pathlib import Path

import pytest
from matplotlib.figure import Figure

from minigpt.common import UsageError
from minigpt.viz.report import write_run_report

from .helpers import make_run, png_size

VOID = {"meta", "img", "br", "hr", "link", "input", "source"}
SAMPLE = 'First <script>alert("x")</script> & more'


class Page(HTMLParser):
    """The parts of a page the tests look at; fails on a closing tag that closes nothing open."""

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.open: list[str] = []
        self.tags: list[str] = []
        self.images: list[dict[str, str | None]] = []
        self.text: list[str] = []
        self.after_pre = False
        self.feed(html)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.after_pre = tag == "pre"
        if tag == "img":
            self.images.append(dict(attrs))
        elif tag not in VOID:
            self.open.append(tag)

    def handle_endtag(self, tag: str) -> None:
        self.after_pre = False
        assert self.open and self.open[-1] == tag, f"</{tag}> closes {self.open[-1:]}"
        self.open.pop()

    def handle_data(self, data: str) -> None:
        # As a browser reads it: one newline right after <pre> is not part of the text.
        self.text.append(data.removeprefix("\n") if self.after_pre else data)
        self.after_pre = False

    def row(self, label: str) -> str:
        """The text of the table cell after the header cell `label`."""
        return self.text[self.text.index(label) + 1]


def a_png(title: str) -> bytes:
    fig = Figure(figsize=(2, 1), dpi=50)
    fig.suptitle(title)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def decode(image: dict[str, str | None]) -> bytes:
    src = image["src"] or ""
    prefix = "data:image/png;base64,"
    assert src.startswith(prefix), src[:40]
    return base64.b64decode(src[len(prefix) :], validate=True)


def test_the_report_is_self_contained_and_names_the_final_figures(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    # Out of order on purpose: the report shows the newest last.
    # The newest starts with a newline, as a sample of a prompt ending in one does.
    lines = [{"step": 20, "text": "\nnewest sample"}, {"step": 10, "text": SAMPLE}]
    (run / "samples.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    maps = {"layer 0 <head 0>": a_png("a"), "layer 1 head 0": a_png("b")}

    curves, report = write_run_report(run, attention_pngs=maps)
    assert (curves, report) == (run / "loss_curves.png", run / "report.html")
    html = report.read_text(encoding="utf-8")
    page = Page(html)
    assert page.open == [], f"unclosed: {page.open}"
    assert page.tags[:3] == ["html", "head", "meta"] and "body" in page.tags

    # Images: the curves file, then the attention maps, each a data URI decoding to that very PNG.
    assert [decode(image) for image in page.images] == [curves.read_bytes(), *maps.values()]
    assert png_size(decode(page.images[0])) == (1200, 700)
    assert "script" not in page.tags and "link" not in page.tags
    assert "http://" not in html and "https://" not in html

    # Figures from the CSV: final val loss 2.4567 (ppl 11.66 as logged), best 2.3 at step 10.
    assert page.row("final val loss") == "2.4567 at step 20"
    assert page.row("final val perplexity") == "11.66"
    assert page.row("best val loss") == "2.3000 at step 10"
    assert page.row("best val perplexity") == "9.97"
    assert page.row("steps") == "20"
    assert page.row("tokens seen") == "1,280"
    assert page.row("resumed") == "before step 15"

    # The sample arrives as text, not markup, oldest first; so does the attention map's caption.
    assert "&lt;script&gt;" in html
    assert SAMPLE in page.text and "layer 0 <head 0>" in page.text
    assert page.text.index(SAMPLE) < page.text.index("\nnewest sample")  # its newline kept
    assert "step 10" in page.text and "step 20" in page.text
    assert any("batch_size: 4" in t for t in page.text)  # the resolved config, in full
    assert sorted(p.name for p in run.iterdir()) == ["csv", "loss_curves.png", "report.html", "samples.jsonl"]


def test_a_run_without_samples_or_maps_says_so_in_one_line_each(tmp_path: Path) -> None:
    run = make_run(tmp_path, config=None)
    _, report = write_run_report(run)
    page = Page(report.read_text(encoding="utf-8"))
    assert len(page.images) == 1  # the curves only
    notes = [t for t in page.text if t.startswith("No ")]
    assert notes == [
        "No samples recorded (no samples.jsonl in the run folder).",
        "No attention maps for this run.",
        "No config.yaml in the CSV log.",
    ]
    assert "Note: tokens seen unknown: no tokens_seen column and no config.yaml." in page.text
    assert "tokens seen" not in page.text  # no row for what cannot be known


def test_attention_maps_are_found_in_the_run_folder(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    (run / "attention").mkdir()
    (run / "attention" / "layer0.png").write_bytes(a_png("layer 0"))
    _, report = write_run_report(run)
    page = Page(report.read_text(encoding="utf-8"))
    assert len(page.images) == 2 and decode(page.images[1]) == (run / "attention" / "layer0.png").read_bytes()
    assert "layer0.png" in page.text


def test_a_run_with_nothing_logged_gets_a_report_that_says_so_when_asked(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    with pytest.raises(UsageError, match="no CSV log"):
        write_run_report(run)
    curves, report = write_run_report(run, allow_empty=True)
    assert curves.read_bytes().startswith(b"\x89PNG")
    html = report.read_text(encoding="utf-8")
    assert "metrics logged" in html and "none yet" in html
    assert "No samples recorded" in html and "No config.yaml" in html


def test_the_report_gives_the_bits_per_byte_of_the_final_and_the_best_validation(tmp_path: Path) -> None:
    version = tmp_path / "run" / "csv" / "version_0"
    version.mkdir(parents=True)
    rows = "4,3.1,,,\n9,,2.3,9.97,1.5\n14,,2.2,9.03,1.4\n19,,2.5,12.18,1.7\n"
    (version / "metrics.csv").write_text("step,train_loss,val_loss,val_ppl,val_bpb\n" + rows)
    _, report = write_run_report(tmp_path / "run")
    page = Page(report.read_text(encoding="utf-8"))
    assert page.row("final val bits per byte") == "1.7000"
    assert page.row("best val loss") == "2.2000 at step 15"  # the CSV counts from 0, the report from 1
    assert page.row("best val bits per byte") == "1.4000"
