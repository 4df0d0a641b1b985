"""MLA decode over a paged KV cache: every path against the float32 oracle, on fresh random inputs each run.

Runs on the CPU (Triton through TRITON_INTERPRET=1) or on a GPU: DECODEGAP_TEST_DEVICE=cuda|cpu, default cuda
when available. Unused cache slots and table entries hold poison (NaN rows, out-of-range page ids) that a
correct kernel never reads; outputs and split workspaces start as NaN so every element must be written.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass

import pytest

torch = pytest.importorskip("torch")

DEVICE = os.environ.get("DECODEGAP_TEST_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the triton module is first imported

from decodegap.kernels import mla_decode  # noqa: E402
from decodegap.kernels.mla_decode import HEAD_DIM, LATENT_DIM  # noqa: E402

FP8 = torch.float8_e4m3fn
BF16 = torch.bfloat16
SM_SCALE = 1 / 16  # GLM-5: 1/sqrt(192 + 64)
REL_TOL = 2e-2

needs_cuda = pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA device")


def needs_triton() -> None:
    pytest.importorskip("triton")


@dataclass
class Case:
    q: torch.Tensor
    kv_cache: torch.Tensor
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    kv_scale: float


def make_case(batch: int, heads: int, page_size: int, kv_dtype: torch.dtype, lens: list[int],
              kv_scale: float, device: str = DEVICE, spare_pages: int = 3) -> Case:
    """Random q and live rows (cached as x / kv_scale); pages in shuffled order; everything else poisoned."""
    max_pages = max(-(-max(lens) // page_size), 1) + 1  # one spare column: a dead entry past every end
    num_pages = sum(-(-n // page_size) for n in lens) + spare_pages
    cache = torch.full((num_pages, page_size, HEAD_DIM), float("nan"), device=device).to(kv_dtype)
    table = torch.full((batch, max_pages), num_pages + 7, dtype=torch.int32, device=device)  # dead: out of range
    perm = torch.randperm(num_pages, device=device)
    used = 0
    for b, n in enumerate(lens):
        need = -(-n // page_size)
        pages = perm[used:used + need]
        used += need
        table[b, :need] = pages.int()
        rows = torch.randn(need * page_size, HEAD_DIM, device=device) * 0.5 / kv_scale
        slots = cache[pages].reshape(-1, HEAD_DIM)
        slots[:n] = rows[:n].to(kv_dtype)  # slots past the end of the last page keep their NaN poison
        cache[pages] = slots.reshape(need, page_size, HEAD_DIM)
    q = torch.randn(batch, heads, HEAD_DIM, device=device).to(BF16)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    return Case(q, cache, table, seq_lens, kv_scale)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30)).item()


def check_against_reference(case: Case, out: torch.Tensor, lse: torch.Tensor | None = None,
                            lse_atol: float = 2e-3) -> None:
    ref, ref_lse = mla_decode(case.q, case.kv_cache, case.block_table, case.seq_lens, SM_SCALE,
                              kv_scale=case.kv_scale, impl="reference", return_lse=True)
    assert out.shape == (case.q.shape[0], case.q.shape[1], LATENT_DIM) and out.dtype == BF16
    assert torch.isfinite(out.float()).all(), "an output element was not written (or NaN poison leaked in)"
    assert rel_err(out, ref) < REL_TOL
    empty = case.seq_lens == 0
    assert (out[empty].float() == 0).all()
    if lse is not None:
        assert lse.shape == ref_lse.shape and lse.dtype == torch.float32
        assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse))
        live = ~torch.isinf(ref_lse)
        assert torch.allclose(lse[live], ref_lse[live], rtol=1e-3, atol=lse_atol)


# (batch, heads, page_size, kv dtype, lengths, kv_scale, forced split count or None for the heuristic)
CASES = [
    (1, 8, 1, FP8, [1], 1.0, None),                    # one token, token-slot layout
    (3, 16, 16, FP8, [37, 1, 100], 0.37, 3),           # odd lengths, several pages and splits
    (3, 64, 64, BF16, [130, 65, 7], 2.5, None),        # bf16 cache, pages of 64, GLM-5 head count
    (1, 128, 16, FP8, [77], 0.5, 4),                   # DeepSeek head count: several head blocks
    (3, 8, 64, FP8, [200, 129, 3], 0.37, 5),           # some splits of the short sequence are empty
    (1, 16, 1, BF16, [150], 1.0, None),                # token slots, heuristic split
    (3, 128, 1, FP8, [9, 33, 0], 1.7, 2),              # an empty sequence
    (3, 16, 64, FP8, [1, 64, 65], 1.0, 1),             # no split: the single-pass store, page boundaries
]
IDS = [f"B{c[0]}-H{c[1]}-ps{c[2]}-{'fp8' if c[3] == FP8 else 'bf16'}-S{c[6]}" for c in CASES]


@pytest.mark.parametrize("batch,heads,page_size,kv_dtype,lens,kv_scale,num_splits", CASES, ids=IDS)
def test_triton_matches_reference(batch, heads, page_size, kv_dtype, lens, kv_scale, num_splits):
    needs_triton()
    from decodegap.kernels.mla_decode_triton import mla_decode_triton

    case = make_case(batch, heads, page_size, kv_dtype, lens, kv_scale)
    want_lse = batch == 3
    if num_splits is None:  # the public entry, with its own split heuristic
        res = mla_decode(case.q, case.kv_cache, case.block_table, case.seq_lens, SM_SCALE,
                         kv_scale=kv_scale, impl="triton", return_lse=want_lse)
    else:
        out = torch.full((batch, heads, LATENT_DIM), float("nan"), dtype=BF16, device=DEVICE)
        res = mla_decode_triton(case.q, case.kv_cache, case.block_table, case.seq_lens, SM_SCALE, kv_scale,
                                return_lse=want_lse, num_splits=num_splits, out=out, poison_workspace=True)
        assert (res[0] if want_lse else res) is out
    out, lse = res if want_lse else (res, None)
    check_against_reference(case, out, lse)


# (heads-major, block_h, block_n, num_warps, split count, cache dtype)
TILE_CASES = [
    (True, 16, 32, 4, 2, FP8), (True, 16, 64, 4, 1, FP8), (True, 32, 16, 4, 3, BF16), (True, 64, 32, 8, 2, FP8),
    (False, 64, 32, 8, 2, FP8), (False, 16, 16, 4, 1, FP8), (False, 32, 32, 4, 3, BF16), (False, 64, 16, 4, 2, BF16),
]


TILE_IDS = [f"{'hm' if c[0] else 'tm'}-H{c[1]}-N{c[2]}-w{c[3]}-S{c[4]}-{'fp8' if c[5] == FP8 else 'bf16'}"
            for c in TILE_CASES]


@pytest.mark.parametrize("heads_major,block_h,block_n,num_warps,num_splits,kv_dtype", TILE_CASES, ids=TILE_IDS)
def test_triton_kernels_and_tiles(heads_major, block_h, block_n, num_warps, num_splits, kv_dtype):
    """Both kernels (scores with heads or tokens as the mma M dimension), other tile shapes than the defaults,
    with and without the split-KV merge: the same function, lse included."""
    needs_triton()
    from decodegap.kernels.mla_decode_triton import Config, mla_decode_triton

    case = make_case(3, 24, 16, kv_dtype, [45, 3, 70], 0.6)
    out = torch.full((3, 24, LATENT_DIM), float("nan"), dtype=BF16, device=DEVICE)
    res, lse = mla_decode_triton(case.q, case.kv_cache, case.block_table, case.seq_lens, SM_SCALE, 0.6,
                                 return_lse=True, num_splits=num_splits, out=out, poison_workspace=True,
                                 config=Config(block_h, block_n, num_warps, 2, heads_major=heads_major))
    check_against_reference(case, res, lse)


# Every config the device A/B (benchmarks/ab_mla_decode.py) times, on both caches; register caps are ignored by the
# interpreter, so these run on a GPU only.
AB_CASES = [(cfg, dtype) for cfg in [
    (True, 16, 32, 4, 2, 168), (True, 16, 32, 4, 2, None), (True, 16, 32, 4, 3, 168), (True, 16, 64, 4, 2, None),
    (True, 16, 32, 8, 2, None), (True, 64, 32, 8, 2, None), (False, 64, 32, 8, 2, None), (False, 32, 32, 4, 2, None),
] for dtype in (FP8, BF16)]


@needs_cuda
@pytest.mark.parametrize("cand,kv_dtype", AB_CASES, ids=["{}-H{}-N{}-w{}-s{}{}-{}".format(
    "hm" if c[0] else "tm", c[1], c[2], c[3], c[4], f"-r{c[5]}" if c[5] else "", "fp8" if d == FP8 else "bf16")
    for c, d in AB_CASES])
def test_triton_ab_candidates(cand, kv_dtype):
    needs_triton()
    from decodegap.kernels.mla_decode_triton import Config, mla_decode_triton

    heads_major, bh, bn, nw, ns, maxnreg = cand
    case = make_case(3, 24, 64, kv_dtype, [300, 3, 129], 0.6)
    out = torch.full((3, 24, LATENT_DIM), float("nan"), dtype=BF16, device=DEVICE)
    res, lse = mla_decode_triton(case.q, case.kv_cache, case.block_table, case.seq_lens, SM_SCALE, 0.6,
                                 return_lse=True, num_splits=3, out=out, poison_workspace=True,
                                 config=Config(bh, bn, nw, ns, heads_major=heads_major, maxnreg=maxnreg))
    check_against_reference(case, res, lse)


@pytest.mark.parametrize("bad", [dict(block_h=8), dict(block_n=24), dict(block_h=48)])
def test_config_rejects_bad_tiles(bad):
    from decodegap.kernels.mla_decode_triton import Config

    with pytest.raises(ValueError, match="power of two"):
        Config(**{**dict(block_h=16, block_n=32, num_warps=4, num_stages=2), **bad})


@pytest.mark.parametrize("batch,head_blocks,max_len,heads,per_sm,want", [
    (32, 1, 4096, 16, 2, 8),      # 8 splits = 256 programs: one wave of 264 slots (13 = 1.6 waves ran 28% slower)
    (32, 1, 4096, 16, 3, 12),     # 3 programs per SM: 384 of 396 slots
    (128, 1, 16384, 16, 2, 2),    # a large batch needs few splits
    (1, 1, 65536, 16, 2, 256),    # one long sequence: as many as allowed
    (4, 1, 64, 16, 2, 1),         # too short to split (slices stay >= 2 tiles)
    (32, 2, 4096, 128, 1, 2),     # two head blocks, one program per SM
])
def test_split_count_fills_whole_waves(batch, head_blocks, max_len, heads, per_sm, want):
    from decodegap.kernels.mla_decode_triton import pick_num_splits

    assert pick_num_splits(batch, head_blocks, max_len, heads, 132, 32, per_sm) == want


@pytest.mark.parametrize("partial_bytes,token_bytes,want", [
    (4, 576, 26),   # fp32 partials on FP8 tokens: the merge weighs 910 tokens per (sequence, split)
    (4, 1152, 32),  # a BF16 cache's tokens are twice the bytes: the merge half as heavy, more splits
    (2, 576, 32),   # fp16 partials (the wgmma kernel on an FP8 cache): the same
])
def test_split_count_weighs_the_merge_in_cached_bytes(partial_bytes, token_bytes, want):
    # B=1, ctx 4096, H=128 (two head blocks, one CTA per SM): cost(s) = slice + 64 + s x 128 x 512 x partial_bytes
    # x 2 / token_bytes / 132, the slice ceil(4096 / s) in whole 32-token tiles; least at these s (26: a slice of
    # 160, 403 against 412 at 32; the H200 ran 32 splits 1-2 us under 24 and 34, whose slice is 32's)
    from decodegap.kernels.mla_decode_triton import pick_num_splits

    assert pick_num_splits(1, 2, 4096, 128, 132, 32, 1, partial_bytes=partial_bytes, token_bytes=token_bytes,
                           whole_tiles=True) == want


def test_split_count_in_whole_tiles_never_adds_empty_slices():
    # Without whole tiles the model takes 34 splits (4096 / 34 = 120.5 tokens each); the kernel rounds slices up to
    # 128 tokens, so 32 splits hold them all and 2 would be empty: whole tiles take 32.
    from decodegap.kernels.mla_decode_triton import pick_num_splits

    assert pick_num_splits(1, 2, 4096, 128, 132, 32, 1, partial_bytes=4, token_bytes=1152) == 34
    assert pick_num_splits(1, 2, 4096, 128, 132, 32, 1, partial_bytes=4, token_bytes=1152, whole_tiles=True) == 32


@pytest.mark.parametrize("sm_scale,kv_scale,q_mag", [(1 / 16, 0.8, 1.0), (1.0, 40.0, 1e-3), (1e-3, 1e-2, 3e3)])
def test_fp16_dots_keep_q_in_range(sm_scale, kv_scale, q_mag):
    """FP8 caches run fp16 dots on q * 2^e (2^e ~ the score scale): far-off scales and query magnitudes stay
    finite and accurate."""
    needs_triton()
    from decodegap.kernels.mla_decode_triton import mla_decode_triton

    case = make_case(2, 16, 16, FP8, [40, 9], kv_scale)
    case.q = (case.q.float() * q_mag).to(BF16)
    out = mla_decode_triton(case.q, case.kv_cache, case.block_table, case.seq_lens, sm_scale, kv_scale)
    ref = mla_decode(case.q, case.kv_cache, case.block_table, case.seq_lens, sm_scale, kv_scale=kv_scale,
                     impl="reference")
    assert torch.isfinite(out.float()).all()
    assert rel_err(out, ref) < REL_TOL


@pytest.mark.parametrize("impl", ["full_cast", "gather_cast"])
@pytest.mark.parametrize("batch,heads,page_size,kv_dtype,lens,kv_scale,num_splits", CASES, ids=IDS)
def test_torch_paths_match_reference(impl, batch, heads, page_size, kv_dtype, lens, kv_scale, num_splits):
    case = make_case(batch, heads, page_size, kv_dtype, lens, kv_scale)
    out, lse = mla_decode(case.q, case.kv_cache, case.block_table, case.seq_lens, SM_SCALE,
                          kv_scale=kv_scale, impl=impl, return_lse=True)
    check_against_reference(case, out, lse, lse_atol=3e-2)  # these paths round the scores to bf16


@needs_cuda
@pytest.mark.parametrize("heads,kv_dtype", [(16, FP8), (128, FP8), (64, BF16)])
def test_triton_at_benchmark_scale(heads, kv_dtype):
    """Long contexts and a real batch, where the split heuristic picks many splits (GPU only)."""
    needs_triton()
    lens = [4096, 4001, 17, 2500, 1] * 6 + [3333, 64]
    case = make_case(len(lens), heads, 64, kv_dtype, lens, 0.8)
    out, lse = mla_decode(case.q, case.kv_cache, case.block_table, case.seq_lens, SM_SCALE,
                          kv_scale=0.8, impl="triton", return_lse=True)
    check_against_reference(case, out, lse)


@pytest.mark.parametrize("impl", ["reference", "full_cast", "gather_cast", "triton"])
def test_validate_false_never_reads_values(impl, monkeypatch):
    """validate=False (engines, the demo): no value checks and no read-back of the lengths, so no device sync
    (on CUDA the call runs under torch's sync debug mode set to "error"); same results."""
    if impl == "triton":
        needs_triton()
    mod = sys.modules["decodegap.kernels.mla_decode"]  # the package's `mla_decode` name is the function

    case = make_case(3, 16, 16, FP8, [37, 1, 100], 0.37)
    args = (case.q, case.kv_cache, case.block_table, case.seq_lens, SM_SCALE)
    want = mla_decode(*args, kv_scale=0.37, impl=impl)  # validated (and compiled/warmed)
    monkeypatch.setattr(mod, "check_values", lambda *a: pytest.fail("check_values ran with validate=False"))
    if DEVICE == "cuda":
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
    try:
        out, lse = mla_decode(*args, kv_scale=0.37, impl=impl, return_lse=True, validate=False)
    finally:
        if DEVICE == "cuda":
            torch.cuda.set_sync_debug_mode(0)
        monkeypatch.undo()
    assert rel_err(out, want) < 1e-2
    check_against_reference(case, out, lse, lse_atol=3e-2)


# ---------------------------------------------------------------------------------------------------------
# Argument checks


def _args(**over):
    case = make_case(2, 8, 16, FP8, [5, 20], 1.0, device="cpu")
    args = dict(q=case.q, kv_cache=case.kv_cache, block_table=case.block_table, seq_lens=case.seq_lens,
                sm_scale=SM_SCALE, kv_scale=1.0, impl="reference")
    args.update(over)
    return args


BAD_ARGS = [
    ("impl", lambda a: {"impl": "flash"}, ValueError, "impl must be one of"),
    ("q-type", lambda a: {"q": [1, 2]}, TypeError, "q must be a torch.Tensor"),
    ("q-dtype", lambda a: {"q": a["q"].float()}, TypeError, "q must be bfloat16"),
    ("q-shape", lambda a: {"q": a["q"][..., :512]}, ValueError, "q must have shape"),
    ("kv-dtype", lambda a: {"kv_cache": a["kv_cache"].half()}, TypeError, "kv_cache must be float8_e4m3fn"),
    ("kv-shape", lambda a: {"kv_cache": a["kv_cache"][0]}, ValueError, "kv_cache must have shape"),
    ("kv-stride", lambda a: {"kv_cache": a["kv_cache"].to(BF16).transpose(1, 2).contiguous().transpose(1, 2)},
     ValueError, "rows must be contiguous"),
    ("table-dtype", lambda a: {"block_table": a["block_table"].long()}, TypeError, "block_table must be int32"),
    ("table-batch", lambda a: {"block_table": a["block_table"][:1]}, ValueError, "block_table must have shape"),
    ("lens-dtype", lambda a: {"seq_lens": a["seq_lens"].long()}, TypeError, "seq_lens must be int32"),
    ("lens-shape", lambda a: {"seq_lens": a["seq_lens"][None]}, ValueError, "seq_lens must have shape"),
    ("lens-negative", lambda a: {"seq_lens": torch.tensor([-1, 3], dtype=torch.int32)}, ValueError, ">= 0"),
    ("lens-too-long", lambda a: {"seq_lens": torch.tensor([5, 10_000], dtype=torch.int32)}, ValueError,
     r"max_pages \* page_size"),
    ("page-out-of-range", lambda a: {"block_table": a["block_table"].clone().fill_(a["kv_cache"].shape[0])},
     ValueError, "is outside the cache's"),
    ("page-negative", lambda a: {"block_table": a["block_table"].clone().fill_(-1)}, ValueError, "outside"),
    ("sm-scale-type", lambda a: {"sm_scale": "0.1"}, TypeError, "sm_scale must be a real number"),
    ("sm-scale-value", lambda a: {"sm_scale": float("nan")}, ValueError, "sm_scale must be finite"),
    ("kv-scale-bool", lambda a: {"kv_scale": True}, TypeError, "kv_scale must be a real number"),
    ("kv-scale-zero", lambda a: {"kv_scale": 0.0}, ValueError, "kv_scale must be finite and > 0"),
]


@pytest.mark.parametrize("name,change,exc,msg", BAD_ARGS, ids=[b[0] for b in BAD_ARGS])
def test_bad_arguments_raise_one_line_errors(name, change, exc, msg):
    args = _args()
    args.update(change(args))
    with pytest.raises(exc, match=msg) as info:
        mla_decode(**args)
    assert "\n" not in str(info.value)


def test_dead_table_entries_are_ignored():
    """Entries past a sequence's last page may hold anything (engines leave stale ids there)."""
    args = _args()
    assert (args["block_table"][:, -1] >= args["kv_cache"].shape[0]).all()  # make_case poisons them
    mla_decode(**args)


def test_triton_on_cpu_without_interpreter_says_so(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        mla_decode(**_args(impl="triton"))


@needs_cuda
def test_mixed_devices_are_refused():
    args = _args()
    args["q"] = args["q"].cuda()
    with pytest.raises(ValueError, match="on one device"):
        mla_decode(**args)


def test_torch_paths_work_without_triton():
    """Importing decodegap.kernels must not import triton; the torch paths run where it is missing."""
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'triton' or name.startswith('triton.'): raise ImportError('no triton here')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import torch\n"
        "from decodegap.kernels import mla_decode\n"
        "q = torch.randn(1, 2, 576).bfloat16(); kv = torch.randn(4, 1, 576).to(torch.float8_e4m3fn)\n"
        "t = torch.arange(4, dtype=torch.int32)[None]; n = torch.tensor([3], dtype=torch.int32)\n"
        "for impl in ('reference', 'full_cast', 'gather_cast'): mla_decode(q, kv, t, n, 0.1, impl=impl)\n"
        "assert 'triton' not in sys.modules\n"
        "print('ok')\n"
    )
    env = dict(os.environ)
    src = os.path.join(os.path.dirname(__file__), "..", "src")
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")])
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr[-2000:]


# Each kernel variant the defaults use, compiled for sm_90 on any machine with triton's bundled ptxas: the
# interpreter runs the Python, not the compiler, so jit-only errors (a non-constexpr global, a tile that
# needs more shared memory than an H100/H200 has) would otherwise show up only on a GPU.
SM90_CASES = [(True, "fp8", True, False), (True, "fp8", False, True), (True, "bf16", True, False),
              (False, "fp8", True, False), (False, "bf16", False, True)]


@pytest.mark.slow
@pytest.mark.parametrize("heads_major,kv,split,return_lse", SM90_CASES,
                         ids=[f"{'hm' if c[0] else 'tm'}-{c[1]}-{'split' if c[2] else 'lse'}" for c in SM90_CASES])
def test_default_kernels_compile_for_sm90(heads_major, kv, split, return_lse):
    needs_triton()
    code = f"""
import torch
from decodegap.kernels import mla_decode_triton as m
kv_dtype = torch.float8_e4m3fn if {kv!r} == "fp8" else torch.bfloat16
cfg = m.default_config(16 if {heads_major} else 128, kv_dtype)
assert cfg.heads_major == {heads_major}
k = m.compile_for_gpu(cfg, kv_dtype, split={split}, return_lse={return_lse})
assert k.metadata.shared <= 227 * 1024, k.metadata.shared
print("ok", k.metadata.shared)
"""
    src = os.path.join(os.path.dirname(__file__), "..", "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))}
    env.pop("TRITON_INTERPRET", None)  # compiled, not interpreted
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-2000:]


# ---------------------------------------------------------------------------------------------------------
# The sm_90 CUDA stage 1 (FP8, <= 16 heads; mla_decode_sm90.cu), merged by the Triton merge kernel


def needs_sm90() -> None:
    if DEVICE != "cuda":
        pytest.skip("needs a CUDA device")
    needs_triton()
    from decodegap.kernels import mla_decode_sm90

    if not mla_decode_sm90.applies(torch.empty(1, 16, HEAD_DIM, device="cuda", dtype=BF16),
                                   torch.empty(1, 1, HEAD_DIM, device="cuda", dtype=FP8)):
        pytest.skip("the CUDA fast path does not apply on this GPU (sm_90 only) or did not build")


# (batch, heads, page_size, lengths, kv_scale, forced split count or None)
CUDA_CASES = [
    (1, 16, 1, [1], 1.0, None),                  # one token, token slots
    (3, 16, 16, [37, 1, 100], 0.37, 3),          # odd lengths, several pages and splits
    (3, 8, 64, [200, 129, 3], 0.37, 5),          # empty splits of the short sequence
    (3, 1, 1, [9, 33, 0], 1.7, 2),               # one head, an empty sequence
    (2, 12, 64, [64, 65], 1.0, 1),               # one split, page boundaries, heads not a multiple of 8
    (4, 16, 16, [1500, 700, 31, 2048], 0.8, None),  # the heuristic's split count
    (2, 4, 64, [2500, 900], 1.3, 24),            # more splits than the tokens-major kernel combines itself
    (1, 16, 64, [4000], 0.6, 16),                # the most it combines itself
]


@pytest.mark.parametrize("variant", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("batch,heads,page_size,lens,kv_scale,num_splits", CUDA_CASES,
                         ids=[f"B{c[0]}-H{c[1]}-ps{c[2]}-S{c[5]}" for c in CUDA_CASES])
def test_cuda_kernel_matches_reference(variant, batch, heads, page_size, lens, kv_scale, num_splits):
    needs_sm90()
    from decodegap.kernels.mla_decode_triton import mla_decode_triton

    case = make_case(batch, heads, page_size, FP8, lens, kv_scale)
    out = torch.full((batch, heads, LATENT_DIM), float("nan"), dtype=BF16, device=DEVICE)
    res, lse = mla_decode_triton(case.q, case.kv_cache, case.block_table, case.seq_lens, SM_SCALE, kv_scale,
                                 return_lse=True, num_splits=num_splits, out=out, poison_workspace=True,
                                 backend="cuda", cuda_variant=variant)
    assert res is out
    check_against_reference(case, res, lse)
    # the same function again without the lse (the tokens-major kernel's combine then has no lse pointer)
    again = mla_decode_triton(case.q, case.kv_cache, case.block_table, case.seq_lens, SM_SCALE, kv_scale,
                              num_splits=num_splits, backend="cuda", cuda_variant=variant)
    assert rel_err(again, res) < 1e-6


def test_cuda_kernel_is_the_default_for_fp8_up_to_16_heads():
    needs_sm90()
    from decodegap.kernels.mla_decode_triton import default_config, uses_cuda_kernel

    from decodegap.kernels.mla_decode_triton import cuda_path

    q16, q17 = (torch.empty(1, h, HEAD_DIM, device=DEVICE, dtype=BF16) for h in (16, 17))
    fp8, bf16 = (torch.empty(2, 16, HEAD_DIM, device=DEVICE, dtype=d) for d in (FP8, BF16))
    assert uses_cuda_kernel(q16, fp8) and cuda_path(q16, fp8) == "mma"
    assert not uses_cuda_kernel(q16, bf16)  # BF16 with <= 16 heads: Triton
    assert cuda_path(q17, fp8) == "wgmma" and cuda_path(q17, bf16) == "wgmma"  # 17+ heads: the wgmma kernel
    assert not uses_cuda_kernel(q16, fp8, backend="triton") and not uses_cuda_kernel(q17, bf16, backend="triton")
    assert not uses_cuda_kernel(q16, fp8, config=default_config(16, FP8))  # an explicit Triton tile
    with pytest.raises(ValueError, match="backend='cuda' needs"):
        cuda_path(q16, bf16, backend="cuda")


def test_tok_kernel_is_the_default_on_sm90_for_large_problems():
    needs_sm90()
    from decodegap.kernels import mla_decode_sm90 as sm90

    dev = torch.cuda.current_device()
    assert sm90.default_variant(dev) == sm90.TOK_VARIANT  # a large problem
    assert sm90.default_variant(dev, sm90.TOK_MIN_SLOTS) == sm90.TOK_VARIANT
    assert sm90.default_variant(dev, sm90.TOK_MIN_SLOTS - 1) == sm90.MMA_DEFAULT_VARIANT


def test_tok_cluster_combine_applies(monkeypatch):
    """The cluster combine runs where it fits (so the tests of it test it), up to 8 splits, and can be switched off."""
    needs_sm90()
    from decodegap.kernels import mla_decode_sm90 as sm90

    dev = torch.cuda.current_device()
    for variant in sm90.TOK_VARIANTS:
        assert sm90.tok_max_clusters(dev, variant, 8) >= 1
        assert sm90.tok_cluster_combine(dev, variant, 3, 3) and sm90.tok_cluster_combine(dev, variant, 8, 1)
        assert not sm90.tok_cluster_combine(dev, variant, 9, 1)
    monkeypatch.setenv("DECODEGAP_MLA_TOK_CLUSTER", "0")
    assert not sm90.tok_cluster_combine(dev, sm90.TOK_VARIANT, 3, 3)


# How the tokens-major kernel's splits are combined: the Triton merge kernel, the last CTA of each sequence
# (TOK_INLINE_MAX_SPLITS), or each sequence's cluster through distributed shared memory (TOK_CLUSTER_MAX_SPLITS).
COMBINES = {"merge": (0, 0), "inline": (32, 0), "cluster": (0, 8)}


def _combine(monkeypatch, name: str) -> None:
    from decodegap.kernels import mla_decode_sm90 as sm90

    inline, cluster = COMBINES[name]
    monkeypatch.setattr(sm90, "TOK_INLINE_MAX_SPLITS", inline)
    monkeypatch.setattr(sm90, "TOK_CLUSTER_MAX_SPLITS", cluster)


@pytest.mark.parametrize("combine", list(COMBINES))
def test_tok_kernel_large_scores(combine, monkeypatch):
    """The tokens-major kernel on scores that grow along the sequence (the lazy max moves many times) and a large
    score scale, merged by the Triton kernel or combined in the kernel."""
    needs_sm90()
    from decodegap.kernels import mla_decode_sm90 as sm90
    from decodegap.kernels.mla_decode_triton import mla_decode_triton

    _combine(monkeypatch, combine)
    case = make_case(2, 16, 64, FP8, [3000, 2000], 1.0)
    ramp = torch.linspace(0.2, 3.0, case.kv_cache.shape[0] * 64, device=DEVICE).view(-1, 64, 1)
    case.kv_cache = (case.kv_cache.float() * ramp).clamp(-448, 448).to(FP8)
    ref, ref_lse = mla_decode(case.q, case.kv_cache, case.block_table, case.seq_lens, 0.3, kv_scale=1.0,
                              impl="reference", return_lse=True)
    for variant in sm90.TOK_VARIANTS:
        for splits in (None, 4, 8, 30):
            out, lse = mla_decode_triton(case.q, case.kv_cache, case.block_table, case.seq_lens, 0.3, 1.0,
                                         return_lse=True, num_splits=splits, backend="cuda", cuda_variant=variant)
            assert torch.isfinite(out.float()).all()
            assert rel_err(out, ref) < REL_TOL
            assert torch.allclose(lse, ref_lse, rtol=1e-3, atol=2e-2)


@pytest.mark.parametrize("combine", list(COMBINES))
@pytest.mark.parametrize("batch,heads,page_size,lens,kv_scale,num_splits", CUDA_CASES,
                         ids=[f"B{c[0]}-H{c[1]}-ps{c[2]}-S{c[5]}" for c in CUDA_CASES])
def test_tok_kernel_combines(batch, heads, page_size, lens, kv_scale, num_splits, combine, monkeypatch):
    """The tokens-major kernel's three ways of combining splits on every CUDA case, NaN-poisoned partials and
    output: the Triton merge kernel; the last CTA of each sequence (opt-in: TOK_INLINE_MAX_SPLITS); each sequence's
    cluster (TOK_CLUSTER_MAX_SPLITS, up to 8 splits; more take the merge kernel)."""
    needs_sm90()
    from decodegap.kernels import mla_decode_sm90 as sm90
    from decodegap.kernels.mla_decode_triton import mla_decode_triton

    _combine(monkeypatch, combine)
    case = make_case(batch, heads, page_size, FP8, lens, kv_scale)
    for variant in sm90.TOK_VARIANTS:
        out = torch.full((batch, heads, LATENT_DIM), float("nan"), dtype=BF16, device=DEVICE)
        res, lse = mla_decode_triton(case.q, case.kv_cache, case.block_table, case.seq_lens, SM_SCALE, kv_scale,
                                     return_lse=True, num_splits=num_splits, out=out, poison_workspace=True,
                                     backend="cuda", cuda_variant=variant)
        check_against_reference(case, res, lse)
        again = mla_decode_triton(case.q, case.kv_cache, case.block_table, case.seq_lens, SM_SCALE, kv_scale,
                                  num_splits=num_splits, backend="cuda", cuda_variant=variant)
        assert rel_err(again, res) < 1e-6


def _check_replays(case, call=None, replays: int = 1) -> None:
    """`call` (the public entry on `case` by default) run once outside capture (build, compile, warm), captured, then
    replayed on new inputs copied into the captured q: each replay matches the reference."""
    if call is None:
        def call():
            return mla_decode(case.q, case.kv_cache, case.block_table, case.seq_lens, SM_SCALE, kv_scale=0.8,
                              return_lse=True, validate=False)
    call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = call()
    for _ in range(replays):
        case.q.copy_(torch.randn_like(case.q.float()).to(BF16))
        graph.replay()
        torch.cuda.synchronize()
        check_against_reference(case, out, lse)


@pytest.mark.parametrize("combine", list(COMBINES))
def test_tok_kernel_under_cuda_graph_capture(combine, monkeypatch):
    """The tokens-major kernel captured once and replayed on new inputs (its per-call counters and its cluster
    launch too)."""
    needs_sm90()
    from decodegap.kernels import mla_decode_sm90 as sm90
    from decodegap.kernels.mla_decode_triton import mla_decode_triton

    _combine(monkeypatch, combine)
    case = make_case(4, 16, 64, FP8, [300, 5, 1000, 64], 0.8)

    def call():
        return mla_decode_triton(case.q, case.kv_cache, case.block_table, case.seq_lens, SM_SCALE, 0.8,
                                 return_lse=True, backend="cuda", cuda_variant=sm90.TOK_VARIANT)

    _check_replays(case, call, replays=2)


def test_cuda_kernel_under_cuda_graph_capture():
    """Captured once, replayed on new inputs copied into the captured tensors: the same results as eager."""
    needs_sm90()
    _check_replays(make_case(4, 16, 64, FP8, [300, 5, 1000, 64], 0.8))


def test_cuda_kernel_reads_a_pool_past_2_31_elements():
    """A pool of 2^31 + elements (2.2 GB of FP8): the live pages sit at its end, beyond any 32-bit offset."""
    needs_sm90()
    page_size, pages = 64, (2**31 // (64 * HEAD_DIM)) + 8
    pool = torch.empty((pages, page_size, HEAD_DIM), dtype=FP8, device=DEVICE)
    small = make_case(2, 16, page_size, FP8, [130, 64], 0.8)
    n = small.kv_cache.shape[0]
    pool[pages - n:] = small.kv_cache
    table = torch.where(small.block_table < n, small.block_table + (pages - n), small.block_table)
    out, lse = mla_decode(small.q, pool, table.int(), small.seq_lens, SM_SCALE, kv_scale=0.8, return_lse=True)
    small_out = mla_decode(small.q, small.kv_cache, small.block_table, small.seq_lens, SM_SCALE, kv_scale=0.8,
                           impl="reference")
    assert rel_err(out, small_out) < REL_TOL
    del pool


@pytest.mark.slow
@pytest.mark.parametrize("which", ["mma", "wgmma", "tok"])
def test_cuda_source_compiles_for_sm90(which):
    """The CUDA sources build for sm_90 (the wgmma ones for sm_90a) wherever nvcc exists (no GPU needed), as they
    will at first use: at most a few spilled words (the wgmma FP8 variant 2's producer, at 88 registers), and the
    wgmma kernels' pipelines unserialized (ptxas says C7518 when it serializes them)."""
    from decodegap.kernels import mla_decode_sm90

    nvcc = mla_decode_sm90._nvcc()
    if nvcc is None:
        pytest.skip("nvcc not installed")
    import tempfile

    source = {"mma": mla_decode_sm90._SOURCE, "wgmma": mla_decode_sm90._WGMMA_SOURCE,
              "tok": mla_decode_sm90._TOK_SOURCE}[which]
    arch = ["-arch=sm_90"] if which == "mma" else list(mla_decode_sm90._WGMMA_GENCODE)
    with tempfile.TemporaryDirectory() as tmp:
        res = subprocess.run([nvcc, "-O3", "-std=c++17", *arch, "-cubin", "-Xptxas", "-v", "-o",
                              os.path.join(tmp, "k.cubin"), str(source)],
                             capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    import re

    spills = [int(n) for n in re.findall(r"(\d+) bytes spill stores", res.stderr)]
    assert "Used" in res.stderr and spills and max(spills) <= 16, res.stderr[-2000:]
    assert "serialized" not in res.stderr, res.stderr[-2000:]


def test_cuda_fast_path_can_be_switched_off(monkeypatch):
    from decodegap.kernels import mla_decode_sm90

    monkeypatch.setenv("DECODEGAP_MLA_CUDA", "0")
    assert not mla_decode_sm90._arch_allowed((9, 0))
    monkeypatch.setenv("DECODEGAP_MLA_CUDA", "1")
    assert mla_decode_sm90._arch_allowed((8, 9)) and not mla_decode_sm90._arch_allowed((8, 0))
    monkeypatch.delenv("DECODEGAP_MLA_CUDA")
    assert mla_decode_sm90._arch_allowed((9, 0)) and not mla_decode_sm90._arch_allowed((12, 0))


def test_cuda_build_without_nvcc_says_so(monkeypatch, tmp_path):
    from decodegap.kernels import mla_decode_sm90

    monkeypatch.setattr(mla_decode_sm90, "_nvcc", lambda: None)
    monkeypatch.setenv("DECODEGAP_CACHE_DIR", str(tmp_path))
    with pytest.raises(RuntimeError, match="nvcc not found"):
        mla_decode_sm90.build("sm_90")


def test_without_nvcc_the_triton_path_runs(monkeypatch, tmp_path):
    """No compiler on the GPU machine: one warning, and mla_decode falls back to the Triton kernels."""
    needs_sm90()
    from decodegap.kernels import mla_decode_sm90

    monkeypatch.setattr(mla_decode_sm90, "_nvcc", lambda: None)
    monkeypatch.setenv("DECODEGAP_CACHE_DIR", str(tmp_path))  # no library built there
    mla_decode_sm90._library.cache_clear()
    mla_decode_sm90._tok_library.cache_clear()
    mla_decode_sm90.kernel_info.cache_clear()
    try:
        case = make_case(2, 16, 16, FP8, [40, 9], 0.8)
        with pytest.warns(UserWarning, match="unavailable, using Triton"):
            assert not mla_decode_sm90.applies(case.q, case.kv_cache)
        out, lse = mla_decode(case.q, case.kv_cache, case.block_table, case.seq_lens, SM_SCALE, kv_scale=0.8,
                              return_lse=True)
        check_against_reference(case, out, lse)
    finally:
        mla_decode_sm90._library.cache_clear()
        mla_decode_sm90._tok_library.cache_clear()
        mla_decode_sm90.kernel_info.cache_clear()


# ---------------------------------------------------------------------------------------------------------
# The wgmma kernel (17+ heads, FP8 and BF16 caches; mla_decode_sm90_wgmma.cu), sm_90 only


def needs_wgmma() -> None:
    if DEVICE != "cuda":
        pytest.skip("needs a CUDA device")
    needs_triton()
    from decodegap.kernels import mla_decode_sm90

    if not mla_decode_sm90.applies_wgmma(torch.empty(1, 64, HEAD_DIM, device="cuda", dtype=BF16),
                                         torch.empty(1, 1, HEAD_DIM, device="cuda", dtype=FP8)):
        pytest.skip("the wgmma kernel does not apply on this GPU (sm_90 only) or did not build")


# (batch, heads, page_size, kv dtype, lengths, kv_scale, forced split count or None)
WGMMA_CASES = [
    (3, 128, 64, FP8, [300, 1, 129], 0.8, None),       # DeepSeek heads, the heuristic's split count
    (3, 64, 16, BF16, [37, 0, 100], 0.37, 3),          # GLM-5 heads, an empty sequence, fp32 partials
    (2, 32, 1, FP8, [65, 33], 1.7, 1),                 # one split: the kernel writes the output; token slots
    (1, 17, 64, BF16, [200], 2.5, 1),                  # 17 heads (padded to 64), one split
    (4, 100, 64, FP8, [1500, 700, 31, 2048], 0.8, 4),  # two head blocks, the second part-empty
    (3, 128, 64, BF16, [64, 65, 2100], 0.6, 5),        # page boundaries, some empty splits
    (2, 48, 64, FP8, [96, 4000], 1.0, 2),              # tiles that end mid-tile
]


@pytest.mark.parametrize("batch,heads,page_size,kv_dtype,lens,kv_scale,num_splits", WGMMA_CASES,
                         ids=[f"B{c[0]}-H{c[1]}-ps{c[2]}-{'fp8' if c[3] == FP8 else 'bf16'}-S{c[6]}"
                              for c in WGMMA_CASES])
def test_wgmma_kernel_matches_reference(batch, heads, page_size, kv_dtype, lens, kv_scale, num_splits):
    needs_wgmma()
    from decodegap.kernels.mla_decode_triton import cuda_path, mla_decode_triton

    from decodegap.kernels.mla_decode_sm90 import WGMMA_VARIANTS

    case = make_case(batch, heads, page_size, kv_dtype, lens, kv_scale)
    assert cuda_path(case.q, case.kv_cache) == "wgmma"
    for variant in [v for v, d in WGMMA_VARIANTS.items() if d == kv_dtype]:  # every variant for this cache
        out = torch.full((batch, heads, LATENT_DIM), float("nan"), dtype=BF16, device=DEVICE)
        res, lse = mla_decode_triton(case.q, case.kv_cache, case.block_table, case.seq_lens, SM_SCALE, kv_scale,
                                     return_lse=True, num_splits=num_splits, out=out, poison_workspace=True,
                                     backend="cuda", wgmma_variant=variant)
        assert res is out
        check_against_reference(case, res, lse)
        # the same function again without the lse (one split: the kernel's lse pointer is null)
        again = mla_decode_triton(case.q, case.kv_cache, case.block_table, case.seq_lens, SM_SCALE, kv_scale,
                                  num_splits=num_splits, backend="cuda", wgmma_variant=variant)
        assert rel_err(again, res) < 1e-6


@pytest.mark.parametrize("kv_dtype", [FP8, BF16], ids=["fp8", "bf16"])
def test_wgmma_kernel_under_cuda_graph_capture(kv_dtype):
    """The public entry at 64 heads under capture, replayed on new inputs: the same results as the reference."""
    needs_wgmma()
    _check_replays(make_case(4, 64, 64, kv_dtype, [300, 5, 1000, 64], 0.8))


@pytest.mark.parametrize("kv_dtype", [FP8, BF16], ids=["fp8", "bf16"])
def test_wgmma_kernel_large_scores(kv_dtype):
    """Scores that grow along the sequence (the lazy max moves many times; the seesaw variants' rare rescales of O
    and of the other warpgroup's P) and a large score scale, every variant."""
    needs_wgmma()
    from decodegap.kernels.mla_decode_sm90 import WGMMA_VARIANTS
    from decodegap.kernels.mla_decode_triton import mla_decode_triton

    case = make_case(2, 64, 64, kv_dtype, [3000, 2000], 1.0)
    ramp = torch.linspace(0.2, 3.0, case.kv_cache.shape[0] * 64, device=DEVICE).view(-1, 64, 1)
    case.kv_cache = (case.kv_cache.float() * ramp).clamp(-448, 448).to(kv_dtype)
    ref, ref_lse = mla_decode(case.q, case.kv_cache, case.block_table, case.seq_lens, 0.3, kv_scale=1.0,
                              impl="reference", return_lse=True)
    for variant in [v for v, d in WGMMA_VARIANTS.items() if d == kv_dtype]:
        out, lse = mla_decode_triton(case.q, case.kv_cache, case.block_table, case.seq_lens, 0.3, 1.0,
                                     return_lse=True, backend="cuda", wgmma_variant=variant)
        assert torch.isfinite(out.float()).all(), variant
        assert rel_err(out, ref) < REL_TOL, variant
        assert torch.allclose(lse, ref_lse, rtol=1e-3, atol=2e-2), variant


# (batch, heads, page size, lengths, forced split count or None, whether TMA loads apply)
TMA_CASES = [
    (3, 128, 64, [700, 0, 2100], None, True),  # two head blocks, pages of 64; an empty sequence, a mid-tile end
    (2, 100, 32, [65, 1000], 3, True),         # a padded second head block, pages of 32, empty slices
    (2, 64, 64, [300, 77], 2, True),           # one head block
    (2, 128, 16, [300, 77], 2, False),         # pages of 16: tiles span pages, variant 20's cp.async
]


@pytest.mark.parametrize("batch,heads,page_size,lens,num_splits,tma", TMA_CASES,
                         ids=[f"B{c[0]}-H{c[1]}-ps{c[2]}-S{c[4]}" for c in TMA_CASES])
def test_wgmma_tma_variant(batch, heads, page_size, lens, num_splits, tma, monkeypatch):
    """The TMA variant (23) loads by TMA exactly where the page size allows, else runs as variant 20; rows past each
    sequence's end (NaN-poisoned) never reach the output, and runs again give the same output (the tile crossing the
    end comes by cp.async, waited for before its one barrier arrival: a missed wait is a race)."""
    needs_wgmma()
    from decodegap.kernels import mla_decode_sm90 as sm90
    from decodegap.kernels.mla_decode_triton import mla_decode_triton

    variant, ran = 23, []
    launch = sm90.launch_wgmma
    monkeypatch.setattr(sm90, "launch_wgmma", lambda *args, **kw: ran.append(launch(*args, **kw)))
    case = make_case(batch, heads, page_size, BF16, lens, 0.6)
    out = torch.full((batch, heads, LATENT_DIM), float("nan"), dtype=BF16, device=DEVICE)
    res, lse = mla_decode_triton(case.q, case.kv_cache, case.block_table, case.seq_lens, SM_SCALE, 0.6,
                                 return_lse=True, num_splits=num_splits, out=out, poison_workspace=True,
                                 backend="cuda", wgmma_variant=variant)
    assert ran == [tma]
    check_against_reference(case, res, lse)
    for _ in range(4):
        again = mla_decode_triton(case.q, case.kv_cache, case.block_table, case.seq_lens, SM_SCALE, 0.6,
                                  num_splits=num_splits, backend="cuda", wgmma_variant=variant)
        assert rel_err(again, res) < 1e-6


# (batch, heads, page size, lengths, forced split count or None, whether variants 41, 42 run themselves)
TOKW_CASES = [
    (3, 128, 64, [700, 0, 2100], None, True),   # two head blocks, pages of 64; an empty sequence, a mid-tile end
    (2, 100, 32, [65, 1000], 3, True),          # a part-empty second head block, pages of 32, empty slices
    (2, 64, 16, [300, 77], 1, True),            # one head block, pages of 16 (four runs a tile), one split
    (2, 40, 128, [129, 4000], 2, True),         # 40 heads: the second warpgroup's heads part-empty; pages of 128
    (2, 128, 1, [300, 77], 2, False),           # token slots: TMA cannot copy them, variant 18 runs
]


@pytest.mark.parametrize("variant", [41, 42])
@pytest.mark.parametrize("batch,heads,page_size,lens,num_splits,runs", TOKW_CASES,
                         ids=[f"B{c[0]}-H{c[1]}-ps{c[2]}-S{c[4]}" for c in TOKW_CASES])
def test_tokw_variant(batch, heads, page_size, lens, num_splits, runs, variant, monkeypatch):
    """Variants 41 and 42 (the tokens-major tile for 64 heads per CTA) run themselves exactly where TMA can copy the
    pages, else the FP8 fallback does; rows past each sequence's end (NaN-poisoned, left stale in the stage) never
    reach the output; runs again give the same output (a stage handed back too early is a race; so is a missed turn
    of its consumers)."""
    needs_wgmma()
    from decodegap.kernels import mla_decode_sm90 as sm90
    from decodegap.kernels.mla_decode_triton import mla_decode_triton

    ran = []
    launch = sm90._launch_tokw
    monkeypatch.setattr(sm90, "_launch_tokw", lambda *args, **kw: ran.append(launch(*args, **kw)))
    case = make_case(batch, heads, page_size, FP8, lens, 0.6)
    out = torch.full((batch, heads, LATENT_DIM), float("nan"), dtype=BF16, device=DEVICE)
    res, lse = mla_decode_triton(case.q, case.kv_cache, case.block_table, case.seq_lens, SM_SCALE, 0.6,
                                 return_lse=True, num_splits=num_splits, out=out, poison_workspace=True,
                                 backend="cuda", wgmma_variant=variant)
    assert ran == ([True] if runs else [])
    check_against_reference(case, res, lse)
    for _ in range(4):
        again = mla_decode_triton(case.q, case.kv_cache, case.block_table, case.seq_lens, SM_SCALE, 0.6,
                                  num_splits=num_splits, backend="cuda", wgmma_variant=variant)
        assert rel_err(again, res) < 1e-6


@pytest.mark.parametrize("combine", list(COMBINES))
def test_tok_kernel_table_as_wide_as_the_longest_sequence(combine, monkeypatch):
    """A table exactly as wide as the longest sequence: the tokens-major kernel loads its first page ids for the
    slice of a sequence as long as the table's span, beside the length; they are right for the longest sequence and
    loaded again for the shorter ones (whose entries past their end are poison)."""
    needs_sm90()
    from decodegap.kernels import mla_decode_sm90 as sm90
    from decodegap.kernels.mla_decode_triton import mla_decode_triton

    _combine(monkeypatch, combine)
    case = make_case(3, 16, 64, FP8, [4096, 1000, 4059], 0.8)
    case.block_table = case.block_table[:, :64].contiguous()  # no spare column
    for splits in (None, 3, 8):
        for variant in sm90.TOK_VARIANTS:
            res, lse = mla_decode_triton(case.q, case.kv_cache, case.block_table, case.seq_lens, SM_SCALE, 0.8,
                                         return_lse=True, num_splits=splits, backend="cuda", cuda_variant=variant)
            check_against_reference(case, res, lse)


def test_merge_after_the_cuda_kernels_runs_as_their_programmatic_dependent(monkeypatch):
    """On sm_90 the merge after each CUDA stage 1 (mma.sync, tokens-major, wgmma) is launched with PDL where Triton
    can (so the other tests run it so); launched plainly (DECODEGAP_MLA_PDL=0) it gives the same bits."""
    needs_sm90()
    from decodegap.kernels import mla_decode_sm90 as sm90
    from decodegap.kernels import mla_decode_triton as mt

    assert mt.merge_pdl(torch.device(DEVICE)) == mt._triton_has_pdl()
    monkeypatch.setattr(sm90, "TOK_CLUSTER_MAX_SPLITS", 0)  # the tokens-major kernel's splits to the merge
    runs = [(make_case(3, 16, 64, FP8, [3000, 700, 64], 0.8), {"cuda_variant": v}) for v in (0, 3)]
    if sm90.applies_wgmma(torch.empty(1, 64, HEAD_DIM, device=DEVICE, dtype=BF16),
                          torch.empty(1, 64, HEAD_DIM, device=DEVICE, dtype=BF16)):
        runs += [(make_case(2, 64, 64, d, [2000, 333], 0.8), {}) for d in (FP8, BF16)]
    for case, kw in runs:
        def call(case=case, kw=kw):
            return mt.mla_decode_triton(case.q, case.kv_cache, case.block_table, case.seq_lens, SM_SCALE,
                                        case.kv_scale, return_lse=True, num_splits=5, backend="cuda", **kw)

        res, lse = call()
        check_against_reference(case, res, lse)
        monkeypatch.setenv("DECODEGAP_MLA_PDL", "0")
        plain, plain_lse = call()
        monkeypatch.delenv("DECODEGAP_MLA_PDL")
        assert torch.equal(res, plain) and torch.equal(lse, plain_lse)
