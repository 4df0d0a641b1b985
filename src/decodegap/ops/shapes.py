"""What a kernel call touches: tensor shapes and dtypes from the launching op (when the trace recorded shapes),
or elements estimated from the launch shape and the kernel's template (CUDA-graph replay has no op)."""

from __future__ import annotations

import math
import re
from functools import lru_cache

import msgspec

# Bytes per element of the dtype names torch.profiler writes in "Input type".
DTYPE_BYTES = {
    "double": 8, "float": 4, "c10::Half": 2, "c10::BFloat16": 2, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1,
    "c10::Float8_e4m3fnuz": 1, "c10::Float8_e5m2fnuz": 1, "c10::Float8_e8m0fnu": 1, "c10::Float4_e2m1fn_x2": 1,
    "long int": 8, "int": 4, "short int": 2, "signed char": 1, "unsigned char": 1, "bool": 1,
    "c10::complex<float>": 8, "c10::complex<double>": 16,
}
# Lambda argument types in PyTorch copy-kernel names give the output element type.
_LAMBDA_TYPE = re.compile(r"lambda\((c10::BFloat16|c10::Half|float|double|c10::Float8_e4m3fn|c10::Float8_e5m2|"
                          r"long|int|bool)\)")
_NAME_TYPE_BYTES = {"c10::BFloat16": 2, "c10::Half": 2, "float": 4, "double": 8, "c10::Float8_e4m3fn": 1,
                    "c10::Float8_e5m2": 1, "long": 8, "int": 4, "bool": 1}
_UNROLLED_VT = re.compile(r"unrolled_elementwise_kernel<.*?std::array<char\*, \d+ul>, (\d+),")
_ELEMENTWISE_VT = re.compile(r"\belementwise_kernel<(\d+), (\d+),")
_VECTORIZED_VT = re.compile(r"vectorized_elementwise_kernel<(\d+),")


@lru_cache(maxsize=4096)
def parse_json_list(raw: bytes) -> list:
    try:
        value = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return []
    return value if isinstance(value, list) else []


def tensors(dims_raw: bytes | None, types_raw: bytes | None) -> list[tuple[list[int], str]]:
    """(shape, dtype) of each tensor input of an op."""
    if not dims_raw:
        return []
    dims = parse_json_list(dims_raw)
    types = parse_json_list(types_raw) if types_raw else []
    out = []
    for i, shape in enumerate(dims):
        if isinstance(shape, list) and shape and all(isinstance(d, int) for d in shape):
            dtype = types[i] if i < len(types) and isinstance(types[i], str) else ""
            out.append((shape, dtype))
    return out


def numel(shape: list[int]) -> int:
    return math.prod(shape)


def tensor_bytes(shape: list[int], dtype: str) -> int | None:
    size = DTYPE_BYTES.get(dtype)
    return None if size is None else numel(shape) * size


def parse_dim3(text: str) -> tuple[int, int, int] | None:
    value = parse_json_list(text.encode()) if text else []
    if len(value) == 3 and all(isinstance(v, int) for v in value):
        return value[0], value[1], value[2]
    return None


def elements_from_launch(name: str, grid: str, block: str) -> int | None:
    """Elements a PyTorch elementwise/copy kernel covers: threads x elements per thread (from its template).
    An upper bound by at most one block's worth (the last block is partly idle)."""
    g, b = parse_dim3(grid), parse_dim3(block)
    if g is None or b is None:
        return None
    threads = g[0] * g[1] * g[2] * b[0] * b[1] * b[2]
    for pattern, group in ((_UNROLLED_VT, 1), (_ELEMENTWISE_VT, 2), (_VECTORIZED_VT, 1)):
        match = pattern.search(name)
        if match:
            return threads * int(match.group(group))
    return None


def output_dtype_bytes_from_name(name: str) -> int | None:
    match = _LAMBDA_TYPE.search(name)
    return _NAME_TYPE_BYTES.get(match.group(1)) if match else None


# Ops that touch only the indexed rows of their first input, not the whole tensor.
INDEX_OPS = {"aten::index", "aten::index_put_", "aten::_index_put_impl_", "aten::index_select", "aten::gather",
             "aten::scatter", "aten::scatter_", "aten::embedding", "aten::take", "aten::index_copy_"}


def bytes_moved(op: str | None, tensors: list[tuple[list[int], str]]) -> int | None:
    """Bytes one call reads and writes, from its inputs: every input read once (copy_(dst, src) counts the
    destination as its write). Indexing ops count only the rows the index selects, read and written."""
    if not tensors:
        return None
    sizes = [tensor_bytes(shape, dtype) for shape, dtype in tensors]
    if any(s is None for s in sizes):
        return None
    if op in INDEX_OPS:
        source, source_bytes = tensors[0][0], sizes[0]
        index = [shape for shape, dtype in tensors[1:] if dtype in ("long int", "int")]
        if not index or not source:
            return None
        rows = numel(index[0])
        row_bytes = source_bytes // max(source[0], 1)
        return 2 * rows * row_bytes
    return sum(sizes)
