"""The gap ledger maps measured kernels onto the floor's components, never lets a row beat its floor silently,
and shows in every format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from decodegap.pipeline import AnalysisOptions, analyze_path
from decodegap.cli import main
from decodegap.commands.analyze import example_path
from decodegap.demo.config import FULL
from decodegap.floor.ledger import _decompose, prepare_model_options
from decodegap.floor import load_model

CONFIGS = Path(__file__).parent / "fixtures" / "configs"
DEMO_RANK = CONFIGS / "glm5-demo-rank.json"  # the model the bundled example really ran: one TP-8 rank of GLM-5
CAST = Path(__file__).parent / "fixtures" / "traces" / "mla_cast_eager_2steps.json.gz"


def _report(trace, config, gpu="h200", tp=1, context=2048):
    options = prepare_model_options(AnalysisOptions(), config, None, None, None, gpu, tp, 1, context, None)
    return analyze_path(trace, options)  # without a GPU, the floor for the one the trace names


def test_demo_rank_config_is_the_demo_geometry():
    g = load_model(DEMO_RANK)
    assert (g.num_layers, g.num_dense_layers, g.hidden, g.num_heads, g.q_lora_rank) == (
        FULL.layers, FULL.dense_layers, FULL.hidden, FULL.heads, FULL.q_lora)
    assert (g.num_experts, g.experts_per_token, g.moe_intermediate, g.intermediate, g.vocab) == (
        FULL.experts, FULL.top_k, FULL.moe_intermediate, FULL.dense_intermediate, FULL.vocab)
    assert g.kv_width == FULL.kv_width and not g.has_indexer


def test_example_every_big_floor_component_is_matched_and_none_beats_its_floor():
    # issue 13: the example showed moe 0.000 ms vs floor 9.486 and attention 0.000 vs 0.055; experts run as
    # plain GEMMs (bmm) under CUDA-graph replay: no op names, no shapes, only calls per step.
    report = _report(example_path(), DEMO_RANK)
    gap = report.gap
    floor = report.floor
    big = [c.name for c in floor.components if c.ms >= 0.5]
    assert set(big) == {"attention_weights", "experts"}
    rows = [r for r in gap.rows if r.components]
    from decodegap.floor.ledger import COMPONENT_OF

    for name in big:
        row = next(r for r in rows if COMPONENT_OF[name] in r.components)
        assert row.measured_ms > row.floor_ms > 0.5
        assert row.mapping == "coarse"
    assert not any(r.beats_floor for r in gap.rows)
    assert gap.warnings == []
    experts = next(r for r in rows if "experts" in r.components)
    assert experts.measured_ms == pytest.approx(2.24, abs=0.05)  # 75-per-step GEMMs (+ their share of 153)


def test_a_floor_the_trace_beats_is_flagged():
    # the example is one rank of 8; against the whole GLM-5 on one GPU its GEMMs take less than the floor allows
    report = _report(example_path(), CONFIGS / "glm-5-nvfp4" / "config.json", tp=1)
    beaten = [r for r in report.gap.rows if r.beats_floor]
    assert beaten and all(r.measured_ms < r.floor_ms for r in beaten)
    ledger_warnings = [w for w in report.warnings if w.startswith("gap ledger:")]
    assert len(ledger_warnings) == len(beaten) and "below its floor" in ledger_warnings[0]
    assert any("does not fit" in w for w in report.warnings)  # 744B in BF16 on one H200


def test_shapes_place_lm_head_and_experts_in_eager_traces():
    report = _report(CAST, DEMO_RANK)
    rows = {tuple(r.components): r for r in report.gap.rows}
    assert rows[("lm_head",)].mapping == "shape" and rows[("lm_head",)].measured_ms > 0.05
    assert rows[("experts",)].mapping == "shape" and rows[("experts",)].measured_ms > 1.0


def test_a_single_rank_trace_has_no_all_reduce_and_says_so():
    report = _report(example_path(), DEMO_RANK, tp=8)
    row = next(r for r in report.gap.rows if r.components == ["allreduce"])
    assert row.measured_ms == 0 and row.beats_floor
    assert any("no collectives" in w for w in report.warnings)


def test_calls_per_step_decompose_by_layer_kinds():
    attn, moe, dense, head = (frozenset({n}) for n in ("attn", "moe", "dense", "head"))
    periods = [(78, attn), (75, moe), (3, dense), (1, head)]
    assert _decompose(153, periods) == [(78, attn), (75, moe)]
    assert _decompose(81, periods) == [(78, attn), (3, dense)]  # not 75 + 2 x 3
    assert _decompose(156, periods) == [(156, attn)]
    assert _decompose(1, periods) == [(1, head)]
    assert _decompose(7, [(78, attn), (75, moe), (1, head)]) is None


def run_cli(args, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(args)
        raise SystemExit(0)
    out = capsys.readouterr()
    return exit_info.value.code, out.out


@pytest.mark.parametrize("fmt,marker", [("text", "GAP LEDGER"), ("md", "### Gap ledger"),
                                        ("html", "<h2>Gap ledger</h2>"), ("json", '"gap"')])
def test_every_format_shows_the_ledger(fmt, marker, capsys):
    # --model without --gpu: the GPU comes from the trace's deviceProperties (NVIDIA H200)
    code, out = run_cli(["analyze", "--example", "--model", str(DEMO_RANK), "--format", fmt], capsys)
    assert code == 0 and marker in out
    if fmt == "json":
        gap = json.loads(out)["gap"]
        assert gap["gpu"] == "h200" and all("mapping" in r for r in gap["rows"])
    else:
        assert "experts + shared_experts" in out and "coarse" in out


def test_no_gpu_in_the_trace_gives_a_warning_not_a_floor(tmp_path):
    from tracegen import decode_loop, write

    for device, says in ((None, "names no GPU"), ("Tesla V100-SXM2-32GB", "not in the GPU table")):
        doc = decode_loop(steps=3, layers=4)
        doc["deviceProperties"] = [{"id": 0, "name": device}] if device else []
        report = _report(write(doc, tmp_path / "t.json"), CONFIGS / "llama-3.1-8b.json", gpu=None)
        assert report.gap is None and any(says in w for w in report.warnings)
    doc = decode_loop(steps=3, layers=4)  # NVIDIA H200 in its deviceProperties
    assert _report(write(doc, tmp_path / "h.json"), CONFIGS / "llama-3.1-8b.json", gpu=None).gap.gpu == "h200"


def test_a_cpu_only_trace_gets_no_ledger(tmp_path):
    from tracegen import decode_loop, write

    doc = decode_loop(steps=3, layers=4, markers="cpu")
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") not in ("kernel", "gpu_user_annotation")]
    report = _report(write(doc, tmp_path / "cpu.json"), CONFIGS / "llama-3.1-8b.json", gpu="h100")
    assert report.gap is None and report.floor is not None
    assert any("no gap ledger" in w for w in report.warnings)


def test_the_launching_op_places_a_plain_gemm(tmp_path):
    from tracegen import decode_loop, write

    doc = decode_loop(steps=3, layers=4)
    for e in doc["traceEvents"]:
        if e.get("cat") == "cpu_op" and e["name"] == "aten::mm":
            e["name"] = "aten::_grouped_mm"
    report = _report(write(doc, tmp_path / "g.json"), CONFIGS / "qwen3-30b-a3b.json", gpu="h200", context=None)
    experts = next(r for r in report.gap.rows if "experts" in r.components)
    assert experts.mapping == "op" and experts.measured_ms > 0


def test_bundled_example_config_is_the_rank_it_ran():
    # `analyze --example` reads the config that travels with the trace: the demo's rank, so the ledger holds
    ex = json.loads(example_path("example_model_config.json").read_text())
    assert ex == json.loads(DEMO_RANK.read_text())
    report = _report(example_path(), example_path("example_model_config.json"), tp=1)
    assert not [r for r in report.gap.rows if r.beats_floor]


def test_the_floor_and_the_ledger_show_one_value(capsys):
    # issue 24: the floor was rounded to 6 decimals and the ledger to 4, so 4.7855467 showed as 4.786 and 4.785
    import re

    from clitool import run_cli

    import decodegap

    config = Path(__file__).parent / "fixtures" / "configs" / "deepseek-r1.json"
    a = decodegap.analyze(decodegap.EXAMPLE_TRACE, model=config, gpu="h100", tp=4, context=4096)
    assert a.floor.floor_ms == a.gap.floor_ms == pytest.approx(4.7855, abs=1e-4)
    code, out, _ = run_cli(["analyze", "--example", "--model", str(config), "--gpu", "h100", "--tp", "4",
                            "--context", "4096"], capsys)
    assert code == 0
    shown = set(re.findall(r"floor (\d+\.\d+) ms", out))
    assert shown == {"4.786"}, shown
    code, out, _ = run_cli(["floor", "--model", str(config), "--gpu", "h100", "--tp", "4", "--context", "4096"],
                           capsys)
    assert "floor 4.786 ms/step" in out
