"""The base of every record the report holds (the findings, the floor, the gap ledger, the Analysis): a frozen
msgspec Struct with keyword fields, so that each stage emits its records typed and the JSON report is their
encoding."""

from __future__ import annotations

import msgspec


class Struct(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=False):
    pass


def as_json_data(record) -> dict:
    """A record as the JSON report holds it: plain dicts, lists, numbers and strings (tuples as lists), so that it
    equals the parsed JSON."""
    return _lists(msgspec.to_builtins(record))


def _lists(value):
    if isinstance(value, dict):
        return {k: _lists(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_lists(v) for v in value]
    return value
