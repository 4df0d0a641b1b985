"""MLA decode attention over a paged (FP8 or BF16) latent KV cache; see mla_decode.py for the layout.

Importing this package needs torch; triton is imported only when impl="triton" is used.
"""

from decodegap.kernels.mla_decode import IMPLS, mla_decode

__all__ = ["IMPLS", "mla_decode"]
