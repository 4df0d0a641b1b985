"""Folders of ranks analyzed in parallel (--jobs), on Ray (--ray), with one bad rank; the per-rank summary."""

from __future__ import annotations

import gzip
import pickle
import shutil
from pathlib import Path

import pytest

import decodegap
from decodegap.cli import main as cli_main
from decodegap.pipeline import AnalysisOptions, analyze_file, analyze_path, default_jobs
from decodegap.report.json import report_dict
from tracegen import decode_loop, write

FIXTURES = Path(__file__).parent / "fixtures" / "traces"


def _cli(args: list[str], capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        cli_main(args)
        raise SystemExit(0)
    out = capsys.readouterr()
    return exit_info.value.code or 0, out.out, out.err


def _rank_folder(tmp_path: Path, ranks: int = 3) -> Path:
    """Ranks that differ (collective time, host gaps), so the slowest rank and the straggler are real results."""
    folder = tmp_path / "run"
    folder.mkdir()
    for r in range(ranks):
        write(decode_loop(steps=4, layers=3, collective_us=10.0 + 60.0 * r),
              folder / f"1700000000-TP-{r}-DECODE.trace.json.gz")
    return folder


def test_jobs_2_gives_the_report_of_jobs_1(tmp_path):
    folder = _rank_folder(tmp_path)
    one = decodegap.analyze(folder, jobs=1).to_dict()
    two = decodegap.analyze(folder, jobs=2).to_dict()
    assert one == two
    assert [r["rank"] for r in one["ranks"]] == [0, 1, 2]
    assert one["slowest_rank"] == 2
    assert "straggler_rank" in [f["id"] for f in one["findings"]]  # the cross-rank detector ran on the summaries


def test_workers_started_by_spawn_give_the_same_report(tmp_path, monkeypatch):
    folder = _rank_folder(tmp_path, ranks=2)
    one = decodegap.analyze(folder, jobs=1).to_dict()
    monkeypatch.setattr("decodegap.pipeline._start_method", lambda: "spawn")  # what macOS and Windows use
    assert decodegap.analyze(folder, jobs=2).to_dict() == one


def test_jobs_does_not_change_a_single_file(tmp_path):
    path = FIXTURES / "cast_eager.json.gz"
    assert decodegap.analyze(path, jobs=1).to_dict() == decodegap.analyze(path, jobs=4).to_dict()


def test_cli_jobs_matches_the_api(tmp_path, capsys):
    folder = _rank_folder(tmp_path, ranks=2)
    code, out, _ = _cli(["analyze", str(folder), "--jobs", "2", "--format", "json"], capsys)
    assert code == 0 and out == decodegap.analyze(folder, jobs=1).to_json() + "\n"


def test_a_bad_rank_is_reported_and_the_others_analyzed(tmp_path):
    folder = _rank_folder(tmp_path)
    bad = folder / "1700000000-TP-1-DECODE.trace.json.gz"
    bad.write_bytes(gzip.compress(b'{"traceEvents": [') [:-8] + b"garbage!")  # damaged gzip
    for jobs in (1, 2):
        d = report_dict(analyze_path(folder, jobs=jobs))
        assert [r["rank"] for r in d["ranks"]] == [0, 2]
        left_out = [w for w in d["warnings"] if "left out" in w]
        assert len(left_out) == 1 and left_out[0].startswith("rank 1 (1700000000-TP-1-DECODE.trace.json.gz)")
        assert d["steps"]["decode"]["count"] == 4


def test_a_folder_whose_every_trace_is_bad_is_refused(tmp_path, capsys):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "a-rank-0.json").write_text('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", ')
    code, _, err = _cli(["analyze", str(folder), "--jobs", "2"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "a-rank-0.json: the JSON is truncated" in err, err


def test_summary_is_small_and_picklable_without_the_trace():
    outcome = analyze_file(FIXTURES / "cast_eager.json.gz", AnalysisOptions())
    s = outcome.summary
    assert s is not None and not hasattr(s, "links")
    assert all(len(step.rows) == 0 for step in s.steps.steps)  # GPU rows stay in the worker
    assert s.step_rows and s.layer_rows and "kv_pool_cast" in s.findings
    blob = pickle.dumps(outcome)
    assert len(blob) < 200_000
    assert pickle.loads(blob).summary.breakdown == s.breakdown


def test_default_jobs_is_capped_by_cores_and_files(tmp_path, monkeypatch):
    folder = _rank_folder(tmp_path, ranks=2)
    files = sorted(folder.iterdir())
    monkeypatch.setattr("decodegap.pipeline.cpu_count", lambda: 8)
    assert default_jobs(files) == 2
    monkeypatch.setattr("decodegap.pipeline.available_memory_bytes", lambda: 200 << 20)
    assert default_jobs(files) == 1  # two workers of ~150 MB do not fit in 200 MB


def test_ray_option_without_ray_installed_is_one_line(tmp_path, capsys, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_ray(name, *args, **kwargs):
        if name == "ray":
            raise ImportError("no ray")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    folder = _rank_folder(tmp_path, ranks=2)
    code, _, err = _cli(["analyze", str(folder), "--ray"], capsys)
    assert code == 2 and "pip install 'decodegap[ray]'" in err


@pytest.mark.slow
def test_ray_gives_the_report_of_jobs_1(tmp_path):
    pytest.importorskip("ray")
    folder = _rank_folder(tmp_path)
    shutil.copy(FIXTURES / "cast_eager.json.gz", folder / "host.9.rank-3.pt.trace.json.gz")  # a real trace too
    (folder / "config.json").write_text('{"hidden_size": 8}')  # not a trace: skipped the same way
    one = decodegap.analyze(folder, jobs=1).to_dict()
    on_ray = decodegap.analyze(folder, jobs=2, ray=True).to_dict()  # a local Ray with 2 CPUs
    assert on_ray == one
    assert [r["rank"] for r in one["ranks"]] == [0, 1, 2, 3]
    assert any("skipped 1 file(s)" in w for w in one["warnings"])


def test_op_shapes_are_interned_not_kept_per_op(tmp_path):
    from decodegap.trace import load_trace

    doc = decode_loop(steps=6, layers=4)
    ops = [e for e in doc["traceEvents"] if e["cat"] == "cpu_op"]
    ops[5]["args"].update({"Input Dims": [[495552, 1, 576], []], "Input type": ["c10::Float8_e4m3fn", ""]})
    ops[-1]["args"].update({"Collective name": "allreduce", "In msg nelems": 4096, "dtype": "BFloat16"})
    trace = load_trace(write(doc, tmp_path / "t.json"))
    dims, types = trace.cpu_ops.input_dims, trace.cpu_ops.input_types
    assert len(dims) == len(types) == len(trace.cpu_ops.ts_ns) == len(ops)
    assert len(dims.values) < 8  # a handful of distinct texts for every op of the trace
    assert dims.ids.dtype.itemsize == 4
    order = sorted(range(len(ops)), key=lambda i: ops[i]["ts"])  # the table keeps the file's order
    assert order == list(range(len(ops)))
    assert dims[5] == b"[[495552, 1, 576], []]" and types[5] == b'["c10::Float8_e4m3fn", ""]'  # the raw text
    assert trace.cpu_ops.collective[len(ops) - 1]["in_nelems"] == 4096 and trace.cpu_ops.collective[0] is None


def test_an_unreachable_ray_address_is_one_line_not_a_hang(tmp_path, capsys):
    pytest.importorskip("ray")
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    folder = _rank_folder(tmp_path, ranks=2)
    code, _, err = _cli(["analyze", str(folder), f"--ray=127.0.0.1:{port}"], capsys)
    assert code == 2 and "nothing answers at that address" in err and len(err.strip().splitlines()) == 1


def test_detectors_take_typed_inputs_not_the_report():
    from decodegap.findings import RankInput, RanksInput, collective_bound, kv_pool_cast

    path = FIXTURES / "cast_eager.json.gz"
    summary = analyze_file(path, AnalysisOptions()).summary
    found = kv_pool_cast.detect(RankInput(breakdown=summary.breakdown, has_gpu=True))
    assert [f.id for f in found] == ["kv_pool_cast"]
    assert found[0] == next(f for f in analyze_path(path).findings if f.id == "kv_pool_cast")
    ranks = RanksInput(main=summary.breakdown, device_name=None, rank_count=2, world_sizes=[],
                       collective_ms_by_rank={0: 0.0, 1: 0.0})
    assert collective_bound.detect(ranks) == []  # no collectives in this trace, no straggler
