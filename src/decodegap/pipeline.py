"""The analysis pipeline: load -> link -> steps -> breakdown -> per-rank findings, one rank at a time; then the
cross-rank analysis (slowest rank, stragglers, collectives) on the ranks' summaries.

A rank is analyzed where its trace is loaded (in this process, a worker process with `jobs`, or a Ray task with
`ray`) and comes back as a `RankSummary`: small and picklable, no event tables. Everything after that reads only
summaries, so `jobs=1`, `jobs=N` and Ray give the same report.

The stage after findings/ and floor/; may import them and every stage below, never analysis or the views."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from itertools import repeat
from pathlib import Path

import numpy as np

from typing import TYPE_CHECKING

from decodegap.errors import ParameterError, UserError
from decodegap.records import Struct
from decodegap.trace import Trace, load_trace
from decodegap.trace.load import find_trace_files, rank_from_filename
from decodegap.trace.read import NotATrace, available_memory_bytes

if TYPE_CHECKING:  # the stages after reading are imported where they run (a trace's reading can start before them)
    from decodegap.breakdown.breakdown import Breakdown
    from decodegap.breakdown.rows import LayerRow, StepRow
    from decodegap.findings.profiler_check import ProfilerCheck
    from decodegap.findings.records import AnyFinding, BestCase
    from decodegap.floor.floor import Floor
    from decodegap.floor.ledger import FloorRequest, GapLedger
    from decodegap.steps.step import Steps

# What a worker's peak memory is per byte of trace text (measured: benchmarks/bench_scale.py), plus the interpreter
# and its libraries: sizes the default number of parallel workers so that they fit in memory together.
WORKER_BYTES_PER_TEXT_BYTE = 0.3  # measured 0.15-0.2 above a 1x trace; kept at twice that
WORKER_BASE_BYTES = 150 << 20
GZIP_TEXT_PER_BYTE = 14  # when a .gz's size field cannot be trusted (over 4 GB of text), a typical trace's ratio


@dataclass(frozen=True)
class TraceMeta:
    """What the cross-rank analysis and the views need of a rank's trace once its events are gone."""

    path: Path
    rank: int | None
    world_size: int | None
    device_name: str | None
    has_gpu: bool
    record_meta: dict | None  # what `decodegap record` stored (unprofiled step time, ...)
    truncated: bool = False  # the file ends early (its JSON or gzip stream is cut)
    warnings: tuple[str, ...] = ()  # the loader's


@dataclass(frozen=True)
class RankSummary:
    """One rank, analyzed: what leaves its worker. Steps keep their times and labels but not their GPU rows."""

    trace: TraceMeta
    steps: Steps
    breakdown: Breakdown
    findings: dict[str, list[AnyFinding]]  # the per-rank detectors', by detector
    warnings: tuple[str, ...]  # steps' and sanity warnings (without the rank prefix)
    step_rows: tuple[StepRow, ...]  # Analysis.step_rows of this rank
    layer_rows: tuple[LayerRow, ...]  # Analysis.layer_rows of this rank

    @property
    def rank(self) -> int:
        return self.trace.rank if self.trace.rank is not None else 0

    def collective_ms_per_step(self) -> float:
        return sum(c.ms_per_step for c in self.breakdown.categories if c.name == "collective")


class Assumed(Struct):
    """A value the run took where the caller gave none (the model config of the bundled example, the floor's
    context or batch), and why."""

    name: str  # model | context | batch
    value: int | str
    reason: str


@dataclass(frozen=True)
class AnalysisOptions:
    """What the caller said about the run, assembled once before the trace is read (decodegap.api.run)."""

    tpot_ms: float | None = None  # time per output token measured without the profiler
    model: object | None = None  # decodegap.model.ModelGeometry when a model config is given
    floor: Floor | None = None  # with the model and a GPU
    floor_request: FloorRequest | None = None  # with the model but no GPU: the floor for the trace's GPU
    active_tokens: int | None = None  # batch x context, when given: the KV a step really reads
    assumed: tuple[Assumed, ...] = ()  # what was taken where the caller gave nothing
    floor_assumed: tuple[Assumed, ...] = ()  # likewise, stated only when the run has a floor (its defaults)


