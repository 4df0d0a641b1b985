"""The demo's GPU runs, in one process (one device call): the compare table at full GLM-5 geometry (CUDA graphs
on, then eager), the small trace fixtures the tests read, the bundled example trace, and one
`decodegap record -- python3 -m decodegap.demo.loop` subprocess run analyzed with `decodegap analyze`.

    PYTHONPATH=src python3 benchmarks/demo_gpu.py --out OUT          # on an H200
    PYTHONPATH=src python3 benchmarks/demo_gpu.py --out OUT --smoke  # the same code paths, tiny, on a CPU

Writes into OUT: log.txt, compare_graph.md, compare_eager.md, fixtures.tar (traces, named as in tests/fixtures).
Each stage is guarded: a failing stage is logged and the next one runs. Stages past --budget-s are skipped."""

from __future__ import annotations

import argparse
import contextlib
import gc
import glob
import io
import shutil
import subprocess
import sys
import tarfile
import time
import traceback
from pathlib import Path

T0 = time.monotonic()
LOG: io.TextIOBase | None = None


def log(message: str) -> None:
    line = f"[{time.monotonic() - T0:7.1f}s] {message}"
    print(line, flush=True)
    if LOG is not None:
        LOG.write(line + "\n")
        LOG.flush()


def stage(name: str, budget_s: float):
    """Decorator-like runner: skip past the budget, log failures and go on."""

    def run(fn):
        if time.monotonic() - T0 > budget_s:
            log(f"SKIP {name}: past the {budget_s:.0f} s budget")
            return None
        log(f"BEGIN {name}")
        try:
            result = fn()
            log(f"END {name}")
            return result
        except BaseException as exc:  # noqa: BLE001 - SystemExit from the CLI too
            log(f"FAIL {name}: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
            return None

    return run


def cli(args: list[str]) -> str:
    """Run `decodegap ARGS` in this process; its stdout (also logged)."""
    from decodegap.cli import main

    buf = io.StringIO()
    log("$ decodegap " + " ".join(args))
    with contextlib.redirect_stdout(buf):
        try:
            main(args)
        except SystemExit as exc:
            if exc.code not in (0, None):
                raise RuntimeError(f"decodegap exited with {exc.code}") from None
    log(buf.getvalue())
    return buf.getvalue()


def one_trace(folder: Path) -> Path:
    found = sorted(glob.glob(str(folder / "*.pt.trace.json.gz")))
    if len(found) != 1:
        raise RuntimeError(f"expected one trace in {folder}, found {found}")
    return Path(found[0])


def free_cuda() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def main() -> None:
    global LOG
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--work", type=Path, default=Path("/tmp/demo_gpu"))
    parser.add_argument("--smoke", action="store_true", help="tiny geometry on a CPU: check the code paths")
    parser.add_argument("--budget-s", type=float, default=480.0)
    parser.add_argument("--stages", default="compare_graph,compare_eager,fixtures,record",
                        help="comma-separated: compare_graph, compare_eager, fixtures, record, example")
    args = parser.parse_args()
    out, work = args.out, args.work
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(work, ignore_errors=True)
    fixtures = work / "fixtures"
    fixtures.mkdir(parents=True)
    LOG = open(out / "log.txt", "w")  # noqa: SIM115

    import torch

    smoke = args.smoke
    log(f"python {sys.version.split()[0]}, torch {torch.__version__}, cuda {torch.cuda.is_available()}"
        + (f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""))
    if not smoke and not torch.cuda.is_available():
        raise SystemExit("no CUDA device (use --smoke on a CPU)")
    # The full geometry (78 layers, 495,552-slot FP8 pool) or, for --smoke, the tiny one with 2 layers.
    geometry = ["--scale", "tiny", "--layers", "2", "--device", "cpu"] if smoke else ["--scale", "full"]
    graph = [] if smoke else ["--cuda-graph"]
    budget = args.budget_s
    stages = set(args.stages.split(","))

    # 1. the compare table with CUDA graphs (the target: fused >= 3x faster than full_cast)
    if "compare_graph" in stages:
        stage("compare, CUDA graphs", budget)(lambda: cli(
        ["demo", "--compare", *geometry, *graph, "--timed", "20", "--steps", "3", "--warmup", "2", "--no-shapes",
         "--out", str(work / "compare_graph"), "--markdown", str(out / "compare_graph.md")]))

    # 2. eager, with shapes: its full_cast trace is the bundled example when small enough
    def eager_compare() -> None:
        cli(["demo", "--compare", *geometry, "--timed", "10", "--steps", "2", "--warmup", "2", "--shapes",
             "--out", str(work / "compare_eager"), "--markdown", str(out / "compare_eager.md")])
        example = one_trace(work / "compare_eager" / "full_cast")
        size = example.stat().st_size
        log(f"example candidate {example.name}: {size / 1e6:.2f} MB")
        if size <= 3.2e6:
            shutil.copy(example, fixtures / "example_trace.json.gz")

    if "compare_eager" in stages:
        stage("compare, eager", budget)(eager_compare)
    free_cuda()

    # 3. fixtures: 12 layers (78 in --smoke: 2) but the real 495,552-slot pool
    def make_fixtures() -> None:
        from decodegap.demo.config import make_config
        from decodegap.demo.model import DemoModel
        from decodegap.demo.runner import record, set_kv_read

        config = (make_config("tiny", layers=2) if smoke else make_config("full", layers=12))
        model = DemoModel(config, "cpu" if smoke else "cuda")
        plan = [("cast_eager", "full_cast", False, True), ("gather_cast_eager", "gather_cast", False, True)]
        if not smoke:
            plan.insert(0, ("cast_graph", "full_cast", True, False))
        for name, kv_read, use_graph, shapes in plan:
            set_kv_read(model, kv_read, use_graph)
            path = record(model, work / name, steps=3 if use_graph else 2, warmup=2, timed_steps=3,
                          record_shapes=shapes)
            shutil.copy(path, fixtures / f"{name}.json.gz")
            log(f"fixture {name}: {path.stat().st_size / 1e6:.2f} MB ({kv_read}, graph={use_graph}, "
                f"shapes={shapes})")
            cli(["analyze", str(fixtures / f"{name}.json.gz"), "--top", "8"])
        del model

    if "fixtures" in stages:
        stage("fixtures", budget)(make_fixtures)
    free_cuda()

    # 4. the issue-5 check: `decodegap record` around an unchanged decode loop, in a subprocess
    def record_subprocess() -> None:
        loop = [sys.executable, "-m", "decodegap.demo.loop", "--kv-read", "full_cast", "--steps", "14",
                *(["--scale", "tiny", "--layers", "2", "--device", "cpu"] if smoke else ["--scale", "full"])]
        cmd = [sys.executable, "-m", "decodegap", "record", "--target", "decodegap.demo.model:DemoModel.step",
               "--steps", "3", "--warmup", "3", "--timed-steps", "5", "--out", str(work / "record"), "--", *loop]
        log("$ " + " ".join(cmd))
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
        log(f"rc={done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}")
        trace = one_trace(work / "record")
        log(f"record trace {trace.name}: {trace.stat().st_size / 1e6:.2f} MB")
        cli(["analyze", str(trace), "--top", "8"])

    if "record" in stages:
        stage("record subprocess", budget + 60)(record_subprocess)

    # 5. the bundled example alone: full geometry, full_cast, eager, shapes on; 2 steps and 1 step, raw and trimmed
    def example() -> None:
        from decodegap.demo.config import make_config
        from decodegap.demo.model import DemoModel
        from decodegap.demo.runner import record

        model = DemoModel(make_config("tiny", layers=2) if smoke else make_config("full"), "cpu" if smoke else "cuda")
        for steps in (2, 1):
            path = record(model, work / f"example_{steps}", steps=steps, warmup=2, timed_steps=5, record_shapes=True)
            raw = fixtures / f"example_raw_{steps}step.json.gz"
            shutil.copy(path, raw)
            trimmed = fixtures / f"example_trim_{steps}step.json.gz"
            trim = Path(__file__).resolve().parents[1] / "scripts" / "trim_trace.py"
            subprocess.run([sys.executable, str(trim), str(raw), str(trimmed), "--window", "0", "1e30"], check=True)
            log(f"example {steps} step(s): raw {raw.stat().st_size / 1e6:.2f} MB, trimmed "
                f"{trimmed.stat().st_size / 1e6:.2f} MB")
            cli(["analyze", str(trimmed), "--top", "5"])
        del model

    if "example" in stages:
        stage("example", budget)(example)

    with tarfile.open(out / "fixtures.tar", "w") as tar:
        for f in sorted(fixtures.iterdir()):
            tar.add(f, arcname=f.name)
            log(f"tar {f.name} {f.stat().st_size / 1e6:.3f} MB")
        for folder in ("compare_graph",):  # small (no shapes): for `decodegap diff` by the lead
            for f in sorted((work / folder).glob("*/*.pt.trace.json.gz")):
                if f.stat().st_size < 3e6:
                    tar.add(f, arcname=f"{folder}_{f.parent.name}.json.gz")
    log("DONE")


if __name__ == "__main__":
    main()
