"""The Python API: `decodegap.analyze(path, ...) -> Analysis`, `decodegap.load(report.json)`, `decodegap.diff(a, b)`,
`decodegap.api.annotate(path, out)` (the Perfetto overlay).

The command line is a thin client of these functions. Errors are `decodegap.errors.UserError` with one line that
names the parameter as Python spells it (`tp=3`; the CLI words the same line with its flag, `--tp 3`, and exits 2)."""

from __future__ import annotations

import filecmp
import importlib
import math
import numbers
import os
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from decodegap.errors import NAME_ONLY, ParameterError, UserError

if TYPE_CHECKING:
    from decodegap.analysis import Analysis


def __getattr__(name: str):
    # decodegap.analysis (and every stage below it) is imported once a trace's reading has begun (run), so that
    # the reader can import them while a second process decodes; these names still read as before.
    if name in ("Analysis", "build", "load"):
        from decodegap import analysis

        return getattr(analysis, name)
    raise AttributeError(f"module 'decodegap.api' has no attribute {name!r}")


# What analyzing a trace imports once it is read, in an order that imports each module's own imports before it:
# the reader of a big file imports them one at a time while its second decoding process holds every batch it can
# (json_events._Parallel), instead of in one go before reading. A module left out is imported where first used.
ANALYSIS_MODULES = (
    "html", "difflib", "numpy.ma", "decodegap.ops", "decodegap.ops.shapes", "decodegap.ops.categories",
    "decodegap.ops.kernel_names", "decodegap.steps", "decodegap.steps.layer_kinds", "decodegap.steps.repetition",
    "decodegap.steps.layer_blocks", "decodegap.steps.layer_bounds", "decodegap.steps.residual_blocks",
    "decodegap.steps.layers", "decodegap.steps.across_forwards", "decodegap.steps.drafts",
    "decodegap.steps.lost_forwards",
    "decodegap.trace.link", "decodegap.steps.phase", "decodegap.steps.marks", "decodegap.steps.anchors",
    "decodegap.steps.step", "decodegap.steps.sequence_steps", "decodegap.steps.marked_steps",
    "decodegap.steps.classify", "decodegap.steps.steps", "decodegap.breakdown", "decodegap.breakdown.breakdown",
    "decodegap.findings.base",
    "decodegap.findings.records", "decodegap.findings", "decodegap.rounding", "decodegap.samples",
    "decodegap.findings.profiler_check", "decodegap.breakdown.rows", "decodegap.analysis",
    "decodegap.findings.host_bound", "decodegap.findings.kv_pool_cast", "decodegap.findings.weight_copy",
    "decodegap.findings.collective_bound", "decodegap.findings.profiler_overhead",
)


def _import_aside():
    """ANALYSIS_MODULES imported, one per step."""
    for name in ANALYSIS_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:  # raised again where it is used
            return
        yield

# The bundled example: the demo's GLM-5-shaped rank (decodegap.demo) replayed from a CUDA graph on an H200, with
# the config of the model it ran; the demo keeps 2,048 active tokens in the pool.
# (The package's own folder, as importlib.resources.files finds it for a package on disk, without importing it and
# the tempfile, shutil, random and zipfile modules it brings: ~20 ms of every run's start.)
EXAMPLE_TRACE = Path(__file__).parent / "data" / "example_trace.json.gz"
EXAMPLE_MODEL = Path(__file__).parent / "data" / "example_model_config.json"
EXAMPLE_CONTEXT = 2048
DEFAULT_BATCH = 1


def is_example(path: Path) -> bool:
    """Whether `path` is the bundled example trace: the file itself, or a copy of it (the same bytes)."""
    try:
        return path.is_file() and (path.resolve() == EXAMPLE_TRACE.resolve() or (
            path.stat().st_size == EXAMPLE_TRACE.stat().st_size and filecmp.cmp(path, EXAMPLE_TRACE, shallow=False)))
    except OSError:
        return False


def _ray_address(ray) -> str | None:
    """None: no Ray; "": a local Ray for the run; else the cluster's address."""
    if ray is None or ray is False:
        return None
    if ray is True:
        return ""
    if not isinstance(ray, str):
        raise ParameterError("{ray}: give True (a local Ray) or a cluster address such as 'auto' or "
                             "'ray://head:10001'", ray=ray)
    return ray


