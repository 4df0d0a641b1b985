"""Continuous batching packs every sequence's tokens into one row (steps.phase.packed_mixed / packed_decode): on a real
H100 trace of transformers' ContinuousBatchingManager whose generator logged each forward's requests, and on the
shapes of a speculative extend, which looks like a packed decode alone."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from decodegap.steps.classify import _packed
from decodegap.steps.phase import StepTokens, packed_decode, packed_mixed
from decodegap.steps.step import Piece
from decodegap.steps.steps import find_steps
from decodegap.trace.link import link
from decodegap.trace.load import load_trace

BASE = Path(__file__).parent / "fixtures" / "traces" / "qwen3_continuous_batching_6forwards"


def test_packed_rows_read_as_prefill_mixed_and_decode():
    """Six forwards: 3 prompts (32 tokens), then 3 forwards of decodes beside the prompt tokens of a request that
    joined (18, 13, 18 tokens), then 2 forwards of 5 decoding requests (5 tokens): every one had been read as a
    prefill. Each phase, in order, and each forward's sequences are the generator's."""
    truth = json.loads(BASE.with_suffix(".truth.json").read_text())
    trace = load_trace(BASE.with_suffix(".json.gz"))
    steps = find_steps(trace, link(trace)).steps
    want = truth["each_forward"]
    assert [s.kind for s in steps] == [f["phase"] for f in want] == ["prefill"] + ["mixed"] * 3 + ["decode"] * 2
    assert [s.batch for s in steps] == [len(f["requests"]) for f in want] == [3, 3, 4, 5, 5, 5]
    assert [s.tokens for s in steps] == [f["tokens"] for f in want]


def _pieces(n: int) -> list[Piece]:
    return [Piece(i, i + 1, np.array([i])) for i in range(n)]


def test_speculative_extends_are_not_packed_decodes():
    """Prompt-lookup decoding's forwards (shapes of a real llama trace): a prefill sampling the candidates' 5 tokens,
    a decode, then extends whose every token is sampled. Alone, a row whose every token is sampled is one sequence's
    extend; only a trace that packs sequences (a forward of decodes beside prompt tokens) reads it as decodes."""
    tokens = [StepTokens(20, 20, 20, 1, 5), StepTokens(1, 1, 17, 1, 1), StepTokens(2, 2, 19, 1, 2),
              StepTokens(5, 5, 27, 1, 5)]
    evidence = ["prefill", "decode", "prefill", "prefill"]
    assert _packed(_pieces(4), tokens, evidence) == (evidence, set())
    mixed = StepTokens(18, 18, 50, 1, 3)  # 3 sequences sampled from 18 tokens, attending to 50 keys
    read, rows = _packed(_pieces(5), tokens + [mixed], evidence + ["prefill"])
    assert read == ["prefill", "decode", "decode", "decode", "mixed"]
    assert rows == {0, 2, 3, 4}


def test_a_cross_attention_projection_is_no_packed_row():
    """A Whisper-style decoder's first forward: 4 forced tokens sampled at every position, its widest projection the
    cross-attention's keys and values over the encoder's 1,500 states (30 s of audio), attention reaching those
    states. The projections' rows are not the row's tokens (the attention's 4 queries): no packed sequences."""
    whisper = StepTokens(gemm_rows=1500, query_len=4, kv_len=1500, batch=1, head_rows=4)
    assert not packed_mixed(whisper) and not packed_decode(whisper)
    packed = StepTokens(gemm_rows=18, query_len=18, kv_len=50, batch=1, head_rows=3)
    assert packed_mixed(packed) and not packed_decode(packed)
