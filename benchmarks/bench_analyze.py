"""Time and peak memory of a full `analyze` against plain `json.load` of the same trace.

Each measurement runs in a fresh subprocess (so peak RSS is its own), alternating analyze / json.load
/ orjson-free baselines, `--repeat` rounds; the table shows medians and the ratios to json.load.

    python benchmarks/bench_analyze.py ../shared/traces/mla_full_cast_steps.json.gz --repeat 3
    python benchmarks/bench_analyze.py ../shared/traces/mla_full_cast_steps.json.gz --repeat 3 --annotate

`--annotate` adds `analyze --annotate OUT` (the Perfetto overlay, written gzipped and plain): its cost is its wall
time minus the analysis's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

CASES = {
    "json.load (stdlib)": "import gzip, json\nopener = gzip.open if PATH.endswith('.gz') else open\n"
                          "with opener(PATH, 'rb') as f:\n    json.load(f)",
    "decodegap analyze (load + steps + breakdown + findings)":
        "from decodegap.pipeline import analyze_path\nfrom decodegap.report.json import render_json\n"
        "render_json(analyze_path(PATH))",
}
# analyze --annotate OUT: the same analysis, then the overlay written to OUT (gzip when OUT ends in .gz)
ANNOTATE = ("from decodegap.pipeline import analyze_path\nfrom decodegap.report.json import render_json\n"
            "from decodegap.report.annotate import write_overlay\nimport os, tempfile\n"
            "report = analyze_path(PATH)\nrender_json(report)\n"
            "out = os.path.join(tempfile.mkdtemp(), {name!r})\nwrite_overlay(report, out)\nos.remove(out)")
ANNOTATE_CASES = {
    "decodegap analyze --annotate OUT.json.gz (gzip)": ANNOTATE.format(name="out.json.gz"),
    "decodegap analyze --annotate OUT.json (plain)": ANNOTATE.format(name="out.json"),
}

RUNNER = """
import resource, sys, time
PATH = sys.argv[1]
t0 = time.perf_counter()
{body}
wall = time.perf_counter() - t0
print(wall, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""


def measure(body: str, path: str) -> tuple[float, float]:
    out = subprocess.run([sys.executable, "-c", RUNNER.format(body=body), path], capture_output=True, text=True,
                         check=True)
    wall, rss = out.stdout.split()
    return float(wall), float(rss)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("trace")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print the table as JSON too")
    parser.add_argument("--annotate", action="store_true", help="also time analyze --annotate (gzip and plain OUT)")
    args = parser.parse_args()
    cases = CASES | (ANNOTATE_CASES if args.annotate else {})
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
    for _ in range(args.repeat):  # alternate the cases so machine noise hits both alike
        for name, body in cases.items():
            results[name].append(measure(body, args.trace))
    base_name = next(iter(cases))
    base_wall = statistics.median(w for w, _ in results[base_name])
    base_rss = statistics.median(r for _, r in results[base_name])
    rows = []
    print(f"trace: {args.trace}  ({args.repeat} alternating runs each, medians)")
    print(f"| {'case':58} | wall s | peak RSS MB | wall vs json.load | RSS vs json.load |")
    print(f"|{'-' * 60}|--------|-------------|-------------------|------------------|")
    for name, values in results.items():
        wall = statistics.median(w for w, _ in values)
        rss = statistics.median(r for _, r in values)
        rows.append({"case": name, "wall_s": wall, "rss_mb": rss, "wall_ratio": wall / base_wall,
                     "rss_ratio": rss / base_rss})
        print(f"| {name:58} | {wall:6.2f} | {rss:11.0f} | {wall / base_wall:17.2f} | {rss / base_rss:16.2f} |")
    if args.annotate:
        analyze_wall = statistics.median(w for w, _ in results[list(CASES)[1]])
        for name in ANNOTATE_CASES:
            extra = statistics.median(w for w, _ in results[name]) - analyze_wall
            print(f"{name}: +{extra:.2f} s over the analysis")
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
