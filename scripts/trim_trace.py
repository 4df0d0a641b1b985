"""Cut a window out of a Kineto trace: keep the header and every event that starts inside [start, end).

Used to make the project's small test fixtures from real traces. The window is given in ProfilerStep
numbers (--steps 4-5: from the CPU start of ProfilerStep#4 to the GPU end of #5) or in microseconds of the
trace's own clock (--window START END). Flow arrows and Python-stack events are dropped unless --keep-flows."""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("trace")
    parser.add_argument("out")
    parser.add_argument("--steps", help="first-last ProfilerStep numbers to keep, e.g. 4-5")
    parser.add_argument("--window", nargs=2, type=float, metavar=("START_US", "END_US"))
    parser.add_argument("--window-from-first", nargs=2, type=float, metavar=("START_US", "END_US"),
                        help="window relative to the first event's timestamp")
    parser.add_argument("--keep-flows", action="store_true")
    args = parser.parse_args()
    opener = gzip.open if args.trace.endswith(".gz") else open
    with opener(args.trace, "rt") as f:
        doc = json.load(f)
    events = doc["traceEvents"]
    if args.steps:
        first, last = (int(x) for x in args.steps.split("-"))
        marks = {}
        for e in events:
            m = re.match(r"ProfilerStep#(\d+)$", str(e.get("name", "")))
            if m and e.get("ph") == "X":
                marks.setdefault(int(m.group(1)), []).append(e)
        start = min(e["ts"] for n in range(first, last + 1) for e in marks[n])
        end = max(e["ts"] + e["dur"] for n in range(first, last + 1) for e in marks[n])
    elif args.window_from_first:
        t0 = min(e["ts"] for e in events if isinstance(e.get("ts"), (int, float)) and e.get("ph") == "X")
        start, end = t0 + args.window_from_first[0], t0 + args.window_from_first[1]
    elif args.window:
        start, end = args.window
    else:
        sys.exit("give --steps or --window")
    kept = []
    for e in events:
        if e.get("ph") == "M":
            kept.append(e)
        elif e.get("ph") in ("s", "f") and not args.keep_flows:
            continue
        elif e.get("cat") == "python_function":
            continue
        elif isinstance(e.get("ts"), (int, float)) and start <= e["ts"] < end:
            event_args = e.get("args")
            if isinstance(event_args, dict):  # fields decodegap never reads, to keep fixtures small
                for unused in ("Concrete Inputs", "Input Strides", "Ev Idx", "Record function id"):
                    event_args.pop(unused, None)
            kept.append(e)
    doc["traceEvents"] = kept
    with gzip.open(args.out, "wt", compresslevel=9) as f:
        # Kineto's own layout (one event per block) so the streaming decoder is exercised, as on real files.
        head = {k: v for k, v in doc.items() if k != "traceEvents"}
        f.write("{\n")
        for k, v in head.items():
            f.write(f'  "{k}": {json.dumps(v)},\n')
        f.write('  "traceEvents": [\n')
        f.write(",\n".join("  " + json.dumps(e, separators=(",", ":")) for e in kept))
        f.write("\n  ]\n}\n")
    print(f"{len(kept)} of {len(events)} events kept -> {args.out}")


if __name__ == "__main__":
    main()
