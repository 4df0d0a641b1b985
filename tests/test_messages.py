"""A user's mistake gets one line that names it and the fix: from Python the parameter as Python spells it
(`tp=3`), on the command line the flag (`--tp 3`); exit code 2, never a traceback (issue 24)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import decodegap
from decodegap.errors import NAME_ONLY, ParameterError, UserError
from clitool import run_cli
from tracegen import decode_loop, write

ROOT = Path(__file__).parent.parent
CONFIGS = ROOT / "tests" / "fixtures" / "configs"
DEMO_RANK = CONFIGS / "glm5-demo-rank.json"
FIXTURE = ROOT / "tests" / "fixtures" / "traces" / "cast_eager.json.gz"


def one_line(args, capsys) -> str:
    code, out, err = run_cli(args, capsys)
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("decodegap: error:") and "Traceback" not in err, err
    return lines[0]


def api_error(**kwargs) -> str:
    with pytest.raises(UserError) as exc:
        decodegap.analyze(kwargs.pop("path", FIXTURE), **kwargs)
    message = str(exc.value)
    assert "--" not in message, f"a Python error names a flag: {message}"
    return message


def test_parameter_error_words_the_line_for_python_and_for_the_command_line():
    e = ParameterError("{tp} cannot shard 16 heads; {gpu} needs {model}", tp=3, gpu="h200", model=NAME_ONLY)
    assert str(e) == "tp=3 cannot shard 16 heads; gpu='h200' needs model="
    assert e.as_flags() == "--tp 3 cannot shard 16 heads; --gpu h200 needs --model"
    assert ParameterError("{tpot_ms}", tpot_ms=-1).as_flags({"tpot_ms": "--tpot"}) == "--tpot -1"
    assert ParameterError("{ray} or {ray__local}", ray="auto", ray__local=True).as_flags() == "--ray auto or --ray"
    assert str(ParameterError("{ray} or {ray__local}", ray="auto", ray__local=True)) == "ray='auto' or ray=True"


def test_tp_that_cannot_shard_the_heads(capsys):
    message = api_error(path=decodegap.EXAMPLE_TRACE, gpu="h200", tp=3)
    assert message.startswith("tp=3 cannot shard 16 attention heads") and "give one of 1, 2, 4, 8, 16" in message
    line = one_line(["analyze", "--example", "--gpu", "h200", "--tp", "3"], capsys)
    assert "error: --tp 3 cannot shard 16 attention heads" in line and "give one of 1, 2, 4, 8, 16" in line
    line = one_line(["floor", "--model", str(DEMO_RANK), "--gpu", "h200", "--tp", "3"], capsys)
    assert "error: --tp 3 cannot shard" in line


@pytest.mark.parametrize("flag,value", [("--batch", 10**400), ("--context", 10**400), ("--tp", 10**400),
                                        ("--batch", 10**20), ("--context", 100_000_001)])
def test_floor_counts_beyond_what_is_modelled(capsys, flag, value):
    # floor's --batch/--context had no upper bound: 10**400 reached float() in the floor (OverflowError traceback)
    line = one_line(["floor", "--model", str(DEMO_RANK), "--gpu", "h200", flag, str(value)], capsys)
    assert f"error: {flag}: " in line and "are modelled" in line and len(line) < 200
    name = flag.lstrip("-")
    assert api_error(path=decodegap.EXAMPLE_TRACE, **{name: value}).startswith(f"{name}=: ")


@pytest.mark.parametrize("kwargs,starts", [
    ({"context": "2048"}, "context='2048': the KV tokens per sequence must be a whole number of at least 0, not a str"),
    ({"context": 2048.5}, "context=2048.5: the KV tokens per sequence must be a whole number"),
    ({"batch": 0}, "batch=0: the sequences per step must be a whole number of at least 1"),
    ({"tp": "8"}, "tp='8': the tensor-parallel ranks must be a whole number of at least 1, not a str"),
    ({"tp": True}, "tp=True: the tensor-parallel ranks must be a whole number"),
    ({"jobs": 0}, "jobs=0: give a number of parallel workers of at least 1"),
    ({"tpot_ms": -1.0}, "tpot_ms=-1.0: not a time in ms"),
    ({"allreduce_us": float("nan")}, "allreduce_us=nan: not a latency in us"),
    ({"gpu": 200}, "gpu=200: give a name (a str)"),
    ({"model": 3}, "model=3: give a path"),
    ({"ray": 5}, "ray=5: give True (a local Ray) or a cluster address"),
    ({"path": None}, "path=None: give the trace's path"),
])
def test_api_errors_name_the_parameter(kwargs, starts):
    assert api_error(**kwargs).startswith(starts)


def test_model_gpu_weights_kv_in_python_and_on_the_command_line(capsys):
    assert api_error(gpu="h200").startswith("gpu='h200' needs model= (the floor is computed from")
    assert "error: --gpu h200 needs --model (" in one_line(["analyze", str(FIXTURE), "--gpu", "h200"], capsys)
    assert api_error(model=DEMO_RANK, gpu="h9000").startswith("gpu='h9000': unknown GPU; known: h100")
    line = one_line(["analyze", str(FIXTURE), "--model", str(DEMO_RANK), "--gpu", "h9000"], capsys)
    assert "error: --gpu h9000: unknown GPU; known: h100" in line and "--bandwidth" not in line  # analyze has none
    line = one_line(["floor", "--model", str(DEMO_RANK), "--gpu", "h9000"], capsys)
    assert line.endswith("or --bandwidth and --tflops for a GPU not in the table")
    assert api_error(model=DEMO_RANK, weights="fp5").startswith("weights='fp5': unknown weight format; known: bf16")
    assert "error: --weights fp5: unknown weight format" in one_line(
        ["floor", "--model", str(DEMO_RANK), "--gpu", "h200", "--weights", "fp5"], capsys)
    assert api_error(model=DEMO_RANK, kv="int3").startswith("kv='int3': unknown KV-cache dtype")
    assert "error: --kv int3: unknown KV-cache dtype" in one_line(
        ["floor", "--model", str(DEMO_RANK), "--gpu", "h200", "--kv", "int3"], capsys)


def test_model_flags_without_a_model_are_refused_not_ignored(capsys):
    # --quant, --weights, --kv and --allreduce-us without --model (and without --gpu) were dropped silently: exit 0,
    # no warning, even for a --quant path that does not exist
    for flag, value in (("--quant", "/nonexistent/hf_quant_config.json"), ("--weights", "fp8"), ("--kv", "fp8"),
                        ("--allreduce-us", "3")):
        line = one_line(["analyze", str(FIXTURE), flag, value], capsys)
        assert f"error: {flag} " in line and "needs --model" in line
    assert api_error(weights="fp8").startswith("weights='fp8' needs model=")


def test_annotate_of_a_folder_into_a_file_name_is_refused_before_any_work(tmp_path, capsys):
    folder = tmp_path / "ranks"
    folder.mkdir()
    write(decode_loop(steps=4, layers=2, rank=0), folder / "rank-0.json")
    for name in ("out.json.gz", "out.json"):
        out = tmp_path / name
        line = one_line(["analyze", str(folder), "--annotate", str(out)], capsys)
        assert f"error: --annotate {out}: names a file, but the input is a folder of traces: give a folder" in line
        assert not out.exists()  # no folder named out.json.gz
        with pytest.raises(UserError, match=r"^out='.*out\.json(\.gz)?': names a file"):
            decodegap.api.annotate(folder, out)
        assert not out.exists()
    written = decodegap.api.annotate(folder, tmp_path / "annotated")
    assert written == [tmp_path / "annotated" / "rank-0.json"]


def test_ray_auto_without_a_cluster_is_decodegaps_own_line(tmp_path, capsys, monkeypatch):
    pytest.importorskip("ray")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    folder = tmp_path / "ranks"
    folder.mkdir()
    shutil.copy(FIXTURE, folder / "host.1.rank-0.pt.trace.json.gz")
    line = one_line(["analyze", str(folder), "--ray", "auto"], capsys)
    assert "error: --ray auto: found no running Ray cluster to join; start one (ray start --head), or give --ray " \
           "(no address) for a local Ray for this run" in line, line
    assert "--address" not in line  # Ray's own CLI flag, which decodegap does not have
    with pytest.raises(UserError, match=r"^ray='auto': found no running Ray cluster .* give ray=True"):
        decodegap.analyze(folder, ray="auto")


def test_every_parameter_an_error_names_is_a_flag_of_the_command_line():
    # the names ParameterError is called with (keywords in the source, and the counts check_counts words) are each
    # a real option of some command, spelled as commands.FLAGS maps it (default: --name-with-dashes)
    import ast
    import importlib

    from decodegap.cli import COMMAND_MODULES
    from decodegap.commands import FLAGS
    from decodegap.floor.floor import COUNTS

    names = set(COUNTS) | {"model", "quant", "weights", "kv", "gpu", "tpot_ms", "allreduce_us", "bandwidth_gbps",
                           "tflops"}  # the ones passed as **{name: value}
    for source in (ROOT / "src" / "decodegap").rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "ParameterError":
                names |= {k.arg.split("__")[0] for k in node.keywords if k.arg}
    options = {opt for module in COMMAND_MODULES.values()
               for p in importlib.import_module(module).command.params for opt in p.opts + p.secondary_opts}
    python_only = {"path"}  # the CLI's TRACE argument is a path by construction
    missing = {n: FLAGS.get(n, "--" + n.replace("_", "-")) for n in names - python_only}
    missing = {n: f for n, f in missing.items() if f not in options}
    assert not missing, f"parameters whose flag does not exist (add them to decodegap.commands.FLAGS): {missing}"


# --- what the run assumed, in the report ------------------------------------------------------------------------

def _assumed(a) -> dict:
    return {x.name: (x.value, x.reason) for x in a.assumed}


def test_a_copy_of_the_bundled_example_is_recognised_by_its_content(tmp_path):
    copy = tmp_path / "renamed.json.gz"
    shutil.copy(decodegap.EXAMPLE_TRACE, copy)
    original, copied = decodegap.analyze(decodegap.EXAMPLE_TRACE), decodegap.analyze(copy)
    assert _assumed(copied) == _assumed(original)
    assert _assumed(copied)["model"][0] == "example_model_config.json"
    assert _assumed(copied)["context"][0] == 2048
    assert copied.findings[0].evidence.as_dict() == \
        original.findings[0].evidence.as_dict()
    assert copied.findings[0].evidence["matches_model_kv_width"] is True
    # a file of the same size but other bytes is not the example
    other = tmp_path / "other.json.gz"
    data = bytearray(decodegap.EXAMPLE_TRACE.read_bytes())
    data[-9] ^= 1  # inside the gzip trailer's CRC: same size, other bytes
    other.write_bytes(bytes(data))
    assert not decodegap.api.is_example(other)


def test_model_keeps_the_examples_context_and_the_report_says_which_context(capsys):
    with_model = decodegap.analyze(decodegap.EXAMPLE_TRACE, model=DEMO_RANK, gpu="h200")
    assert with_model.floor.context == 2048  # --model does not move the context to the floor's default
    assert set(_assumed(with_model)) == {"context", "batch"}
    assert _assumed(with_model)["context"] == (2048, "the bundled example's active KV tokens per sequence")
    given = decodegap.analyze(decodegap.EXAMPLE_TRACE, model=DEMO_RANK, gpu="h200", context=4096, batch=1)
    assert given.floor.context == 4096 and given.assumed == []
    code, out, _ = run_cli(["analyze", "--example", "--model", str(DEMO_RANK), "--gpu", "h200"], capsys)
    assert code == 0
    assert ("assumed (not given): context 2048, the bundled example's active KV tokens per sequence; batch 1, "
            "the floor's default") in out


def test_the_floors_default_context_is_stated(tmp_path):
    a = decodegap.analyze(FIXTURE, model=DEMO_RANK, gpu="h200")
    assert a.floor.context == 4096
    assert _assumed(a)["context"][0] == 4096 and "default" in _assumed(a)["context"][1]
    assert decodegap.analyze(FIXTURE).assumed == []  # nothing taken, nothing said


# --- a file named for one thing and holding another ------------------------------------------------------------

def test_floor_of_a_trace_says_it_is_a_trace_not_a_config(tmp_path, capsys):
    line = one_line(["floor", "--model", str(FIXTURE), "--gpu", "h200"], capsys)
    assert "cast_eager.json.gz: a gzipped profiler trace, not a model config (config.json); give the config.json " \
           "file (or its folder); traces are for decodegap analyze" in line
    plain = write(decode_loop(steps=2, layers=2), tmp_path / "trace.json")
    assert "trace.json: a profiler trace, not a model config" in one_line(
        ["floor", "--model", str(plain), "--gpu", "h200"], capsys)
    gz = tmp_path / "data.json.gz"
    import gzip

    gz.write_bytes(gzip.compress(b'{"a": '))
    assert "data.json.gz: a gzip file, not a model config" in one_line(["floor", "--model", str(gz)], capsys)
    binary = tmp_path / "config.json"
    binary.write_bytes(bytes(range(256)) * 4)
    assert "config.json: a binary file, not a model config" in one_line(["floor", "--model", str(binary)], capsys)


def test_a_text_file_named_gz_is_said_to_be_not_gzip(tmp_path, capsys):
    text = tmp_path / "t.json.gz"
    text.write_text("hello\n")
    line = one_line(["analyze", str(text)], capsys)
    assert "t.json.gz: not a JSON trace" in line
    assert line.endswith("the file is plain text, not gzip despite its .gz name")
    line = one_line(["floor", "--model", str(text), "--gpu", "h200"], capsys)
    assert "t.json.gz: plain text, not gzip despite its .gz name, and malformed JSON (Expecting value at line 1 " \
           "column 1), not a model config" in line
    assert "plain text, not gzip" in one_line(["diff", str(text), str(FIXTURE)], capsys)


def test_malformed_json_is_called_malformed(tmp_path, capsys):
    import gzip

    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(gzip.compress(b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 2}, oops]}'))
    line = one_line(["analyze", str(bad)], capsys)
    # the streaming reader skips the element it cannot read and says so; nothing readable is left
    assert "bad.json.gz: the trace has no profiler events" in line and "not readable JSON" in line
    assert "not gzip" not in line
    config = tmp_path / "config.json"
    config.write_text('{"hidden_size": 8,}')
    assert "config.json: malformed JSON (Expecting property name enclosed in double quotes at line 1 column 19), " \
           "not a model config" in one_line(["floor", "--model", str(config)], capsys)


def test_a_cpu_only_trace_without_shapes_says_what_it_loses(tmp_path):
    # issue 24: `record` of a CPU-only program without --record-shapes (its default) counts the demo's ops by name
    # alone: 8 layers for its 4, and no kv_pool_cast. The report says so and names the flag.
    from decodegap.findings.profiler_check import NO_SHAPES_WARNING

    doc = decode_loop(steps=3, layers=2)
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e["cat"] in ("cpu_op", "user_annotation")]
    with_shapes = decodegap.analyze(write(doc, tmp_path / "shapes.json"))
    assert NO_SHAPES_WARNING not in with_shapes.warnings
    for e in doc["traceEvents"]:
        for key in ("Input Dims", "Input type"):
            e.get("args", {}).pop(key, None)
    without = decodegap.analyze(write(doc, tmp_path / "no_shapes.json"))
    assert NO_SHAPES_WARNING in without.warnings
    assert "--record-shapes" in NO_SHAPES_WARNING and "record_shapes=True" in NO_SHAPES_WARNING
    # GPU traces keep their launch shapes: no such warning
    gpu = decode_loop(steps=3, layers=2)
    for e in gpu["traceEvents"]:
        e.get("args", {}).pop("Input Dims", None)
    assert NO_SHAPES_WARNING not in decodegap.analyze(write(gpu, tmp_path / "gpu.json")).warnings
