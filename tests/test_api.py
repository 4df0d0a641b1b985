"""The Python API (issue 15): decodegap.analyze / load / diff, the typed Analysis, its DataFrames and JSON Schema."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import decodegap
from decodegap.analysis import Analysis, json_schema
from decodegap.cli import main
from decodegap.errors import UserError

ROOT = Path(__file__).parent.parent


@pytest.fixture(scope="module")
def example() -> Analysis:
    return decodegap.analyze(decodegap.EXAMPLE_TRACE)


def _cli_json(capsys, *args) -> dict:
    try:
        main(["analyze", *args, "--format", "json"])
    except SystemExit as exc:
        assert exc.code in (0, None)
    return json.loads(capsys.readouterr().out)


def test_facade_equals_the_cli_json(example, capsys):
    assert example.to_dict() == _cli_json(capsys, "--example")
    assert isinstance(example, Analysis) and example.steps.decode.count == 3 and example.layers == 78


def test_analysis_is_typed_and_immutable(example):
    assert example.findings[0].id == "kv_pool_cast" and example.findings[0].evidence["calls_per_step"] == 78
    assert example.kernels[0].category == "cast" and example.steps.source == "profiler_step"
    with pytest.raises(AttributeError):
        example.layers = 1


def test_repr_is_short_and_says_what_the_trace_is(example):
    text = repr(example)
    assert len(text) < 2000
    assert "3 decode forwards" in text and "kv_pool_cast" in text
    html = example._repr_html_()
    assert "<table" in html and "kv_pool_cast" in html and len(html) < 20_000


def test_dataframes(example):
    pytest.importorskip("pandas")  # an optional extra (the test extra installs it)
    kernels = example.kernels_df()
    assert {"name", "category", "calls_per_step", "ms_per_step", "share", "us_per_call"} <= set(kernels.columns)
    assert len(kernels) == len(example.kernels) and kernels.iloc[0]["category"] == "cast"
    assert list(example.categories_df()["name"])[:2] == ["cast", "gemm"]
    assert list(example.findings_df()["id"])[0] == "kv_pool_cast"
    steps = example.steps_df()
    assert len(steps) == 3 and {"index", "phase", "start_ms", "ms", "gpu_busy_ms", "cast_ms"} <= set(steps.columns)
    assert steps["cast_ms"].between(60, 70).all()  # the pool cast, every step


def test_dataframes_without_pandas_say_what_to_install(example, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_pandas(name, *args, **kwargs):
        if name == "pandas":
            raise ImportError("No module named 'pandas'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pandas)
    with pytest.raises(ImportError, match=r"decodegap\[pandas\]"):
        example.kernels_df()


def test_load_reads_a_saved_report_back(example, tmp_path):
    path = tmp_path / "r.json"
    path.write_text(example.to_json())
    assert decodegap.load(path) == example
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "something else"}')
    with pytest.raises(UserError):
        decodegap.load(bad)


def test_diff_api(example, tmp_path):
    d = decodegap.diff(example, example)
    assert d["schema"] == "decodegap.diff/1" and d["speedup"] == pytest.approx(1.0)


def test_options_reach_the_floor():
    a = decodegap.analyze(decodegap.EXAMPLE_TRACE, model=decodegap.EXAMPLE_MODEL, gpu="h200", context=2048)
    assert a.floor is not None and a.floor.gpu == "h200" and a.gap is not None and a.gap.rows
    with pytest.raises(UserError):
        decodegap.analyze(decodegap.EXAMPLE_TRACE, model=decodegap.EXAMPLE_MODEL, gpu="no-such-gpu")


def test_json_schema_is_generated_and_shipped():
    shipped = json.loads((ROOT / "docs" / "report.schema.json").read_text())
    assert shipped == json.loads(json.dumps(json_schema(), sort_keys=True)), \
        "regenerate: python -c 'from decodegap.analysis import json_schema; ...' (see docs/report-schema.md)"


def test_schema_doc_covers_every_top_level_key():
    doc = (ROOT / "docs" / "report-schema.md").read_text()
    documented = set(re.findall(r"`([a-z_]+)(?:[.\[`])", doc))
    missing = [f for f in Analysis.__struct_fields__ if f not in documented]
    assert not missing, f"docs/report-schema.md does not describe {missing}"


def test_findings_carry_typed_evidence_that_keeps_every_key(tmp_path):
    # every detector's evidence survives the typed Analysis key for key (a key the types miss would be dropped)
    from decodegap.api import run
    from decodegap.analysis import build
    from tracegen import decode_loop, write

    folder = tmp_path / "ranks"
    folder.mkdir()
    for rank, us in ((0, 80.0), (1, 5.0)):
        write(decode_loop(steps=4, layers=6, collective_us=us, gap_us=2.0, rank=rank), folder / f"r{rank}.json")
    cases = [decodegap.EXAMPLE_TRACE, folder,
             ROOT / "tests" / "fixtures" / "traces" / "hf_llama_generate_6steps.json.gz"]
    seen = set()
    for path in cases:
        report = run(path)
        typed = build(report)
        for raw, f in zip(report.findings, typed.findings, strict=True):
            seen.add(f.id)
            assert f.id == raw.id and type(f).__name__ != "Finding"
            # the detectors emit the typed record itself (issue 23): the Analysis holds it as it came
            assert f.evidence.as_dict() == json.loads(json.dumps(raw.evidence.as_dict())), f.id
    assert {"kv_pool_cast", "host_bound", "straggler_rank"} <= seen


def test_a_detector_cannot_drop_evidence_on_the_way_to_the_report():
    # a name the evidence type lacks is refused where the finding is made, not dropped without a word
    from decodegap.findings.records import make_finding

    with pytest.raises(TypeError, match="not_a_field"):
        make_finding("host_bound", "t", 1.0, 0.5, {"gpu_busy_fraction": 0.5, "not_a_field": 1}, "fix")


@pytest.mark.parametrize("name", ["mla_cast_eager_2steps.json.gz", "hf_llama_generate_6steps.json.gz",
                                  "cast_graph.json.gz", "hta_training_2steps.json.gz"])
def test_an_analysis_reads_back_as_it_was_written(name, tmp_path):
    # the stages' records go into the Analysis as they are (no JSON round trip): what they hold must be what the
    # report's types hold, number for number (an int where the type says float would read back as 1.0)
    a = decodegap.analyze(ROOT / "tests" / "fixtures" / "traces" / name)
    saved = tmp_path / "a.json"
    saved.write_text(a.to_json())
    assert decodegap.load(saved).to_json() == a.to_json()
    assert a.to_dict() == json.loads(a.to_json())


def test_the_analysis_modules_imported_while_reading_are_all_it_imports_after():
    # api.ANALYSIS_MODULES are imported by the reader while its second process decodes (json_events._Parallel):
    # a module the analysis imports after reading that the list misses would only be imported later, serially.
    import importlib.util
    import subprocess
    import sys

    from decodegap import api

    assert all(importlib.util.find_spec(name) is not None for name in api.ANALYSIS_MODULES)
    trace = Path(__file__).parent / "fixtures" / "traces" / "hf_llama_generate_6steps.json.gz"
    code = ("import sys\nimport decodegap.api, decodegap.pipeline, decodegap.floor.ledger, decodegap.floor.floor\n"
            "from decodegap.trace import load\nbefore = set(sys.modules)\n"
            f"decodegap.api.analyze({str(trace)!r})\n"
            "print(sorted(m for m in set(sys.modules) - before if m.startswith('decodegap')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert set(eval(out.stdout)) <= set(api.ANALYSIS_MODULES), out.stdout