@dataclass(frozen=True)
class Report:
    """The pipeline's result, assembled once: the ranks' summaries, the findings, the floor and its ledger, and
    every warning, in one order. decodegap.analysis.build makes the Analysis of it."""

    path: Path
    ranks: tuple[RankSummary, ...]
    options: AnalysisOptions
    findings: tuple[AnyFinding, ...]
    best_case: BestCase | None  # the step once the findings are fixed
    profiler_check: ProfilerCheck | None
    floor: Floor | None
    gap: GapLedger | None
    warnings: tuple[str, ...]
    assumed: tuple[Assumed, ...]

    @property
    def workload(self) -> str:
        return workload_of(self.ranks)

    @property
    def main(self) -> RankSummary:
        """The rank whose step is shown in detail: the slowest one (it sets the pace of every step)."""
        return main_rank(self.ranks)


def workload_of(ranks) -> str:
    return "training" if any(r.steps.workload == "training" for r in ranks) else "inference"


def main_rank(ranks) -> RankSummary:
    return max(ranks, key=lambda r: (r.breakdown.step_ms.median, -r.rank))


TRAINING_FINDINGS = ("collective_bound", "straggler_rank")


def sanity_warnings(trace: Trace, steps: Steps, b: Breakdown, options: AnalysisOptions) -> list[str]:
    """What the step and layer boundaries imply that cannot be true, or that limits what the numbers mean."""
    out = []
    if not trace.has_gpu:
        out.append("the trace has no GPU events: the breakdown covers CPU ops only")
    if not steps.steps:
        out.append(f"no steps found ({steps.detail or steps.source})")
    elif len(steps.steps) == 1:
        out.append(f"the trace holds one {'iteration' if steps.workload == 'training' else 'forward'}: "
                   "statistics over steps come from one sample")
    if steps.steps and b.layers is None and steps.workload == "inference":
        out.append(f"layer count unknown: {b.layers_evidence}")
    geometry = options.model
    if b.layers and geometry is not None and getattr(geometry, "num_layers", None) \
            and b.layers != geometry.num_layers and steps.workload == "inference":
        out.append(f"the trace shows {b.layers} layers per step, the model config {geometry.num_layers}: another "
                   "model, pipeline parallelism, or step boundaries that are off")
    floor = options.floor
    if floor is not None and b.phase == "decode" and b.decode_count and b.step_ms.median \
            and b.step_ms.median < floor.floor_ms:
        out.append(f"a decode step of {b.step_ms.median:.3f} ms is shorter than its hardware floor "
                   f"({floor.floor_ms:.3f} ms): impossible; the step boundaries ({steps.source}) are likely wrong, or "
                   "the model, GPU, batch or context given do not match the trace")
    return out


# --- one rank ------------------------------------------------------------------------------------------------------

def _calls_in_each_step(trace: Trace, steps: Steps):
    """For weight_copy: per decode step, how many GPU activities of a name ran; None without per-step rows."""
    decode = steps.decode
    if not trace.has_gpu or not decode:
        return None

    def calls(name: str) -> list[int]:
        ids = [i for i, n in enumerate(trace.names) if n == name]
        return [int(np.isin(trace.gpu.name_id[s.rows], ids).sum()) for s in decode]

    return calls


GRAPH_LAUNCHES = ("cudaGraphLaunch", "cuGraphLaunch", "hipGraphLaunch")


def _graph_launch_us(trace: Trace) -> float | None:
    """The median host time of one graph launch in the trace (for host_bound's estimate); None without any."""
    ids = [i for i, n in enumerate(trace.names) if n in GRAPH_LAUNCHES]
    if not ids:
        return None
    durations = trace.runtime.dur_ns[np.isin(trace.runtime.name_id, ids)]
    return float(np.median(durations)) / 1e3 if len(durations) else None



_NO_ROWS = np.empty(0, dtype=np.int64)


