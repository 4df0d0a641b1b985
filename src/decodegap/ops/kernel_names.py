"""Readable short names for C++ kernel symbols (the full name stays in the report)."""

from __future__ import annotations

import re
from functools import lru_cache

# What a templated PyTorch kernel actually computes, most specific first. Every pattern is anchored at the start
# of an identifier (\b): unanchored, r"\w+Functor" retries from every character of a long identifier, which is
# quadratic (minutes on a 200 kB template name). A leftmost match always starts at an identifier's start, so the
# anchor changes no result.
_HINTS = [  # (literals one of which the match contains: a cheap test that skips the scan, pattern)
    (("_kernel_cuda",), re.compile(r"\b(\w+_kernel_cuda)")),
    (("Functor",), re.compile(r"\b((?!Binary|AUnary|BUnary)\w+Functor\w*)")),
    (("Functor",), re.compile(r"\b(\w+Functor\w*)")),
    (("Op",), re.compile(r"\b(\w+Ops?)(?=<)")),
    (("silu", "gelu", "_functor"), re.compile(r"\b(silu\w*|gelu\w*|\w+_functor)")),
]
_GENERIC_BASES = {"Kernel", "Kernel2", "kernel", "device_kernel", "launch_kernel"}
_LAMBDA_DTYPE = re.compile(r"lambda\((c10::BFloat16|c10::Half|float|c10::Float8_e4m3fn|c10::Float8_e5m2)\)")
_DTYPE_SHORT = {"c10::BFloat16": "bf16", "c10::Half": "fp16", "float": "fp32", "c10::Float8_e4m3fn": "fp8e4m3",
                "c10::Float8_e5m2": "fp8e5m2"}


_COMPILER_GENERATED = re.compile(r"^(triton|cpp)_")  # Inductor's kernels, named for the ops they fuse


def compiler_generated(name: str) -> bool:
    """A kernel a compiler generated (Inductor's `triton_poi_fused_...`, `cpp_fused_...`)."""
    return _COMPILER_GENERATED.match(name) is not None


@lru_cache(maxsize=None)
def short_kernel_name(name: str, limit: int = 72) -> str:
    text = name.replace("(anonymous namespace)::", "")
    text = text[5:] if text.startswith("void ") else text
    head = re.split(r"[<(]", text, maxsplit=1)[0]
    base = head.rsplit("::", 1)[-1] or head
    rest = text[len(head):]
    if base in _GENERIC_BASES:  # cutlass::Kernel2<cutlass_80_..._gemm...>: the template argument is the name
        inner = re.match(r"<\s*([\w:]+)", rest)
        if inner:
            return short_kernel_name(inner.group(1), limit)
    extras = []
    for literals, hint in _HINTS:
        found = hint.search(rest) if any(word in rest for word in literals) else None
        if found and found.group(1) != base and not found.group(1).startswith("gpu_kernel_impl"):
            extras.append(found.group(1).rsplit("::", 1)[-1])
            break
    if "LoadWithCast" in rest or "StoreWithCast" in rest:
        dtype = _LAMBDA_DTYPE.search(rest)
        extras.append("cast->" + _DTYPE_SHORT[dtype.group(1)] if dtype else "cast")
    short = f"{base}<{', '.join(extras)}>" if extras else base
    return short if len(short) <= limit else short[: limit - 3] + "..."
