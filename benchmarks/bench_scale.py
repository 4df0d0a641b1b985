"""How analyze scales, in every JSON layout: wall time and peak RSS against json.load at 1x and 8x of a trace and at
a ~3 GB replica, in Kineto's layout, one event per line, minified, sorted keys with traceEvents first, and indent=2
with CRLF line ends; and a folder of ranks analyzed with --jobs 1, --jobs 2 and --ray.

The bigger traces are the trace's events replicated with shifted times and unique ids (correlation, External id,
flow ids, ProfilerStep numbers), written (gzipped) in each layout under --workdir (never into the repository) and
deleted once measured. The rank folder holds copies of the 1x trace named `rank-<n>`. Each measurement runs in a
fresh subprocess, one at a time. json.load is measured up to --json-load-max-gb of text; beyond it (it needs ~7x the
text in memory) its figures are extrapolated linearly from the largest two measured scales of the same layout, and
marked `~`. The children import decodegap from compiled bytecode kept under --workdir, as an installed package does
(--compile-each-run: as the environment says, which with PYTHONDONTWRITEBYTECODE compiles the source every run).
The reader decodes on two cores where it can (trace/worker.py): `worker MB` is that process's peak RSS, which counts
the pages it shares with the analysis (all it held when it forked), and in brackets what it held of its own when it
ended; `RSS + worker's own` adds the latter. --alone-too also times each analysis without it.

    python benchmarks/bench_scale.py ../shared/traces/mla_full_cast_steps.json.gz --workdir /tmp/decodegap_scale
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import msgspec

STEP_NAME = re.compile(r"^ProfilerStep#(\d+)$")
REPLICA_GAP_US = 1000.0  # idle time between one replica's end and the next one's start

# CPU time counts the processes it waited for (the reader's second decoding process). Peak RSS from VmHWM (this
# process's own peak since it started): ru_maxrss of a child also counts what the parent
# held when it spawned it (Linux folds the pre-exec peak in), and this parent holds a trace while it writes replicas.
RUNNER = """
import resource, sys, time
PATH = sys.argv[1]
t0 = time.perf_counter()
{body}
wall = time.perf_counter() - t0
me = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
try:
    me = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:")) / 1024
except (OSError, StopIteration):
    pass
kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
usage, reaped = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
print("RESULT", wall, me, kids, usage.ru_utime + usage.ru_stime + reaped.ru_utime + reaped.ru_stime)
"""

JSON_LOAD = ("import gzip, json\nopener = gzip.open if PATH.endswith('.gz') else open\n"
             "with opener(PATH, 'rb') as f:\n    doc = json.load(f)")
ANALYZE = ("import decodegap\na = decodegap.analyze(PATH{extra})\n"
           "print('STEPS', a.steps.decode.count, a.steps.decode.ms.median)\n"
           "from decodegap.trace.worker import LAST_MEMORY as m\n"
           "print('WORKER', m.get('peak_rss', 0) / 2**20, m.get('private', 0) / 2**20) if m else None\n"
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


def _encoders(layout: str, head: dict):
    """(text before the events, separator, text after them, event -> bytes) of one layout."""
    enc = msgspec.json.encode
    if layout == "kineto":  # torch's exporter: header members, then `},\n  {` between events
        top = json.dumps(head)[:-1] + (", " if head else "")
        return (top + '"traceEvents": [\n  ').encode(), b",\n  ", b"\n  ]\n}\n", \
            lambda e: msgspec.json.format(enc(e), indent=0)
    if layout == "lines":  # one event per line, no indentation
        top = json.dumps(head)[:-1] + (", " if head else "")
        return (top + '"traceEvents": [\n').encode(), b",\n", b"\n]}\n", lambda e: msgspec.json.format(enc(e), indent=0)
    if layout == "minified":  # json.dump(doc, f, separators=(",", ":"))
        top = json.dumps(head, separators=(",", ":"))[:-1] + ("," if head else "")
        return (top + '"traceEvents":[').encode(), b",", b"]}", enc
    if layout == "sorted_events_first":  # every key sorted, traceEvents first and the metadata after it
        rest = json.dumps(head, sort_keys=True)[1:] if head else "}"
        return b'{"traceEvents": [', b", ", ("], " + rest if head else "]}").encode(), \
            lambda e: msgspec.json.format(enc(e, order="sorted"), indent=0)
    if layout == "crlf":  # json.dump(doc, f, indent=2) saved with Windows line ends
        top = json.dumps(head, indent=2)[:-2].replace("\n", "\r\n") + (",\r\n" if head else "\r\n")
        return (top + '  "traceEvents": [\r\n    ').encode(), b",\r\n    ", b"\r\n  ]\r\n}\r\n", \
            lambda e: msgspec.json.format(enc(e), indent=2).replace(b"\n", b"\r\n    ")
    raise SystemExit(f"unknown layout {layout!r}; known: {', '.join(LAYOUTS)}")


LAYOUTS = ("kineto", "lines", "minified", "sorted_events_first", "crlf")


def replicate(src: Path, dst: Path, copies: int, layout: str = "kineto") -> int:
    """`copies` back-to-back replicas of src's events, written to dst (.json.gz) in `layout`. Returns the bytes of
    text written."""
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
    before, separator, after, encode = _encoders(layout, doc)
    tmp = dst.with_name(dst.name + ".part")
    written = len(before) + len(after)
    with gzip.open(tmp, "wb", compresslevel=1) as out:
        out.write(before)
        first = True
        for k in range(copies):
            for e in events:
                text = (b"" if first else separator) + encode(_shift(e, k, span, ids, max(steps) + 1)
                                                              if isinstance(e, dict) else e)
                out.write(text)
                written += len(text)
                first = False
        out.write(after)
    tmp.replace(dst)
    return written


def text_bytes(path: Path) -> int:
    """The size of a trace's text (decompressed)."""
    with gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb") as f:
        return sum(len(b) for b in iter(lambda: f.read(1 << 24), b""))


