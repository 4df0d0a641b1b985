"""FlashInfer's MLA decode (BatchMLAPagedAttentionWrapper, backends fa3 and fa2) as a benchmark peer, on the very
caches decodegap reads. Used by bench_mla_decode.py only, and only when FlashInfer is importable; the project
never imports or ships it.

On the GPU machine: `bash ../shared/tools/flashinfer_peer.sh DIR` makes a pruned copy here; unpack it
(`tar xzf DIR/flashinfer_pruned.tgz -C /tmp/fi`), install its tvm-ffi wheel (`pip install --no-index --no-deps
--target /tmp/site DIR/apache_tvm_ffi-*.whl`) and put both on PYTHONPATH. Modules that are not prebuilt under
flashinfer/data/aot/ are JIT-built at first plan (about a minute each); benchmarks/h200_run.sh builds them
beforehand.

Same function as decodegap's: the cache holds x / kv_scale. FP8 caches pass kv_scale as FlashInfer's ckv/kpe
scales; BF16 caches (FlashInfer takes no scale there) fold it into sm_scale, and the returned output is
multiplied by kv_scale outside the timed call, so both are checked against decodegap's reference.
"""

from __future__ import annotations

import torch

_WORKSPACE: dict[torch.device, torch.Tensor] = {}


def import_error() -> str | None:
    """None when flashinfer.mla imports, else why not (one line)."""
    try:
        import flashinfer.mla  # noqa: F401
    except Exception as e:  # noqa: BLE001 (any failure means: no peer column)
        return f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
    return None


def version() -> str:
    import flashinfer

    return getattr(flashinfer, "__version__", "?")


class FlashInferMLA:
    """One planned wrapper for one problem; call `run()` (capturable) to decode into `self.out`."""

    def __init__(self, backend: str, q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                 seq_lens: torch.Tensor, sm_scale: float, kv_scale: float):
        from flashinfer.mla import BatchMLAPagedAttentionWrapper, MLAPlanMetadata

        device = q.device
        if device not in _WORKSPACE:
            _WORKSPACE[device] = torch.empty(256 * 2**20, dtype=torch.uint8, device=device)
        batch, num_heads, _ = q.shape
        page_size = kv_cache.shape[1]
        self.fp8 = kv_cache.dtype == torch.float8_e4m3fn
        self.kv_scale = float(kv_scale)
        pages_per_seq = ((seq_lens.long() + page_size - 1) // page_size).int()
        kv_indptr = torch.zeros(batch + 1, dtype=torch.int32, device=device)
        kv_indptr[1:] = torch.cumsum(pages_per_seq, 0)
        live = torch.arange(block_table.shape[1], device=device)[None, :] < pages_per_seq[:, None].long()
        kv_indices = block_table[live].int().contiguous()  # row-major: each sequence's live pages in order
        qo_indptr = torch.arange(batch + 1, dtype=torch.int32, device=device)
        self.wrapper = BatchMLAPagedAttentionWrapper(_WORKSPACE[device], backend=backend)
        self.wrapper.plan(
            metadata=MLAPlanMetadata.csr(qo_indptr, kv_indptr, kv_indices, seq_lens.int().contiguous()),
            num_heads=num_heads, head_dim_ckv=512, head_dim_kpe=64, page_size=page_size, causal=False,
            sm_scale=float(sm_scale) if self.fp8 else float(sm_scale) * self.kv_scale,
            q_data_type=torch.bfloat16, kv_data_type=kv_cache.dtype)
        self.q, self.kv_cache = q, kv_cache
        self.out = torch.empty(batch, num_heads, 512, dtype=torch.bfloat16, device=device)
        self._scales = dict(ckv_scale=self.kv_scale, kpe_scale=self.kv_scale) if self.fp8 else {}

    def run(self) -> torch.Tensor:
        return self.wrapper.run(query=self.q, kv_cache=self.kv_cache, out=self.out, **self._scales)

    def result(self) -> torch.Tensor:
        """The last run's output as decodegap's function (BF16 caches: times kv_scale)."""
        return self.out if self.fp8 else (self.out.float() * self.kv_scale).to(torch.bfloat16)
