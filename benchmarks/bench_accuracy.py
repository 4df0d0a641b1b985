"""Accuracy of step, phase, layer and workload detection on the corpus of real traces (issue 20).

For every `<name>.truth.json` in tests/fixtures/traces/corpus (or the folders given), runs `decodegap.analyze` on
`<name>.json.gz` and compares with the truth the generator wrote (scripts/make_accuracy_corpus.py; never decodegap):

- steps by phase: decode = the truth's decode forwards; prefill = its prefill + extend forwards; mixed = its mixed
  forwards (0 where it has none); training = its training iterations (all four must be equal);
- layers (skipped where a training truth has no layer count);
- layer kinds: the sorted counts of the distinct decoder layers: by module structure (dense / MoE / mamba / linear
  attention) and, where the config names them, by attention type (`layer_types`: sliding / full) or rotary
  embedding (`no_rope_layers`), as the issue asks
  of unlike layers (decodegap's empty `layer_kinds`
  means one kind of `layers` layers);
- workload (inference | training).
A cut file whose truth says no whole step can be salvaged (`expect_user_error`) is right when analyze raises
decodegap's UserError (exit 2 in the CLI).

    python benchmarks/bench_accuracy.py [FOLDER ...] [--warnings] [--json OUT]

One row per trace, then `accuracy: R/N traces right` as the last line.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "tests", "fixtures", "traces", "corpus")
PHASES = ("prefill", "decode", "mixed", "training")


@dataclass
class Row:
    name: str
    family: str
    loop: str
    want_steps: dict
    got_steps: dict | None
    want_layers: int | None
    got_layers: int | None
    want_kinds: list
    got_kinds: list | None
    want_workload: str
    got_workload: str | None
    expect_error: bool
    got_error: str | None
    ok: bool
    why: list = field(default_factory=list)
    warnings: list = field(default_factory=list)
    seconds: float = 0.0


PER_LAYER_CONFIG = ("layer_types", "no_rope_layers")  # config lists that tell layers apart (attention type; NoPE)


def want_kinds(truth: dict) -> list:
    """Kinds from the generator's truth: the structural kinds, split further by the config's per-layer lists (layer
    types; SmolLM3's layers without rotary embedding)."""
    detail = truth.get("layer_kind_detail") or []
    if not detail:
        return sorted(truth.get("layer_kinds") or [])
    kind_of = {i: k for k, d in enumerate(detail) for i in d["layers"]}
    config = truth.get("config_info") or {}
    lists = [config[k] for k in PER_LAYER_CONFIG if isinstance(config.get(k), list) and len(config[k]) == len(kind_of)]
    keys = [(kind_of[i], *(v[i] for v in lists)) for i in sorted(kind_of)]
    return sorted(keys.count(k) for k in set(keys))


def truth_files(folders: list[str]) -> list[str]:
    out = []
    for folder in folders:
        out += sorted(glob.glob(os.path.join(folder, "*.truth.json")))
    return out


def want_steps(truth: dict) -> dict:
    s = truth.get("steps") or {}
    return {"prefill": s.get("prefill", 0) + s.get("extend", 0), "decode": s.get("decode", 0),
            "mixed": s.get("mixed", 0), "training": s.get("training", 0)}


def evaluate(truth_path: str) -> Row:
    """Analyze one corpus trace and compare it with its truth file."""
    from decodegap import analyze
    from decodegap.errors import UserError

    truth = json.load(open(truth_path))
    trace = os.path.join(os.path.dirname(truth_path), truth.get("trace") or
                         os.path.basename(truth_path).replace(".truth.json", ".json.gz"))
    want = want_steps(truth)
    expect_error = bool(truth.get("expect_user_error"))
    row = Row(name=truth["name"], family=truth.get("family", "?"), loop=truth.get("loop", "?"), want_steps=want,
              got_steps=None, want_layers=truth.get("layers"), got_layers=None,
              want_kinds=want_kinds(truth), got_kinds=None,
              want_workload=truth.get("workload", "inference"), got_workload=None, expect_error=expect_error,
              got_error=None, ok=False)
    t0 = time.perf_counter()
    try:
        a = analyze(trace)
    except UserError as exc:
        row.seconds = time.perf_counter() - t0
        row.got_error = f"UserError: {exc}"
        row.ok = expect_error
        if not expect_error:
            row.why.append("refused a trace with whole steps")
        return row
    except Exception as exc:  # a crash is a wrong answer, not a broken bench
        row.seconds = time.perf_counter() - t0
        row.got_error = f"{type(exc).__name__}: {exc}"
        row.why.append("crashed")
        return row
    row.seconds = time.perf_counter() - t0
    row.got_steps = {p: getattr(a.steps, p).count for p in PHASES}
    row.got_layers = a.layers
    row.got_kinds = sorted(k.count for k in a.layer_kinds) or ([a.layers] if a.layers else [])
    row.got_workload = a.workload
    row.warnings = list(a.warnings)
    if expect_error:
        row.why.append("analyzed a file with no whole step instead of refusing it")
    if row.got_steps != want:
        row.why.append("steps")
    skip_layers = row.want_workload == "training" and row.want_layers is None
    if not skip_layers and row.got_layers != row.want_layers:
        row.why.append("layers")
    if not skip_layers and row.want_kinds and row.got_kinds != row.want_kinds:
        row.why.append("kinds")
    if row.got_workload != row.want_workload:
        row.why.append("workload")
    row.ok = not row.why
    return row


def _steps(s: dict | None) -> str:
    if s is None:
        return "-"
    return " ".join(f"{p[0].upper()}{s[p]}" for p in PHASES if s.get(p)) or "0"


def _kinds(k: list | None) -> str:
    return "-" if k is None else "+".join(str(x) for x in k) or "-"


def table(rows: list[Row], show_warnings: bool = False) -> str:
    head = ("trace", "family", "loop", "steps want", "steps got", "layers", "kinds", "workload", "ok")
    body = []
    for r in rows:
        if r.expect_error:
            want = "UserError"
            got = "UserError" if r.got_error and r.got_error.startswith("UserError") else _steps(r.got_steps)
        else:
            want = _steps(r.want_steps)
            got = _steps(r.got_steps) if r.got_error is None else r.got_error.split(":")[0]
        layers = f"{r.want_layers}/{'-' if r.got_layers is None else r.got_layers}"
        kinds = f"{_kinds(r.want_kinds)}/{_kinds(r.got_kinds)}"
        work = f"{r.want_workload[:5]}/{(r.got_workload or '-')[:5]}"
        body.append((r.name, r.family, r.loop, want, got, layers, kinds, work,
                     "ok" if r.ok else "WRONG " + ",".join(r.why)))
    widths = [max(len(str(x[i])) for x in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(str(v).ljust(w) for v, w in zip(head, widths, strict=True)).rstrip(),
             "  ".join("-" * w for w in widths)]
    for r, cells in zip(rows, body, strict=True):
        lines.append("  ".join(str(v).ljust(w) for v, w in zip(cells, widths, strict=True)).rstrip())
        if show_warnings:
            lines += [f"    warning: {w}" for w in r.warnings]
            if r.got_error:
                lines.append(f"    error: {r.got_error}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="*", default=[CORPUS])
    parser.add_argument("--warnings", action="store_true", help="print decodegap's warnings under each row")
    parser.add_argument("--json", help="write the rows as JSON to this file")
    args = parser.parse_args()
    paths = truth_files(args.folders)
    if not paths:
        sys.exit(f"no *.truth.json in {args.folders}")
    rows = [evaluate(p) for p in paths]
    print(table(rows, args.warnings))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(r) for r in rows], f, indent=1)
    print(f"accuracy: {sum(r.ok for r in rows)}/{len(rows)} traces right")


if __name__ == "__main__":
    main()
