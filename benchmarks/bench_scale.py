"""How analyze scales: wall time and peak RSS against json.load at 1x, 4x and 8x of a trace, and a folder of ranks
analyzed with --jobs 1, --jobs 2 and --ray.

The bigger traces are the trace's events replicated with shifted times and unique ids (correlation, External id,
flow ids, ProfilerStep numbers), written in Kineto's layout under --workdir (never into the repository). The rank
folder holds copies of the 1x trace named `rank-<n>`. Each measurement runs in a fresh subprocess, one at a time.

    python benchmarks/bench_scale.py ../shared/traces/mla_full_cast_steps.json.gz --workdir /tmp/decodegap_scale
"""

from __future__ import annotations

import argparse
import gzip
import os
import json
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

STEP_NAME = re.compile(r"^ProfilerStep#(\d+)$")
REPLICA_GAP_US = 1000.0  # idle time between one replica's end and the next one's start

RUNNER = """
import resource, sys, time
PATH = sys.argv[1]
t0 = time.perf_counter()
{body}
wall = time.perf_counter() - t0
me = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print("RESULT", wall, me, kids)
"""

JSON_LOAD = ("import gzip, json\nopener = gzip.open if PATH.endswith('.gz') else open\n"
             "with opener(PATH, 'rb') as f:\n    doc = json.load(f)")
ANALYZE = ("import decodegap\na = decodegap.analyze(PATH{extra})\n"
           "print('STEPS', a.steps.decode.count, a.steps.decode.ms.median)\n"
           "open(sys.argv[2], 'w').write(a.to_json()) if len(sys.argv) > 2 else None")


# --- making the traces ------------------------------------------------------------------------------------------

def _shift(event: dict, k: int, span_us: float, ids: dict[str, int], step_stride: int) -> dict:
    e = dict(event)
    if k == 0:
        return e
    if isinstance(e.get("ts"), (int, float)):
        e["ts"] = e["ts"] + k * span_us
    args = e.get("args")
    if isinstance(args, dict):
        args = dict(args)
        for key in ("correlation", "External id"):
            if isinstance(args.get(key), int) and args[key] > 0:
                args[key] += k * ids[key]
        e["args"] = args
    if isinstance(e.get("id"), int):  # flow events (ac2g) pair by id
        e["id"] += k * ids["id"]
    name = e.get("name")
    if isinstance(name, str):
        m = STEP_NAME.match(name)
        if m:
            e["name"] = f"ProfilerStep#{int(m.group(1)) + k * step_stride}"
    return e


def replicate(src: Path, dst: Path, copies: int) -> None:
    """`copies` back-to-back replicas of src's events, written to dst (.json.gz) in Kineto's layout."""
    with gzip.open(src, "rb") if src.suffix == ".gz" else open(src, "rb") as f:
        doc = json.load(f)
    events = doc.pop("traceEvents")
    timed = [e for e in events if isinstance(e, dict) and e.get("ph") == "X" and isinstance(e.get("ts"), (int, float))]
    start = min(e["ts"] for e in timed)
    end = max(e["ts"] + (e.get("dur") or 0) for e in timed)
    span = end - start + REPLICA_GAP_US
    ids = {"correlation": 0, "External id": 0, "id": 0}
    steps = [0]
    for e in events:
        if not isinstance(e, dict):
            continue
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        for key in ("correlation", "External id"):
            if isinstance(args.get(key), int):
                ids[key] = max(ids[key], args[key])
        if isinstance(e.get("id"), int):
            ids["id"] = max(ids["id"], e["id"])
        m = STEP_NAME.match(e["name"]) if isinstance(e.get("name"), str) else None
        if m:
            steps.append(int(m.group(1)))
    ids = {key: value + 1 for key, value in ids.items()}
    header = json.dumps(doc)[:-1] + (", " if doc else "") + '"traceEvents": [\n  '
    tmp = dst.with_name(dst.name + ".part")
    with gzip.open(tmp, "wt", compresslevel=1) as out:
        out.write(header)
        first = True
        for k in range(copies):
            for e in events:
                out.write(("" if first else ",\n  ") + json.dumps(_shift(e, k, span, ids, max(steps) + 1)
                                                            if isinstance(e, dict) else e))
                first = False
        out.write("\n  ]\n}\n")
    tmp.replace(dst)