def _check_parameters(model, quant, weights, kv, gpu, tpot_ms, allreduce_us, jobs) -> None:
    """Each parameter of the right kind, before any work: one line naming the one that is not."""
    for name, value in (("model", model), ("quant", quant)):
        if value is not None and not isinstance(value, (str, os.PathLike)):
            raise ParameterError(f"{{{name}}}: give a path (a str or pathlib.Path)", **{name: value})
    for name, value in (("weights", weights), ("kv", kv), ("gpu", gpu)):
        if value is not None and not isinstance(value, str):
            raise ParameterError(f"{{{name}}}: give a name (a str)", **{name: value})
    for name, value, least, what in (("tpot_ms", tpot_ms, None, "a time in ms (a finite number above 0)"),
                                     ("allreduce_us", allreduce_us, 0, "a latency in us (a finite number, at "
                                                                       "least 0)")):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or (
                value <= 0 if least is None else value < least):
            raise ParameterError(f"{{{name}}}: not {what}", **{name: value})
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, numbers.Integral) or jobs < 1):
        raise ParameterError("{jobs}: give a number of parallel workers of at least 1", jobs=jobs)


def run(path, *, model=None, quant=None, weights=None, kv=None, gpu=None, tp: int = 1, batch: int | None = None,
        context: int | None = None, tpot_ms: float | None = None, allreduce_us: float | None = None,
        jobs: int | None = None, ray=None):
    """The pipeline's own report (decodegap.pipeline.Report): what the views and detectors read."""
    from decodegap.pipeline import analyze_path

    if not isinstance(path, (str, os.PathLike)):
        raise ParameterError("{path}: give the trace's path (a str or pathlib.Path)", path=path)
    path = Path(path)
    options = _options(path, model, quant, weights, kv, gpu, tp, batch, context, tpot_ms, allreduce_us, jobs)
    try:
        return analyze_path(path, options, jobs=jobs, ray=_ray_address(ray), aside=_import_aside())
    except ParameterError:
        raise
    except UserError as exc:
        from decodegap.floor.config import named_for_what_it_is

        raise named_for_what_it_is(path, exc) from None


def _options(path: Path, model, quant, weights, kv, gpu, tp, batch, context, tpot_ms, allreduce_us, jobs):
    """The run's options, assembled once: the parameters checked, the model and floor prepared, and what is
    assumed where the caller gave nothing (the bundled example's config and context; the floor's defaults)."""
    from decodegap.floor.ledger import DEFAULT_CONTEXT, prepare_model_options
    from decodegap.floor.floor import check_counts
    from decodegap.pipeline import AnalysisOptions, Assumed

    _check_parameters(model, quant, weights, kv, gpu, tpot_ms, allreduce_us, jobs)
    check_counts(tp=tp, batch=1 if batch is None else batch, context=context)
    model_given = model is not None  # the example's own config does not switch the floor on by itself
    assumed = []
    if is_example(path):
        if model is None:
            model = EXAMPLE_MODEL
            assumed.append(Assumed(name="model", value=EXAMPLE_MODEL.name,
                                   reason="the bundled example's own config (this trace is that example, recognised "
                                          "by its content)"))
        if context is None:
            context = EXAMPLE_CONTEXT
            assumed.append(Assumed(name="context", value=EXAMPLE_CONTEXT,
                                   reason="the bundled example's active KV tokens per sequence"))
    floor_assumed = []  # stated when the run has a floor
    if context is None:
        floor_assumed.append(Assumed(name="context", value=DEFAULT_CONTEXT,
                                     reason="the floor's default (the trace does not say how many KV tokens a "
                                            "sequence holds)"))
    if batch is None:
        floor_assumed.append(Assumed(name="batch", value=DEFAULT_BATCH, reason="the floor's default"))
    options = AnalysisOptions(tpot_ms=tpot_ms, assumed=tuple(assumed), floor_assumed=tuple(floor_assumed))
    if model is None:  # what describes the model's weights and floor means nothing without it: never ignored
        for name, value in (("quant", quant), ("weights", weights), ("kv", kv), ("allreduce_us", allreduce_us)):
            if value is not None:
                raise ParameterError(f"{{{name}}} needs {{model}}: it applies to the model its config.json describes",
                                     **{name: value}, model=NAME_ONLY)
    if model is None and gpu is None:
        return options
    options = prepare_model_options(options, Path(model) if model is not None else None,
                                    Path(quant) if quant is not None else None, weights, kv, gpu, tp,
                                    DEFAULT_BATCH if batch is None else batch, context, allreduce_us)
    if not model_given:  # the floor only with a model the caller named
        options = replace(options, floor_request=None)
    return options


