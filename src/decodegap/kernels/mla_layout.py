"""The MLA cache layout every path shares (the torch paths in mla_decode.py, the Triton and CUDA ones in
mla_decode_triton.py): one latent head per token, 512 latent dims (V is their first 512) + 64 rope dims, stored as
float8_e4m3fn or bfloat16. Both modules import it, so neither imports the other for it."""

from __future__ import annotations

import torch

LATENT_DIM = 512
ROPE_DIM = 64
HEAD_DIM = LATENT_DIM + ROPE_DIM
KV_DTYPES = (torch.float8_e4m3fn, torch.bfloat16)