def make_inputs(src: Path, workdir: Path, scales: list[int], ranks: int) -> tuple[dict[int, Path], Path]:
    workdir.mkdir(parents=True, exist_ok=True)
    traces = {}
    for n in scales:
        path = src if n == 1 else workdir / f"x{n}.json.gz"
        if not path.exists():
            t0 = time.perf_counter()
            replicate(src, path, n)
            print(f"made {path} ({path.stat().st_size / 1e6:.0f} MB gzipped) in {time.perf_counter() - t0:.0f} s",
                  file=sys.stderr)
        traces[n] = path
    folder = workdir / f"ranks{ranks}"
    folder.mkdir(exist_ok=True)
    for r in range(ranks):
        target = folder / f"host.{r}.rank-{r}.pt.trace.json.gz"
        if not target.exists():
            shutil.copyfile(src, target)
    return traces, folder


# --- measuring --------------------------------------------------------------------------------------------------

def measure(body: str, path: Path, *extra: str) -> dict:
    out = subprocess.run([sys.executable, "-c", RUNNER.format(body=body), str(path), *extra], capture_output=True,
                         text=True)
    if out.returncode:
        raise SystemExit(f"failed on {path}:\n{out.stderr[-3000:]}")
    result = {}
    for line in out.stdout.splitlines():
        words = line.split()
        if words and words[0] == "RESULT":
            result.update(wall=float(words[1]), rss=float(words[2]), child_rss=float(words[3]))
        elif words and words[0] == "STEPS":
            result.update(steps=int(words[1]), median=float(words[2]))
    return result


def _median(runs: list[dict], key: str):
    values = [r[key] for r in runs if key in r]
    return statistics.median(values) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/decodegap_scale"))
    parser.add_argument("--scales", default="1,4,8")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=1, help="alternating runs per case (medians)")
    parser.add_argument("--no-ray", action="store_true")
    args = parser.parse_args()
    scales = [int(s) for s in args.scales.split(",") if s]
    print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores\n")
    traces, folder = make_inputs(args.trace, args.workdir, scales, args.ranks)

    if traces:
        print("| trace | events (x) | json.load s | json.load MB | analyze s | analyze MB | wall vs json.load | "
              "RSS vs json.load | decode steps | median ms |")
        print("|---|---|---|---|---|---|---|---|---|---|")
    for n, path in traces.items():
        base, ours = [], []
        for _ in range(args.repeat):
            base.append(measure(JSON_LOAD, path))
            ours.append(measure(ANALYZE.format(extra=", jobs=1"), path))
        bw, br, ow, orss = (_median(base, "wall"), _median(base, "rss"), _median(ours, "wall"), _median(ours, "rss"))
        print(f"| {path.name} | {n} | {bw:.2f} | {br:.0f} | {ow:.2f} | {orss:.0f} | {ow / bw:.2f} | {orss / br:.3f} | "
              f"{ours[0].get('steps')} | {ours[0].get('median'):.3f} |", flush=True)

    cases = {"--jobs 1": ", jobs=1", "--jobs 2": ", jobs=2"}
    if not args.no_ray:
        cases["--ray (local, 2 CPUs)"] = ", ray=True"
    print(f"\n{args.ranks}-rank folder of {args.trace.name}:\n")
    print("| run | wall s | vs --jobs 1 | driver peak RSS MB | largest worker peak RSS MB | report |")
    print("|---|---|---|---|---|---|")
    reports, rows = {}, {name: [] for name in cases}
    for _ in range(args.repeat):
        for name, extra in cases.items():
            out = args.workdir / f"report {name}.json".replace(" ", "_").replace("/", "_")
            rows[name].append(measure(ANALYZE.format(extra=extra), folder, str(out)))
            reports[name] = out.read_text()
    first = reports["--jobs 1"]
    base = _median(rows["--jobs 1"], "wall")
    for name in cases:
        wall = _median(rows[name], "wall")
        kids = _median(rows[name], "child_rss")
        same = "identical" if reports[name] == first else "DIFFERS"
        print(f"| {name} | {wall:.2f} | {wall / base:.2f} | {_median(rows[name], 'rss'):.0f} | "
              f"{kids:.0f} | {same} |" if kids else
              f"| {name} | {wall:.2f} | {wall / base:.2f} | {_median(rows[name], 'rss'):.0f} | - | {same} |")


if __name__ == "__main__":
    main()