def analyze(path, *, model=None, quant=None, weights=None, kv=None, gpu=None, tp: int = 1,
            batch: int | None = None,
            context: int | None = None, tpot_ms: float | None = None, allreduce_us: float | None = None,
            jobs: int | None = None, ray=None) -> Analysis:
    """Analyze a torch.profiler trace (.json / .json.gz) or a folder of per-rank traces.

    Args:
        path: the trace file or folder.
        model: a Hugging Face config.json (or its folder): matches findings to the model's geometry and, with a
            GPU (given, or named by the trace), adds the floor and the gap ledger.
        quant, weights, kv: the quantization (hf_quant_config.json; or weight / KV formats such as nvfp4, fp8).
        gpu: h100, h200, b200, a100, l40s, rtx-pro-6000, mi300x.
        tp, batch, context: tensor-parallel ranks, sequences per step (default 1), tokens of KV per sequence
            (default for the floor: 4096; the bundled example's own 2048 for it). What was assumed is the
            report's `assumed`.
        tpot_ms: time per output token measured without the profiler, to cross-check the profiled step.
        allreduce_us: all-reduce latency for the floor.
        jobs: for a folder, ranks analyzed in parallel processes (default: the cores, capped by memory); 1 analyzes
            them one after another. The report is the same either way.
        ray: for a folder, analyze the ranks as Ray tasks (`pip install 'decodegap[ray]'`): True starts a local Ray
            for the call (with `jobs` CPUs), a string is a cluster address ('auto', 'ray://head:10001'); the files
            must be readable at the same paths on its nodes.
    Returns:
        the Analysis (immutable; `.to_dict()` is the JSON report).
    """
    report = run(path, model=model, quant=quant, weights=weights, kv=kv, gpu=gpu, tp=tp, batch=batch,
                 context=context, tpot_ms=tpot_ms, allreduce_us=allreduce_us, jobs=jobs, ray=ray)
    from decodegap.analysis import build

    return build(report)


def diff(before, after, *, model=None, batch: int | None = None, context: int | None = None) -> dict:
    """Two profiles side by side (each an Analysis, a saved report, a trace or a folder): step time, categories,
    kernel groups new/gone/faster/slower, findings gone/kept/new, and the step BEFORE's findings predict once those
    gone are fixed beside the one AFTER measured (`predicted`). `model`, `batch`, `context`: as for `analyze`, for
    the sides that are traces. Returns the `decodegap.diff/1` dict."""
    from decodegap.analysis import Analysis
    from decodegap.report.diff import diff_reports

    def as_dict(side) -> dict:
        if isinstance(side, Analysis):
            return side.to_dict()
        return load_report(Path(side), model=model, batch=batch, context=context)

    return diff_reports(as_dict(before), as_dict(after))


def load_report(path: Path, tpot_ms: float | None = None, *, model=None, batch: int | None = None,
                context: int | None = None) -> dict:
    """A report dict (`decodegap.report/1`) from a trace, a folder of traces, or a saved `analyze --format json`
    report. `model`, `batch`, `context`: as for `analyze`, for a trace (they size the active KV that the findings'
    estimates need); a saved report keeps what it was analyzed with."""
    from decodegap.report.diff import saved_report

    saved = saved_report(path)
    if saved is not None:
        return saved
    report = run(path, model=model, batch=batch, context=context, tpot_ms=tpot_ms)
    from decodegap.analysis import build

    return build(report).to_dict()


def input_files(path, model=None, quant=None) -> tuple[Path, ...]:
    """The files a run with these arguments reads, which it never writes: the trace (each trace file of a folder),
    the model's config.json, and the quantization config (the one given, or the hf_quant_config.json beside the
    model's config). Only those that exist; paths of the wrong kind are left to the run to refuse."""
    from decodegap.trace.load import find_trace_files

    files: list[Path] = []
    if isinstance(path, (str, os.PathLike)) and Path(path).exists():
        try:
            files += find_trace_files(Path(path))
        except (UserError, OSError):  # a folder with no traces: the run says so
            pass
    for given, name in ((model, "config.json"), (model, "hf_quant_config.json"), (quant, "hf_quant_config.json")):
        if isinstance(given, (str, os.PathLike)):
            given = Path(given)
            files.append(given / name if given.is_dir() else given)
    return tuple(f for f in files if f.is_file())


def annotate(path, out, *, model=None, quant=None, weights=None, kv=None, gpu=None, tp: int = 1,
             batch: int | None = None,
             context: int | None = None, tpot_ms: float | None = None, allreduce_us: float | None = None) -> list[Path]:
    """Analyze `path` and write the trace with decodegap's events added to `out` (the Perfetto overlay: a span per
    step, per layer inside it, and per kernel a finding blames, on a `decodegap` process track; gzip when `out`
    ends in .gz). A folder of traces gives a folder `out` with each rank's file. Returns the files written; the
    input is never modified. Arguments as for `analyze`."""
    from decodegap.report.annotate import check_target, write_overlay

    if not isinstance(out, (str, os.PathLike)):
        raise ParameterError("{out}: give the annotated trace's path (a str or pathlib.Path)", out=out)
    if Path(path).exists():
        check_target(path, out, keep=input_files(path, model, quant))
    report = run(path, model=model, quant=quant, weights=weights, kv=kv, gpu=gpu, tp=tp, batch=batch,
                 context=context, tpot_ms=tpot_ms, allreduce_us=allreduce_us)
    return write_overlay(report, out)
