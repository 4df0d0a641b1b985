"""The same trace written the ways tools write traces: Kineto's own layout and the layouts of json.dump, trimming and
merging scripts, HTA/TraceLens merges and Windows editors. Every layout holds the same JSON value."""

from __future__ import annotations

import gzip
import json
from pathlib import Path


def _members(items: dict, **dump) -> list[str]:
    return [f"{json.dumps(k)}: {json.dumps(v, **dump)}" for k, v in items.items()]


def kineto(doc: dict) -> str:
    """torch's exporter: the header members, then one event per block separated by `},\\n  {`, then the rest."""
    events, meta = doc["traceEvents"], {k: v for k, v in doc.items() if k != "traceEvents"}
    head = "".join(f"  {m},\n" for m in _members(meta))
    return "{\n" + head + '  "traceEvents": [\n  ' + ",\n  ".join(json.dumps(e) for e in events) + '\n  ],\n' \
        '  "traceName": "layout.json"\n}\n'


def lines(doc: dict) -> str:
    """One event per line, without indentation (what line-oriented scripts write)."""
    events, meta = doc["traceEvents"], {k: v for k, v in doc.items() if k != "traceEvents"}
    return "{" + "".join(m + ", " for m in _members(meta)) + '"traceEvents": [\n' \
        + ",\n".join(json.dumps(e) for e in events) + "\n]}\n"


def minified(doc: dict) -> str:
    """`json.dump(doc, f, separators=(",", ":"))`: one line, no blank space."""
    return json.dumps(doc, separators=(",", ":"))


def sorted_events_first(doc: dict) -> str:
    """Every key sorted, traceEvents the first member: the metadata comes after the events."""
    meta = {k: v for k, v in doc.items() if k != "traceEvents"}
    rest = json.dumps(meta, sort_keys=True)[1:] if meta else "}"
    return '{"traceEvents": ' + json.dumps(doc["traceEvents"], sort_keys=True) + (", " + rest if meta else rest)


def sorted_events_last(doc: dict) -> str:
    """Every key sorted, traceEvents the last member: the metadata comes before the events."""
    meta = {k: v for k, v in doc.items() if k != "traceEvents"}
    text = json.dumps(meta, sort_keys=True)[:-1]
    return text + (", " if meta else "") + '"traceEvents": ' + json.dumps(doc["traceEvents"], sort_keys=True) + "}"


def sort_keys(doc: dict) -> str:
    """`json.dump(doc, f, sort_keys=True)`: traceEvents among the metadata (after baseTimeNanoseconds,
    deviceProperties, ..., before traceName)."""
    return json.dumps({**doc, "traceName": "layout.json"}, sort_keys=True)


def indent2_crlf(doc: dict) -> str:
    """`json.dump(doc, f, indent=2)` saved with Windows line ends."""
    return json.dumps(doc, indent=2).replace("\n", "\r\n") + "\r\n"


def bare(doc: dict) -> str:
    """The JSON Array Format of chrome://tracing: the events only (no metadata)."""
    return json.dumps(doc["traceEvents"])


LAYOUTS = {f.__name__: f for f in (kineto, lines, minified, sorted_events_first, sorted_events_last, sort_keys,
                                   indent2_crlf, bare)}


def write_layout(doc: dict, layout: str, path: Path) -> Path:
    text = LAYOUTS[layout](doc).encode()
    path.write_bytes(gzip.compress(text, 1) if path.name.endswith(".gz") else text)
    return path
