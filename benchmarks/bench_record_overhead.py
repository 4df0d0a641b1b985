"""Per-call cost of the record wrapper around a step function, versus the bare function.

    python benchmarks/bench_record_overhead.py [--calls 200000] [--repeat 7]

Rows: the bare call; `profile_steps` disabled (returns the function itself); a disabled
`with StepProfiler.step():`; an enabled wrapper during warmup (before its window: counting only);
an enabled wrapper after its window (trace written; fast path). Best of --repeat runs, ns per call.
The "after window" row runs one real profiled step first, so it needs torch.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import timeit


def step(x: int) -> int:
    return x


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()

    from decodegap.capture import StepProfiler, profile_steps

    out_dir = tempfile.mkdtemp(prefix="decodegap-bench-")
    os.environ.pop("DECODEGAP_PROFILE", None)
    disabled_fn = profile_steps(step, out_dir=out_dir)
    disabled_sp = StepProfiler(out_dir=out_dir)
    in_warmup = StepProfiler(warmup=10**12, out_dir=out_dir, enabled=True).wrap(step)

    after = StepProfiler(warmup=0, timed_steps=0, steps=1, out_dir=out_dir, enabled=True)
    after_fn = after.wrap(step)
    after_fn(0)  # the whole window: one profiled step, trace written
    assert after.trace_path is not None, "the window did not complete"

    def with_disabled_step(x: int) -> int:
        with disabled_sp.step():
            return step(x)

    rows = [
        ("bare function call", step),
        ("profile_steps, disabled", disabled_fn),
        ("with StepProfiler.step(), disabled", with_disabled_step),
        ("enabled wrapper, in warmup (before window)", in_warmup),
        ("enabled wrapper, after window", after_fn),
    ]
    results = []
    for name, fn in rows:
        timer = timeit.Timer("f(1)", globals={"f": fn})
        best = min(timer.repeat(repeat=args.repeat, number=args.calls)) / args.calls * 1e9
        results.append((name, best))

    base = results[0][1]
    print(
        f"Python {platform.python_version()} on {platform.machine()}, {args.calls} calls x best of {args.repeat}"
    )
    print(f"| {'case':<44} | {'ns/call':>8} | {'overhead ns':>11} |")
    print(f"|{'-' * 46}|{'-' * 10}|{'-' * 13}|")
    for name, ns in results:
        print(f"| {name:<44} | {ns:8.1f} | {ns - base:11.1f} |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