def make_trace(src: Path, workdir: Path, layout: str, copies: int, reuse: bool = False) -> tuple[Path, int, bool]:
    """(path, bytes of text, whether it is a replica to delete) of src's events `copies` times in `layout`: the
    source itself for Kineto's layout at 1x. With `reuse`, a replica already under workdir is used (and kept)."""
    if layout == "kineto" and copies == 1:
        return src, text_bytes(src), False
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / f"{layout}.x{copies}.json.gz"
    if reuse and path.exists():
        return path, text_bytes(path), False
    t0 = time.perf_counter()
    size = replicate(src, path, copies, layout)
    print(f"made {path} ({size / 1e6:.0f} MB of text, {path.stat().st_size / 1e6:.0f} MB gzipped) in "
          f"{time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    return path, size, True


def make_folder(src: Path, workdir: Path, ranks: int) -> Path:
    folder = workdir / f"ranks{ranks}"
    folder.mkdir(parents=True, exist_ok=True)
    for r in range(ranks):
        target = folder / f"host.{r}.rank-{r}.pt.trace.json.gz"
        if not target.exists():
            shutil.copyfile(src, target)
    return folder


# --- measuring --------------------------------------------------------------------------------------------------

# The children import from compiled bytecode, as an installed package does (pip compiles it at install): with
# PYTHONDONTWRITEBYTECODE set (as some shells and containers do) a checkout's source would be compiled again in
# every run, ~0.2-0.3 s of each analysis. The bytecode goes under --workdir (never into the repository); main()
# sets it up and warms it once before measuring. --compile-each-run measures with the environment as it is.
CHILD_ENV: dict[str, str] | None = None


def use_bytecode_cache(workdir: Path) -> None:
    global CHILD_ENV
    CHILD_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    CHILD_ENV["PYTHONPYCACHEPREFIX"] = str(workdir / "pycache")
    subprocess.run([sys.executable, "-c", "import gzip, json, decodegap.api, decodegap.analysis, decodegap.pipeline"],
                   env=CHILD_ENV, check=True)


def measure(body: str, path: Path, *extra: str, env: dict | None = None) -> dict:
    environ = {**(os.environ if CHILD_ENV is None else CHILD_ENV), **(env or {})}
    out = subprocess.run([sys.executable, "-c", RUNNER.format(body=body), str(path), *extra], capture_output=True,
                         text=True, env=environ)
    if out.returncode:
        raise SystemExit(f"failed on {path}:\n{out.stderr[-3000:]}")
    result = {}
    for line in out.stdout.splitlines():
        words = line.split()
        if words and words[0] == "RESULT":
            result.update(wall=float(words[1]), rss=float(words[2]), child_rss=float(words[3]), cpu=float(words[4]))
        elif words and words[0] == "STEPS":
            result.update(steps=int(words[1]), median=float(words[2]))
        elif words and words[0] == "WORKER":  # the second decoding process (trace/worker.py), when one ran
            result.update(worker_rss=float(words[1]), worker_private=float(words[2]))
    return result


def _median(runs: list[dict], key: str):
    values = [r[key] for r in runs if key in r]
    return statistics.median(values) if values else None


def _extrapolated(points: list[tuple[int, float]], size: int) -> float:
    """A straight line through the two largest measured (text bytes, value) points, at `size`."""
    (s0, v0), (s1, v1) = sorted(points)[-2:]
    return v1 + (v1 - v0) / (s1 - s0) * (size - s1)


def layout_table(args) -> None:
    scales = [int(s) for s in args.scales.split(",") if s]
    if args.big_gb:
        scales.append(0)  # its replica count is known once a replica's size is (below)
    layouts = [x for x in args.layouts.split(",") if x]
    print("| layout | trace | text MB | json.load s | json.load MB | analyze s | analyze MB | worker MB (own) | "
          "wall vs json.load | CPU vs json.load | RSS vs json.load | RSS + worker's own vs json.load | "
          "RSS vs Kineto's layout | decode steps | median ms | load avg |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    measured: dict[str, list[tuple[int, float, float, float]]] = {layout: [] for layout in layouts}
    per_copy = text_bytes(args.trace)  # text per replica, from the largest replica written in Kineto's layout
    kept = sorted((int(m.group(1)), p) for p in args.workdir.glob("kineto.x*.json.gz")
                  if (m := re.fullmatch(r"kineto\.x(\d+)\.json\.gz", p.name)) and int(m.group(1)) > 1)
    if args.reuse and kept:  # a replica of a run before: the same count of copies for the big row
        per_copy = text_bytes(kept[0][1]) / kept[0][0]
    for copies in scales:
        copies = copies or math.ceil(args.big_gb * 1e9 / per_copy)
        kineto_rss = None
        for layout in layouts:
            path, size, temporary = make_trace(args.trace, args.workdir, layout, copies, args.reuse)
            temporary = temporary and not args.reuse
            try:
                load = os.getloadavg()[0]
                base, ours, alone = [], [], []
                for _ in range(args.repeat):
                    if size <= args.json_load_max_gb * 1e9:
                        base.append(measure(JSON_LOAD, path))
                    ours.append(measure(ANALYZE.format(extra=", jobs=1"), path))
                    if args.alone_too:  # the same without the second decoding process
                        alone.append(measure(ANALYZE.format(extra=", jobs=1"), path,
                                             env={"DECODEGAP_READ_WORKER": "0"}))
            finally:
                if temporary:
                    path.unlink()
            if layout == "kineto" and copies > 1:
                per_copy = size / copies
            ow, orss, ocpu = _median(ours, "wall"), _median(ours, "rss"), _median(ours, "cpu")
            wrss, wown = _median(ours, "worker_rss"), _median(ours, "worker_private") or 0.0
            if base:
                bw, br, bcpu, mark = _median(base, "wall"), _median(base, "rss"), _median(base, "cpu"), ""
                measured[layout].append((size, bw, br, bcpu))
            elif len(measured[layout]) >= 2:
                points = measured[layout]
                bw, br, bcpu = (_extrapolated([(p[0], p[i]) for p in points], size) for i in (1, 2, 3))
                mark = "~"
            else:
                bw = br = bcpu = float("nan")
                mark = "?"
            if layout == "kineto":
                kineto_rss = orss
            vs_kineto = f"{orss / kineto_rss:.2f}" if kineto_rss else "-"
            name = f"{copies}x" + (f" ({size / 1e9:.1f} GB)" if size > 2e9 else "")
            worker = f"{wrss:.0f} ({wown:.0f})" if wrss else "-"
            if alone:
                worker += f"; alone {_median(alone, 'wall'):.2f} s = {mark}{_median(alone, 'wall') / bw:.2f}x"
            print(f"| {layout} | {name} | {size / 1e6:.0f} | {mark}{bw:.2f} | {mark}{br:.0f} | {ow:.2f} | {orss:.0f} | "
                  f"{worker} | {mark}{ow / bw:.2f} | {mark}{ocpu / bcpu:.2f} | {mark}{orss / br:.3f} | "
                  f"{mark}{(orss + wown) / br:.3f} | {vs_kineto} | "
                  f"{ours[0].get('steps')} | {ours[0].get('median'):.3f} | {load:.2f} |", flush=True)
    if args.big_gb:
        print(f"\n~: json.load not run (over {args.json_load_max_gb:g} GB of text, it needs ~7x that in memory): "
              "extrapolated linearly from the two largest measured scales of the same layout")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/decodegap_scale"))
    parser.add_argument("--scales", default="1,8", help="replica counts, comma-separated ('' for none)")
    parser.add_argument("--layouts", default=",".join(LAYOUTS), help=f"comma-separated, of {', '.join(LAYOUTS)}")
    parser.add_argument("--big-gb", type=float, default=3.0, help="one more scale of about this much text (0: none)")
    parser.add_argument("--json-load-max-gb", type=float, default=2.0,
                        help="measure json.load only up to this much text (extrapolate beyond)")
    parser.add_argument("--ranks", type=int, default=4, help="ranks in the folder table (0: no folder table)")
    parser.add_argument("--repeat", type=int, default=1, help="alternating runs per case (medians)")
    parser.add_argument("--reuse", action="store_true",
                        help="use (and keep) the replicas already under --workdir instead of writing them anew")
    parser.add_argument("--alone-too", action="store_true",
                        help="also time analyze without the second decoding process (DECODEGAP_READ_WORKER=0)")
    parser.add_argument("--no-ray", action="store_true")
    parser.add_argument("--compile-each-run", action="store_true",
                        help="import as the environment says (with PYTHONDONTWRITEBYTECODE, compiling every run)")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    if not args.compile_each_run:
        use_bytecode_cache(args.workdir)
    print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; imports from "
          f"{'source as the environment says' if args.compile_each_run else 'compiled bytecode'}\n")
    if args.scales or args.big_gb:
        layout_table(args)
    if args.ranks:
        folder_table(args, make_folder(args.trace, args.workdir, args.ranks))


def folder_table(args, folder: Path) -> None:
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
