"""The demo model and `decodegap demo` on a CPU: the three KV reads agree, and the report names kv_pool_cast."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from decodegap.cli import main
from decodegap.demo import FULL, TINY, make_config

torch = pytest.importorskip("torch")

INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@pytest.fixture(autouse=True)
def one_thread():
    # Tiny ops on a shared 2-core machine: OpenMP threads only spin against each other.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def step_logits(kv_read: str, **geometry) -> tuple[torch.Tensor, torch.Tensor]:
    from decodegap.demo.model import DemoModel

    model = DemoModel(make_config("tiny", kv_read=kv_read, **geometry))
    logits = model.step().clone()
    return logits, model.tokens.clone()


@pytest.mark.parametrize("kv_dtype", ["fp8", "bf16"])
def test_gather_cast_matches_full_cast_exactly(kv_dtype):
    # Same bf16 values, same bf16 matmuls: only which rows get cast differs.
    full, full_tok = step_logits("full_cast", layers=2, pool_slots=4096, kv_dtype=kv_dtype)
    gather, gather_tok = step_logits("gather_cast", layers=2, pool_slots=4096, kv_dtype=kv_dtype)
    assert torch.equal(full, gather)
    assert torch.equal(full_tok, gather_tok)
    assert full.abs().max() > 0.5  # a live signal, not zeros


@pytest.mark.skipif(not INTERPRETED, reason="fused on a CPU needs TRITON_INTERPRET=1 (the Makefile sets it)")
def test_fused_matches_full_cast_within_bf16():
    full, _ = step_logits("full_cast", layers=2, pool_slots=4096, context=200, batch=2)
    fused, fused_tok = step_logits("fused", layers=2, pool_slots=4096, context=200, batch=2)
    # Different accumulation order and bf16 rounding of the attention output, through 2 layers and lm_head.
    torch.testing.assert_close(fused, full, atol=0.1, rtol=0.05)
    for b in range(2):  # greedy choice: the fused pick is (near-)optimal under full_cast's logits
        assert full[b, fused_tok[b]] >= full[b].max() - 0.1


def test_cuda_graph_needs_cuda(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--device", "cpu", "--cuda-graph"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip() == "decodegap: error: --cuda-graph needs a CUDA device"


def test_context_must_fit_the_pool(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--device", "cpu", "--pool-slots", "1000", "--context", "2000"])
    assert exc.value.code == 2
    assert "must fit in the pool (1,000 slots)" in capsys.readouterr().err


def test_full_geometry_is_the_incident():
    assert (FULL.layers, FULL.pool_slots, FULL.kv_width, FULL.context) == (78, 495_552, 576, 2048)
    assert FULL.pool_bytes_per_layer * FULL.layers == 22_264_160_256  # 22 GB of FP8 pool on one H200
    assert FULL.sm_scale == 1 / 16
    assert TINY.pool_slots >= 16384  # a pool the kv_pool_cast detector recognises as one


def test_import_does_not_load_torch():
    code = "import sys, decodegap.demo, decodegap.commands.demo; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_demo_cpu_names_kv_pool_cast(tmp_path, capsys):
    main(["demo", "--device", "cpu", "--layers", "2", "--steps", "2", "--warmup", "1", "--timed", "2",
          "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "2 decode forwards; 2 layers" in out
    assert "[kv_pool_cast] 2 times per step, once per layer (2 layers)" in out
    assert "[24576, 1, 576] fp8_e4m3 -> bf16" in out
    assert "for 256 active tokens" in out
    traces = list(tmp_path.glob("*.decodegap.pt.trace.json.gz"))
    assert len(traces) == 1


def test_demo_compare_cpu(tmp_path, capsys):
    main(["demo", "--compare", "--device", "cpu", "--layers", "2", "--steps", "2", "--warmup", "1", "--timed", "2",
          "--out", str(tmp_path), "--markdown", str(tmp_path / "table.md")])
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines() if line.split()[:1] in
            (["full_cast"], ["gather_cast"], ["fused"])}
    assert "kv_pool_cast" in rows["full_cast"]
    assert "kv_pool_cast" not in rows["gather_cast"]
    interpreted = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")  # read now: other tests may set it
    assert set(rows) == ({"full_cast", "gather_cast", "fused"} if interpreted else {"full_cast", "gather_cast"})
    assert "1.00x" in rows["full_cast"]
    assert (tmp_path / "table.md").read_text().startswith("| kv read | ms/step | tok/s |")
    assert len(list(tmp_path.glob("*/*.decodegap.pt.trace.json.gz"))) == len(rows)
    # and the diff of each fix's trace against full_cast's: the pool cast is gone
    assert out.count("decodegap diff:") == len(rows) - 1
    assert "findings gone: kv_pool_cast" in out