def summarize(trace: Trace, options: AnalysisOptions) -> RankSummary:
    """Analyze one rank's trace down to its summary (the trace can be dropped afterwards)."""
    from decodegap.breakdown.breakdown import compute_breakdown
    from decodegap.breakdown.rows import layer_rows, step_rows
    from decodegap.findings import RankInput, run_rank_detectors
    from decodegap.findings.profiler_check import recording_warnings
    from decodegap.steps.steps import find_steps
    from decodegap.trace.link import link

    links = link(trace)
    steps = find_steps(trace, links)
    b = compute_breakdown(trace, links, steps)
    rank_input = RankInput(breakdown=b, has_gpu=trace.has_gpu, geometry=options.model,
                           active_tokens=options.active_tokens, calls_in_each_step=_calls_in_each_step(trace, steps),
                           graph_launch_us=_graph_launch_us(trace))
    meta = TraceMeta(path=trace.path, rank=trace.rank, world_size=trace.world_size, device_name=trace.device_name,
                     has_gpu=trace.has_gpu, record_meta=trace.record_meta, truncated=trace.truncated is not None,
                     warnings=tuple(trace.warnings))
    return RankSummary(
        trace=meta, steps=replace(steps, steps=[replace(s, rows=_NO_ROWS) for s in steps.steps]), breakdown=b,
        findings=run_rank_detectors(rank_input),
        warnings=tuple(steps.warnings + sanity_warnings(trace, steps, b, options)
                       + recording_warnings(trace.has_gpu, b)),
        step_rows=tuple(step_rows(trace, steps)), layer_rows=tuple(layer_rows(trace, steps, b)))


@dataclass(frozen=True)
class Outcome:
    """What analyzing one file of a folder gave: its summary, or why it has none."""

    path: Path
    summary: RankSummary | None = None
    error: str | None = None  # the one-line reason
    not_a_trace: bool = False  # no profiler trace at all (a config.json beside the traces): skipped, counted


def analyze_file(path: str | Path, options: AnalysisOptions, shown_as: str | None = None) -> Outcome:
    """A worker's job (process or Ray task): one file to its summary; bad input comes back as an error line.
    `shown_as`: the path the report names (a Ray task reads the absolute path, the report keeps the user's)."""
    path = Path(path)
    shown = Path(shown_as) if shown_as is not None else path
    try:
        summary = summarize(load_trace(path), options)
    except NotATrace as exc:
        return Outcome(shown, error=_reason(exc, path), not_a_trace=True)
    except UserError as exc:
        return Outcome(shown, error=_reason(exc, path))
    except MemoryError:
        return Outcome(shown, error="the trace does not fit in this worker's memory")
    if shown != path:
        summary = replace(summary, trace=replace(summary.trace, path=shown))
    return Outcome(shown, summary=summary)


def _reason(exc: Exception, path: Path) -> str:
    return str(exc).removeprefix(f"{path}: ")


# --- many ranks ----------------------------------------------------------------------------------------------------

