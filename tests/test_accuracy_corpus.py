"""The accuracy corpus (issue 20): every real H200 trace in tests/fixtures/traces/corpus is read right.

Each trace has a truth file written by its generator (scripts/make_accuracy_corpus.py, from hooks and loop counters,
never from decodegap). A row is right when the steps by phase, the layer count, the sorted layer-kind counts and the
workload all equal the truth, or, for a cut file with no whole step left, when analyze refuses it with UserError.
The rules live in benchmarks/bench_accuracy.py (one row per trace, `accuracy: R/N traces right`)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "fixtures" / "traces" / "corpus"
_spec = importlib.util.spec_from_file_location("bench_accuracy", ROOT / "benchmarks" / "bench_accuracy.py")
bench = importlib.util.module_from_spec(_spec)
sys.modules["bench_accuracy"] = bench  # dataclasses look their module up
_spec.loader.exec_module(bench)

TRUTHS = sorted(CORPUS.glob("*.truth.json"))

# Read wrong today (issue 20 stays open for them): each is a strict xfail, so a fix that makes one right fails here
# until it is taken off this list. Steps are right in all of them; the layer count or its kinds are not.
KNOWN_WRONG: dict[str, str] = {}  # name -> why, for a trace still read wrong (a strict xfail)
# The five ways step detection used to fail silently (issue 20), each on a trace the project made itself.
FAILURE_CLASSES = {
    "eager MoE launches a different number of kernels every step": ["mixtral_eager_generate", "qwen3_moe_sample_padded",
                                                                  "olmoe_hand", "qwen2_moe_eager_generate"],
    "unlike layers (dense + MoE, sliding + full attention)": [
        "deepseek_v3_eager_generate", "deepseek_v3_deep_nomarkers", "glm4_moe_profstep_hand", "gemma2_eager_generate",
        "gpt_oss_eager_generate", "gemma3_sample_padded", "lfm2_eager_generate", "qwen3_next_eager_generate",
        "jamba_eager_generate"],
    "a deep eager stack without markers": ["gpt_neox_deep_nomarkers", "llama_deep_nomarkers"],
    "training without ProfilerStep": ["olmo2_train_nomarkers"],
    "a cut trace": ["cut_keeps_few_steps", "cut_almost_no_kernels"],
}


def test_corpus_is_there():
    assert len(TRUTHS) >= 44
    for t in TRUTHS:
        assert (CORPUS / t.name.replace(".truth.json", ".json.gz")).exists(), t.name


def _params():
    for t in TRUTHS:
        name = t.name.replace(".truth.json", "")
        marks = [pytest.mark.xfail(strict=True, reason=KNOWN_WRONG[name])] if name in KNOWN_WRONG else []
        yield pytest.param(t, id=name, marks=marks)


@pytest.mark.parametrize("truth", list(_params()))
def test_trace_read_right(truth):
    row = bench.evaluate(str(truth))
    assert row.ok, (
        f"{row.name} ({row.family}, {row.loop}): wrong {', '.join(row.why)}; want steps {row.want_steps} layers "
        f"{row.want_layers} kinds {row.want_kinds} workload {row.want_workload}"
        + (" (a UserError)" if row.expect_error else "")
        + f"; got steps {row.got_steps} layers {row.got_layers} kinds {row.got_kinds} workload {row.got_workload}"
        + (f" error {row.got_error}" if row.got_error else "")
        + (f"; warnings {row.warnings}" if row.warnings else ""))


@pytest.mark.parametrize("failure", list(FAILURE_CLASSES))
def test_each_former_failure_class_is_read_right(failure):
    for name in FAILURE_CLASSES[failure]:
        assert name not in KNOWN_WRONG
        row = bench.evaluate(str(CORPUS / f"{name}.truth.json"))
        assert row.ok, f"{failure}: {name} wrong {', '.join(row.why)}"


def test_the_known_wrong_are_in_the_corpus():
    names = {t.name.replace(".truth.json", "") for t in TRUTHS}
    assert set(KNOWN_WRONG) <= names

