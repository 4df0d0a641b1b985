"""Shared by the record tests: read a written trace the way analyze will (gzip JSON, ProfilerStep# markers)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

TRACE_GLOB = "*.decodegap.pt.trace.json.gz"


def load_trace(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def step_names(trace: dict[str, Any]) -> list[str]:
    return sorted(
        e["name"]
        for e in trace["traceEvents"]
        if e.get("ph") == "X"
        and e.get("cat") in ("user_annotation", "gpu_user_annotation")
        and str(e.get("name", "")).startswith("ProfilerStep#")
    )


def warning_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("decodegap: warning:")]


def all_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []
