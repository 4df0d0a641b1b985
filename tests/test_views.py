"""The views: text, Markdown and HTML lay out one view model of the Analysis (the same facts in each), terminal
tables fit the width (COLUMNS honoured), the HTML page is self-contained with its SVG plots, and the load progress
bar shows only on a terminal."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import decodegap
from decodegap.analysis import build
from decodegap.pipeline import analyze_path
from decodegap.report.html import render_html
from decodegap.report.markdown import render_markdown
from decodegap.report.text import render_text, shorten
from decodegap.report.view import view_of

EXAMPLE_CONFIG = Path(decodegap.EXAMPLE_TRACE).parent / "example_model_config.json"


@pytest.fixture(scope="module")
def example():
    return decodegap.analyze(decodegap.EXAMPLE_TRACE, model=EXAMPLE_CONFIG, gpu="h200")


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    from tracegen import decode_loop, write

    folder = tmp_path_factory.mktemp("ranks")
    for rank, gap in ((0, 200.0), (1, 600.0)):
        write(decode_loop(steps=4, layers=4, gap_us=gap), folder / f"run.rank-{rank}.pt.trace.json")
    return build(analyze_path(folder))


def test_every_format_shows_the_same_facts(example):
    a = example
    text, md, page = render_text(a, width=160), render_markdown(a), render_html(a)
    finding = a.findings[0]
    facts = [finding.id, f"{finding.ms_per_step:.3f} ms/step", f"{a.floor.floor_ms:.3f}", f"{a.gap.step_ms:.3f}",
             f"{a.idle_ms_per_step:.3f}", "(GPU idle)", a.kernels[1].short_name, "pool_slots", "495,552",
             finding.fix.split(":")[0], a.warnings[0].split(":")[0][:40],
             f"{a.profiler_check.unprofiled_ms:.3f}"]
    for fact in facts:
        for name, out in (("text", text), ("md", md), ("html", page)):
            assert fact in out.replace("&#x27;", "'"), f"{fact!r} missing from {name}"
    # the same sections, in the same order, in every format
    headings = {"text": (text, ["ROOT CAUSES", "by category", "top kernels", "FLOOR:", "GAP LEDGER:"]),
                "md": (md, ["### Root causes", "by category\n", "### Top kernels", "### Floor", "### Gap ledger"]),
                "html": (page, ["<h2>Root causes", "by category</h2>", "<h2>Top kernels", "<h2>Floor</h2>",
                                "<h2>Gap ledger</h2>"])}
    for name, (out, marks) in headings.items():
        at = [out.index(m) for m in marks]
        assert at == sorted(at), name


def test_per_rank_table_in_every_format(two_ranks):
    a = two_ranks
    assert [r.rank for r in a.ranks] == [0, 1]
    slowest = f"{a.slowest_rank} (slowest)"
    for out in (render_text(a), render_markdown(a), render_html(a)):
        assert "anks" in out and slowest in out
        for r in a.ranks:
            assert f"{r.step_ms_median:.3f}" in out


def test_views_read_only_the_analysis(example, tmp_path):
    # a saved report, read back, renders the very same pages: nothing comes from the pipeline's Report
    from decodegap.analysis import load

    path = tmp_path / "report.json"
    path.write_text(example.to_json())
    loaded = load(path)
    assert render_text(loaded, width=120) == render_text(example, width=120)
    assert render_markdown(loaded) == render_markdown(example)
    assert render_html(loaded) == render_html(example)


@pytest.mark.parametrize("width", [80, 100, 200])
def test_text_fits_the_width(example, width):
    text = render_text(example, width=width)
    longest = max(len(line) for line in text.splitlines())
    assert longest <= width, next(line for line in text.splitlines() if len(line) > width)
    kernels = text[text.index("top kernels"):text.index("FLOOR")]
    header = next(line for line in kernels.splitlines() if line.strip().startswith("kernel"))
    for column in ("kernel", "category", "calls/step", "ms/step", "share"):  # what a reader needs stays
        assert column in header
    if width >= 200:
        assert "op / shapes" in header and a_full_short_name(example) in kernels
    if width == 80:
        assert "op / shapes" not in header and "…" in kernels  # dropped, and long names shortened in the middle


FIXTURES = Path(__file__).parent / "fixtures" / "traces"


@pytest.mark.parametrize("trace", ["hta_training_2steps.json.gz", "hf_llama_generate_6steps.json.gz",
                                   "sglang_qwen3-8b_decode_mi300x.json.gz", "cast_eager.json.gz"])
@pytest.mark.parametrize("width", [40, 80])
def test_other_traces_render_in_every_format(trace, width):
    a = build(analyze_path(FIXTURES / trace))
    text = render_text(a, width=width)
    if width >= 80:
        assert max(len(line) for line in text.splitlines()) <= width
    assert a.summary in text.replace("\n", " ") or a.summary.split(";")[0] in text
    assert "## decodegap report" in render_markdown(a)
    page = render_html(a)
    assert page.startswith("<!doctype html>") and page.count("<svg") >= (1 if a.step_rows else 0)


def a_full_short_name(a):
    return max((k.short_name for k in a.kernels[:15]), key=len)


def test_shorten_keeps_both_ends():
    name = "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_splitK_TNT"
    short = shorten(name, 21)
    assert len(short) == 21 and short.startswith("nvjet_sm90") and short.endswith("splitK_TNT")
    assert shorten(name, 100) == name


def test_columns_is_honoured_by_the_cli():
    env = dict(os.environ, COLUMNS="80")
    out = subprocess.run([sys.executable, "-m", "decodegap", "analyze", "--example"], capture_output=True,
                         text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert max(len(line) for line in out.stdout.splitlines()) <= 80
    assert "ROOT CAUSES" in out.stdout and "[kv_pool_cast] 78 times per step" in out.stdout
    assert out.stderr == ""  # stderr is a pipe: no progress bar


def test_html_is_self_contained_with_its_plots(example):
    page = render_html(example)
    assert page.count("<svg") == 3  # timeline, layers, floor against the step
    for outside in ("<script", "<link", "src=", "href=", "@import", "url("):
        assert outside not in page
    # the timeline has a GPU-idle bar for each step, the layer view a bar per layer
    assert len(re.findall(r"step \d+ \([^)]*\): [\d.]+ ms from [\d.]+ ms, GPU idle", page)) == len(example.step_rows)
    assert len(re.findall(r"<title>layer \d+ \(kind", page)) == len(example.layer_rows) == 78
    # the long kernel name is there in full, on demand
    assert "<details" in page and "direct_copy_kernel_cuda(at::TensorIteratorBase&amp;)" in page
    assert "table-layout" in page and "overflow-wrap:anywhere" in page


def test_the_view_computes_nothing_new(example):
    view = view_of(example, top=5)
    assert [f.id for f in view.findings] == [f.id for f in example.findings]
    kernels = view.table("kernels")
    assert len(kernels.rows) == 5 and kernels.rows[0][3] == f"{example.kernels[0].ms_per_step:.3f}"
    idle = view.table("categories").rows[-1]
    assert idle[0] == "(GPU idle)" and idle[1] == f"{example.idle_ms_per_step:.3f}"


# --- the progress bar -----------------------------------------------------------------------------------------

def _read_all(path: Path) -> int:
    from decodegap.trace.read import iter_text_chunks

    return sum(len(c) for c in iter_text_chunks(path))


def test_no_progress_when_stderr_is_no_terminal(tmp_path):
    from decodegap.report.progress import load_progress

    stream = io.StringIO()
    trace = Path(decodegap.EXAMPLE_TRACE)
    with load_progress(stream=stream, min_bytes=0):
        assert _read_all(trace) > 0
    assert stream.getvalue() == ""


def test_progress_on_a_terminal_for_large_files_only():
    from decodegap.report.progress import load_progress

    import gzip

    trace = Path(decodegap.EXAMPLE_TRACE)
    text = len(gzip.decompress(trace.read_bytes()))  # the example is far under 50 MB: thresholds around it
    for min_bytes, shown in ((text, True), (text + 1, False)):
        master, slave = os.openpty()
        with open(slave, "w", closefd=True) as tty:
            with load_progress(stream=tty, min_bytes=min_bytes):
                _read_all(trace)
            tty.flush()
            os.set_blocking(master, False)
            try:
                drawn = os.read(master, 1 << 16).decode(errors="replace")
            except BlockingIOError:
                drawn = ""
        os.close(master)
        assert ("reading" in drawn) is shown, drawn
    from decodegap.trace.read import ON_READ

    assert ON_READ.get() is None  # the hook is gone after the block


def test_a_gzipped_trace_counts_by_its_text_size(tmp_path):
    import gzip

    from decodegap.report.progress import text_bytes

    trace = Path(decodegap.EXAMPLE_TRACE)
    assert text_bytes(trace, trace.stat().st_size) == len(gzip.decompress(trace.read_bytes()))
    plain = tmp_path / "t.json"
    plain.write_text('{"traceEvents": []}')
    assert text_bytes(plain, plain.stat().st_size) == plain.stat().st_size
