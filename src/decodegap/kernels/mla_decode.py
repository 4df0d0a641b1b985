"""MLA decode attention over a paged latent KV cache: the public entry point, its argument checks, and the
torch paths (`reference`, the float32 oracle; `full_cast` and `gather_cast`, the incident's path and its patch).

Layout (one latent head, DeepSeek/GLM MLA with the absorbed query):
  q            [B, H, 576] bf16     512 latent dims + 64 rope dims
  kv_cache     [num_pages, page_size, 576] float8_e4m3fn or bf16; V is the first 512 dims of each row
  block_table  [B, max_pages] int32 page ids (page_size 1: token slots, SGLang's layout)
  seq_lens     [B] int32, 0 <= seq_len <= max_pages * page_size
The cache holds values divided by `kv_scale` (one per-tensor scale); attention uses kv_cache * kv_scale.
"""

from __future__ import annotations

import math
import os
from numbers import Real

import torch

from decodegap.kernels.mla_layout import HEAD_DIM, KV_DTYPES, LATENT_DIM, ROPE_DIM  # noqa: F401  (re-exported)

IMPLS = ("reference", "full_cast", "gather_cast", "triton")


def mla_decode(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    kv_scale: float = 1.0,
    impl: str = "triton",
    return_lse: bool = False,
    validate: bool = True,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Decode attention of one query token per sequence against its paged latent KV.

    Returns the output [B, H, 512] bf16, and with `return_lse` also the log-sum-exp of the scaled scores
    [B, H] float32 (natural log; -inf for an empty sequence, whose output is zeros).

    Checks that read tensor values (page ids in range, lengths within the table) synchronize with the device
    once; they are skipped while a CUDA graph is being captured, where a sync is not allowed.

    `validate=False` is for engines and hot loops that guarantee valid tables themselves: it skips those value
    checks, and the torch paths then attend over the table's whole span (masked) instead of reading the longest
    length back, so the call never waits for the device (eager mode included). The shape/dtype/device checks
    still run (they read no tensor values). An out-of-range page id or length is then undefined behaviour: the
    Triton kernel reads whatever that address holds, or faults.
    """
    check_args(q, kv_cache, block_table, seq_lens, sm_scale, kv_scale, impl)
    if validate and not _capturing(q):
        check_values(kv_cache, block_table, seq_lens)
    if impl == "triton":
        if not q.is_cuda and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
            raise ValueError("impl='triton' needs CUDA tensors (or TRITON_INTERPRET=1 to run it on the CPU)")
        # Imported here so that the torch paths work where triton is not installed.
        from decodegap.kernels.mla_decode_triton import mla_decode_triton

        return mla_decode_triton(q, kv_cache, block_table, seq_lens, sm_scale, kv_scale, return_lse=return_lse)
    max_len, ragged = _padded_len(block_table, seq_lens, kv_cache.shape[1], q, read_lens=validate)
    path = {"reference": reference, "full_cast": full_cast, "gather_cast": gather_cast}[impl]
    out, lse = path(q, kv_cache, block_table, seq_lens, sm_scale, kv_scale, max_len, ragged)
    return (out, lse) if return_lse else out


# ----------------------------------------------------------------------------------------------------------
# Argument checks: one-line messages, TypeError for a wrong type/dtype, ValueError for a wrong shape or value.


def check_args(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    kv_scale: float,
    impl: str,
) -> None:
    """Checks everything that needs no tensor values (no device sync)."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {', '.join(IMPLS)}; got {impl!r}")
    for name, t in (("q", q), ("kv_cache", kv_cache), ("block_table", block_table), ("seq_lens", seq_lens)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor; got {type(t).__name__}")
    for name, x in (("sm_scale", sm_scale), ("kv_scale", kv_scale)):
        if isinstance(x, bool) or not isinstance(x, Real):
            raise TypeError(f"{name} must be a real number; got {type(x).__name__}")
        if not (math.isfinite(float(x)) and float(x) > 0):
            raise ValueError(f"{name} must be finite and > 0; got {x}")
    if q.dtype != torch.bfloat16:
        raise TypeError(f"q must be bfloat16; got {q.dtype}")
    if q.dim() != 3 or q.shape[2] != HEAD_DIM:
        raise ValueError(f"q must have shape [B, H, {HEAD_DIM}]; got {list(q.shape)}")
    if q.shape[1] < 1:
        raise ValueError("q must have at least one head")
    if kv_cache.dtype not in KV_DTYPES:
        raise TypeError(f"kv_cache must be float8_e4m3fn or bfloat16; got {kv_cache.dtype}")
    if kv_cache.dim() != 3 or kv_cache.shape[2] != HEAD_DIM:
        raise ValueError(f"kv_cache must have shape [num_pages, page_size, {HEAD_DIM}]; got {list(kv_cache.shape)}")
    if kv_cache.shape[0] < 1 or kv_cache.shape[1] < 1:
        raise ValueError(f"kv_cache must hold at least one page of one slot; got {list(kv_cache.shape)}")
    if kv_cache.stride(2) != 1:
        raise ValueError("kv_cache rows must be contiguous (stride 1 in the last dimension)")
    if block_table.dtype != torch.int32:
        raise TypeError(f"block_table must be int32; got {block_table.dtype}")
    if seq_lens.dtype != torch.int32:
        raise TypeError(f"seq_lens must be int32; got {seq_lens.dtype}")
    batch = q.shape[0]
    if block_table.dim() != 2 or block_table.shape[0] != batch:
        raise ValueError(f"block_table must have shape [B={batch}, max_pages]; got {list(block_table.shape)}")
    if seq_lens.shape != (batch,):
        raise ValueError(f"seq_lens must have shape [B={batch}]; got {list(seq_lens.shape)}")
    devices = {t.device for t in (q, kv_cache, block_table, seq_lens)}
    if len(devices) != 1:
        raise ValueError(
            f"q, kv_cache, block_table and seq_lens must be on one device; got {sorted(map(str, devices))}")


def check_values(kv_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor) -> None:
    """Checks lengths and the page ids that the lengths make live (entries past a sequence's end are ignored).

    One device sync: all conditions are reduced on the device and read back together.
    """
    if seq_lens.numel() == 0:
        return
    num_pages, page_size = kv_cache.shape[0], kv_cache.shape[1]
    max_pages = block_table.shape[1]
    lens = seq_lens.long()
    pages_used = (lens + page_size - 1) // page_size
    live = torch.arange(max_pages, device=block_table.device)[None, :] < pages_used[:, None]
    bad_page = live & ((block_table < 0) | (block_table >= num_pages))
    flags = torch.stack(
        [(lens < 0).any(), (lens > max_pages * page_size).any(), bad_page.any()]
    ).tolist()
    if flags[0]:
        raise ValueError("seq_lens must be >= 0")
    if flags[1]:
        raise ValueError(f"seq_lens must be <= max_pages * page_size = {max_pages * page_size}")
    if flags[2]:
        b, p = (int(i) for i in bad_page.nonzero()[0].tolist())
        raise ValueError(
            f"block_table[{b}, {p}] = {int(block_table[b, p])} is outside the cache's {num_pages} pages"
        )


def _capturing(t: torch.Tensor) -> bool:
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def _padded_len(
    block_table: torch.Tensor, seq_lens: torch.Tensor, page_size: int, like: torch.Tensor, read_lens: bool = True
) -> tuple[int, bool]:
    """The padded length the torch paths attend over (the longest sequence; the table's span under capture or
    when the lengths must not be read back), and whether any sequence is shorter than that (then padded rows
    must be masked)."""
    if seq_lens.numel() == 0 or not read_lens or _capturing(like):
        return block_table.shape[1] * page_size, True
    lo, hi = torch.stack(list(torch.aminmax(seq_lens))).tolist()  # one sync
    return hi, lo != hi


# ----------------------------------------------------------------------------------------------------------
# Torch paths. They gather each sequence's rows into a padded [B, L, 576] batch; when there is padding, padded
# rows are zeroed after the cast so that garbage (even NaN) in unused slots cannot leak through 0 * NaN.


def token_rows(
    block_table: torch.Tensor, seq_lens: torch.Tensor, page_size: int, max_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat cache row of each (sequence, position) [B, L] int64 (0 where padded) and the validity mask [B, L]."""
    pos = torch.arange(max_len, device=block_table.device)
    valid = pos[None, :] < seq_lens.long()[:, None]
    page_idx = (pos // page_size).expand(block_table.shape[0], -1)
    pages = block_table.long().gather(1, page_idx.clamp(max=max(block_table.shape[1] - 1, 0)))
    rows = pages * page_size + (pos % page_size)[None, :]
    return torch.where(valid, rows, torch.zeros_like(rows)), valid


def _gather(kv_cache: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    return kv_cache.reshape(-1, HEAD_DIM)[rows]


def _zero_padding(kv: torch.Tensor, valid: torch.Tensor, ragged: bool) -> torch.Tensor:
    return kv.masked_fill(~valid[..., None], 0) if ragged else kv


def _softmax_out(scores: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked softmax over the last dim in float32; empty rows give p = 0 and lse = -inf."""
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    p = torch.exp(scores - torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)[..., None])
    return p, lse


def reference(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    kv_scale: float,
    max_len: int,
    ragged: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The oracle: dequantize to float32 and attend in float32."""
    rows, valid = token_rows(block_table, seq_lens, kv_cache.shape[1], max_len)
    kv = _zero_padding(_gather(kv_cache, rows).float(), valid, True) * kv_scale
    scores = torch.einsum("bhd,bld->bhl", q.float(), kv) * sm_scale
    p, lse = _softmax_out(scores, valid)
    out = torch.einsum("bhl,bld->bhd", p, kv[..., :LATENT_DIM])
    return out.to(torch.bfloat16), lse


def _attend_bf16(
    q: torch.Tensor, kv: torch.Tensor, valid: torch.Tensor, sm_scale: float, kv_scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """What an engine's BF16 attention does with the cast cache: bf16 matmuls, float32 softmax."""
    scores = torch.matmul(q, kv.transpose(1, 2)).float() * (sm_scale * kv_scale)
    p, lse = _softmax_out(scores, valid)
    out = torch.matmul(p.to(torch.bfloat16), kv[..., :LATENT_DIM]).float() * kv_scale
    return out.to(torch.bfloat16), lse


def full_cast(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    kv_scale: float,
    max_len: int,
    ragged: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The incident's path: cast the WHOLE pool to bf16 (every layer, every step), then attend."""
    pool = kv_cache.to(torch.bfloat16)
    rows, valid = token_rows(block_table, seq_lens, kv_cache.shape[1], max_len)
    kv = _zero_padding(_gather(pool, rows), valid, ragged)
    return _attend_bf16(q, kv, valid, sm_scale, kv_scale)


def gather_cast(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    kv_scale: float,
    max_len: int,
    ragged: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The incident's patch: gather only the live rows, cast those, then attend."""
    rows, valid = token_rows(block_table, seq_lens, kv_cache.shape[1], max_len)
    kv = _zero_padding(_gather(kv_cache, rows).to(torch.bfloat16), valid, ragged)
    return _attend_bf16(q, kv, valid, sm_scale, kv_scale)