def _text_bytes(path: Path) -> int:
    """About how much text a trace file holds: a gzip's size field (mod 4 GB), else the file's size."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            if f.read(2) != b"\x1f\x8b":
                return size
            f.seek(-4, os.SEEK_END)
            stated = int.from_bytes(f.read(4), "little")
    except OSError:
        return 0  # unreadable: its worker reports why
    return stated if stated >= size else size * GZIP_TEXT_PER_BYTE


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def default_jobs(files: list[Path]) -> int:
    """Parallel workers for a folder: the cores, as many as fit in the available memory at once."""
    jobs = min(cpu_count(), len(files))
    available = available_memory_bytes()
    if available is not None and files:
        per_worker = WORKER_BASE_BYTES + WORKER_BYTES_PER_TEXT_BYTE * max(_text_bytes(f) for f in files)
        jobs = min(jobs, max(1, int(available // per_worker)))
    return max(1, jobs)


def _in_processes(files: list[Path], options: AnalysisOptions, jobs: int) -> list[Outcome]:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    context = multiprocessing.get_context(_start_method())
    try:
        with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
            return list(pool.map(analyze_file, files, repeat(options)))
    except BrokenProcessPool:
        raise ParameterError(f"a worker process died while analyzing {len(files)} traces with {{jobs}} (out of "
                             "memory?); give fewer, down to {jobs__one}", jobs=jobs, jobs__one=1) from None


def _start_method() -> str:
    """fork starts a worker in milliseconds with decodegap already imported, but is safe only in a process without
    other threads (a notebook's, Ray's); then forkserver, else (Windows, macOS) spawn."""
    import multiprocessing
    import sys
    import threading

    methods = multiprocessing.get_all_start_methods()
    if sys.platform == "darwin" or "fork" not in methods:
        return "spawn"
    return "fork" if threading.active_count() == 1 else "forkserver"


def _analyze_files(files: list[Path], options: AnalysisOptions, jobs: int | None, ray) -> list[Outcome]:
    if ray is not None:
        return _on_ray(files, options, ray, jobs)
    jobs = default_jobs(files) if jobs is None else min(jobs, len(files))
    if jobs <= 1:
        return [analyze_file(f, options) for f in files]
    return _in_processes(files, options, jobs)


def _on_ray(files: list[Path], options: AnalysisOptions, address: str, num_cpus: int | None) -> list[Outcome]:
    """Each file as a Ray task returning its Outcome. Without an address, a local Ray runs for this call only
    (num_cpus: `jobs`, default the cores); with one, the files must be readable at the same paths on its nodes
    and decodegap installed there."""
    try:
        import ray
    except ImportError:
        raise ParameterError("{ray} needs Ray: pip install 'decodegap[ray]'", ray=address or True) from None
    started = not ray.is_initialized()
    if started:
        _check_reachable(address)
        try:
            if address:
                ray.init(address=address, logging_level="ERROR", log_to_driver=False)
            else:
                # "local": a new Ray for this run even when RAY_ADDRESS names a cluster
                ray.init(address="local", num_cpus=num_cpus or cpu_count(), include_dashboard=False,
                         logging_level="ERROR", log_to_driver=False)
        except Exception as exc:  # Ray raises ConnectionError, RuntimeError, ValueError... for a bad address
            if address and "could not find any running ray instance" in str(exc).lower():
                # Ray's own text names its CLI's --address flag, which decodegap does not have
                raise ParameterError("{ray}: found no running Ray cluster to join; start one (ray start --head), "
                                     "or give {ray__local} (no address) for a local Ray for this run", ray=address,
                                     ray__local=True) from None
            raise ParameterError(f"{{ray}}: cannot start or reach Ray "
                                 f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})",
                                 ray=address or True) from None
    try:
        task = ray.remote(num_cpus=1)(analyze_file)
        try:
            return ray.get([task.remote(str(f.resolve()), options, str(f)) for f in files])
        except ray.exceptions.RayError as exc:  # a worker died (out of memory, killed) or the cluster went away
            raise ParameterError(f"{{ray}}: a task failed "
                                 f"({(str(exc).strip().splitlines() or [type(exc).__name__])[-1]})",
                                 ray=address or True) from None
    finally:
        if started:
            ray.shutdown()


RAY_CONNECT_TIMEOUT_S = 5.0


def _check_reachable(address: str) -> None:
    """A cluster address (host:port, ray://host:port) must accept connections: Ray itself retries for minutes."""
    import socket

    target = address.removeprefix("ray://")
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit():
        return  # "auto", "local" or a form Ray resolves itself
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=RAY_CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        raise ParameterError(f"{{ray}}: nothing answers at that address ({exc.strerror or exc}); start the "
                             "cluster (ray start --head) or give {ray__local} (no address) for a local Ray",
                             ray=address, ray__local=True) from None


def _folder_summaries(path: Path, files: list[Path], outcomes: list[Outcome]) -> tuple[list[RankSummary], list[str]]:
    """The summaries of the files that are traces, and a warning per file left out; refuses a folder without any."""
    summaries = [o.summary for o in outcomes if o.summary is not None]
    skipped = [o for o in outcomes if o.not_a_trace]
    failed = [o for o in outcomes if o.error is not None and not o.not_a_trace]
    if not summaries:
        if failed:
            raise UserError(f"{failed[0].path}: {failed[0].error}")
        first = skipped[0]
        raise UserError(f"{path}: the folder holds no profiler traces ({len(skipped)} JSON file(s) that are not, "
                        f"e.g. {first.path.name}: {first.error})")
    if skipped:
        names = ", ".join(o.path.name for o in skipped[:5]) + (", ..." if len(skipped) > 5 else "")
        first = summaries[0]
        note = f"skipped {len(skipped)} file(s) in the folder that are not profiler traces: {names}"
        summaries[0] = replace(first, trace=replace(first.trace, warnings=(*first.trace.warnings, note)))
    warnings = []
    for o in failed:
        rank = rank_from_filename(o.path.name)
        who = f"rank {rank} ({o.path.name})" if rank is not None else o.path.name
        warnings.append(f"{who} was left out: {o.error}")
    return summaries, warnings


def _order_ranks(summaries: list[RankSummary]) -> list[RankSummary]:
    """Ranks from the file names (SGLang, vLLM), else distributedInfo, else the order of the files."""
    out = []
    for s in summaries:
        from_name = rank_from_filename(s.trace.path.name)
        out.append(replace(s, trace=replace(s.trace, rank=from_name)) if from_name is not None else s)
    if len(out) > 1:
        out.sort(key=lambda s: (s.trace.rank is None, s.trace.rank if s.trace.rank is not None else 0,
                                str(s.trace.path)))
        out = [replace(s, trace=replace(s.trace, rank=i)) if s.trace.rank is None else s for i, s in enumerate(out)]
    return out


def _findings(ranks: list[RankSummary], check: ProfilerCheck | None) -> tuple[tuple[AnyFinding, ...], BestCase | None]:
    """The detailed rank's findings and the cross-rank ones, in one order (decode advice left out of a training
    job), and what fixing them would buy together."""
    from decodegap.findings import RanksInput, best_case, order_findings, run_cross_rank_detectors

    main = main_rank(ranks)
    inputs = RanksInput(main=main.breakdown, device_name=main.trace.device_name, rank_count=len(ranks),
                        world_sizes=[r.trace.world_size for r in ranks if r.trace.world_size],
                        collective_ms_by_rank={r.rank: r.collective_ms_per_step() for r in ranks})
    findings = order_findings(main.findings | run_cross_rank_detectors(inputs, check))
    if workload_of(ranks) == "training":  # decode advice does not apply to a training job
        findings = [f for f in findings if f.id in TRAINING_FINDINGS]
    return tuple(findings), best_case(findings, main.breakdown.step_ms.median)


def _rank_warnings(ranks: list[RankSummary], left_out: list[str]) -> list[str]:
    """The files left out, ranks claimed twice, then each rank's loader and steps warnings (prefixed with the rank
    when there are several)."""
    warnings = list(left_out)
    seen: dict[int, str] = {}
    for r in ranks:
        if r.rank in seen and len(ranks) > 1:
            warnings.append(f"two traces claim rank {r.rank} ({seen[r.rank]} and {r.trace.path.name}): "
                            "are they from different runs?")
        seen.setdefault(r.rank, r.trace.path.name)
    for r in ranks:
        prefix = f"rank {r.rank}: " if len(ranks) > 1 else ""
        warnings.extend(prefix + w for w in r.trace.warnings)
        warnings.extend(prefix + w for w in r.warnings)
    return warnings


def _floor_and_ledger(options: AnalysisOptions, main: RankSummary,
                      findings) -> tuple[Floor | None, GapLedger | None, list[str]]:
    """The floor (given, or for the GPU the trace names), its gap ledger, and their warnings."""
    from decodegap.floor.ledger import floor_for_device, gap_ledger

    floor, warnings = options.floor, []
    if floor is None and options.floor_request is not None:
        floor, warnings = floor_for_device(options.floor_request, options.model, main.trace.device_name)
    if floor is None:
        return None, None, warnings
    gap, ledger_warnings = gap_ledger(floor, options.model, main.breakdown, main.trace.has_gpu, findings)
    return floor, gap, warnings + ledger_warnings


def analyze_path(path: str | Path, options: AnalysisOptions | None = None, *, jobs: int | None = None,
                 ray: str | None = None, aside=None) -> Report:
    """Analyze a trace file or a folder of per-rank traces. `jobs`: ranks analyzed in parallel processes (default:
    the cores, capped by memory); `ray`: run them as Ray tasks instead ("" starts a local Ray, else an address).
    `aside`: work for the reader of a file to do while a second process decodes (trace.load.load_trace)."""
    from decodegap.findings.profiler_check import profiler_check

    options = options or AnalysisOptions()
    path = Path(path)
    files = find_trace_files(path)
    left_out: list[str] = []
    if path.is_file():
        summaries = [summarize(load_trace(files[0], aside=aside), options)]
    else:
        summaries, left_out = _folder_summaries(path, files, _analyze_files(files, options, jobs, ray))
    ranks = _order_ranks(summaries)
    main = main_rank(ranks)
    check = profiler_check(options.tpot_ms, main.trace.record_meta, main.breakdown.step_ms.median)
    findings, best = _findings(ranks, check)
    floor, gap, floor_warnings = _floor_and_ledger(options, main, findings)
    warnings = _rank_warnings(ranks, left_out)
    warnings += [w for w in dict.fromkeys(floor_warnings) if w not in warnings]
    return Report(path=path, ranks=tuple(ranks), options=options, findings=findings, best_case=best,
                  profiler_check=check, floor=floor, gap=gap, warnings=tuple(warnings),
                  assumed=options.assumed + (options.floor_assumed if floor is not None else ()))
