"""Render a Floor as a terminal table (rich), Markdown, or JSON."""

from __future__ import annotations

import io
import json

from decodegap.floor.floor import Floor

FORMATS = ("text", "md", "json")


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.3f}"


def _billions(n: int) -> str:
    return f"{n / 1e9:.2f}B"


def _headline(floor: Floor) -> str:
    return (
        f"{floor.model_type} on {floor.tp} x {floor.gpu}, batch {floor.batch}, context {floor.context}: "
        f"floor {floor.floor_ms:.3f} ms/step = {floor.tokens_per_s:.1f} tok/s per sequence "
        f"({floor.aggregate_tokens_per_s:.1f} aggregate), {floor.bound}-bound"
    )


def _params_line(floor: Floor) -> str:
    line = (
        f"params: {_billions(floor.params.total)} total, {_billions(floor.params.active)} active per token "
        f"(output head counted, embedding table not; {_billions(floor.params.active_with_embeddings)} with "
        f"the embedding table, {_billions(floor.params.active_non_embedding)} without embedding and head)"
    )
    if floor.params.mtp:
        line += f", MTP {_billions(floor.params.mtp)} not counted"
    return line


def _memory_line(floor: Floor) -> str:
    memory = floor.memory_per_gpu
    line = f"memory per GPU: weights {_gb(memory.weights_bytes)} GB + KV {_gb(memory.kv_bytes)} GB"
    if memory.gpu_bytes:
        line += f" of {memory.gpu_bytes / 2**30:g} GB ({'fits' if memory.fits else 'does NOT fit'})"
    return line


def _replicated_line(floor: Floor) -> str | None:
    rep = floor.replicated_weights
    if not rep.modules:
        return None
    return (
        f"replicated by engines (not in the floor): {', '.join(rep.modules)}: "
        f"+{_gb(rep.extra_bytes_per_gpu)} GB/GPU, +{rep.extra_ms:.3f} ms/step"
    )


def _memory_bytes(floor: Floor) -> float:
    """Bytes read from GPU memory; the all-reduce's wire bytes are not memory traffic."""
    return sum(c.bytes_per_gpu for c in floor.components if c.category != "collective")


def _rows(floor: Floor) -> list[list[str]]:
    rows = []
    for c in floor.components:
        share = c.ms / floor.floor_ms if floor.floor_ms else 0.0
        rows.append(
            [
                c.name,
                _gb(c.bytes_per_gpu),
                f"{c.memory_ms:.3f}",
                f"{c.compute_ms:.3f}",
                f"{c.ms:.3f}",
                f"{share:.1%}",
                c.bound,
                c.formats,
                c.detail,
            ]
        )
    return rows


HEADERS = ["component", "GB/GPU", "memory ms", "compute ms", "ms", "share", "bound", "format", "detail"]


def render_text(floor: Floor, width: int = 140) -> str:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=_headline(floor), title_justify="left")
    for i, head in enumerate(HEADERS):
        table.add_column(head, justify="right" if 1 <= i <= 5 else "left")
    for row in _rows(floor):
        table.add_row(*row)
    table.add_row(
        "total",
        _gb(_memory_bytes(floor)),
        "",
        "",
        f"{floor.floor_ms:.3f}",
        "100%",
        floor.bound,
        "",
        "",
        style="bold",
    )
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, no_color=True, highlight=False, markup=False)
    console.print(table)
    for warning in floor.warnings:
        console.print(f"warning: {warning}")
    console.print(_params_line(floor))
    console.print(_memory_line(floor))
    console.print(f"quant: {floor.quant}")
    rep = _replicated_line(floor)
    if rep:
        console.print(rep)
    console.print("lower bound; assumes:")
    for a in floor.assumptions:
        console.print(f"  - {a}")
    return buffer.getvalue()


def render_markdown(floor: Floor) -> str:
    lines = [
        f"**{_headline(floor)}**",
        "",
        "| " + " | ".join(HEADERS) + " |",
        "|" + "|".join("---:" if 1 <= i <= 5 else "---" for i in range(len(HEADERS))) + "|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in _rows(floor)]
    lines += [
        f"| **total** | {_gb(_memory_bytes(floor))} | | | **{floor.floor_ms:.3f}** | 100% "
        f"| {floor.bound} | | |",
        "",
        f"- {_params_line(floor)}",
        f"- {_memory_line(floor)}",
        f"- quant: {floor.quant}",
    ]
    lines[2:2] = [f"> **warning:** {w}" for w in floor.warnings] + ([""] if floor.warnings else [])
    rep = _replicated_line(floor)
    if rep:
        lines.append(f"- {rep}")
    lines += ["", "Lower bound; assumes:", ""] + [f"- {a}" for a in floor.assumptions]
    return "\n".join(lines) + "\n"


def render_json(floor: Floor) -> str:
    return json.dumps(floor.to_dict(), indent=2) + "\n"


def render(floor: Floor, fmt: str = "text") -> str:
    if fmt == "json":
        return render_json(floor)
    if fmt in ("md", "markdown"):
        return render_markdown(floor)
    return render_text(floor)
