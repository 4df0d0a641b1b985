"""The Python API: `decodegap.analyze(path, ...) -> Analysis`, `decodegap.load(report.json)`, `decodegap.diff(a, b)`,
`decodegap.api.annotate(path, out)` (the Perfetto overlay).

The command line is a thin client of these functions. Errors are `decodegap.errors.UserError` with one line that
names the parameter (the CLI prints it and exits 2)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from decodegap.analysis import Analysis, build
from decodegap.analysis import load as load  # noqa: PLC0414  (re-exported: decodegap.load)
from decodegap.errors import UserError

# The bundled example: the demo's GLM-5-shaped rank (decodegap.demo) replayed from a CUDA graph on an H200, with
# the config of the model it ran; the demo keeps 2,048 active tokens in the pool.
EXAMPLE_TRACE = Path(str(resources.files("decodegap") / "data" / "example_trace.json.gz"))
EXAMPLE_MODEL = Path(str(resources.files("decodegap") / "data" / "example_model_config.json"))
EXAMPLE_CONTEXT = 2048


def _ray_address(ray) -> str | None:
    """None: no Ray; "": a local Ray for the run; else the cluster's address."""
    if ray is None or ray is False:
        return None
    if ray is True:
        return ""
    if not isinstance(ray, str):
        raise UserError(f"ray={ray!r}: give True (a local Ray) or a cluster address such as 'auto' or "
                        "'ray://head:10001'")
    return ray


def run(path, *, model=None, quant=None, weights=None, kv=None, gpu=None, tp: int = 1, batch: int = 1,
        context: int | None = None, tpot_ms: float | None = None, allreduce_us: float | None = None,
        jobs: int | None = None, ray=None):
    """The pipeline's own report (decodegap.pipeline.Report): what the views and detectors read."""
    from decodegap.pipeline import AnalysisOptions, analyze_path

    path = Path(path)
    model_given = model is not None  # the example's own config does not switch the floor on by itself
    if model is None and path.resolve() == EXAMPLE_TRACE.resolve():
        model, context = EXAMPLE_MODEL, context or EXAMPLE_CONTEXT
    options = AnalysisOptions(tpot_ms=tpot_ms)
    floor_request = None
    if model is not None or gpu is not None:
        from decodegap.floor_ledger import prepare_model_options

        floor_request = prepare_model_options(options, Path(model) if model is not None else None,
                                              Path(quant) if quant is not None else None, weights, kv, gpu, tp,
                                              batch, context, allreduce_us)
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise UserError(f"jobs={jobs!r}: give a number of parallel workers of at least 1")
    report = analyze_path(path, options, jobs=jobs, ray=_ray_address(ray))
    if floor_request is not None and model_given:  # a model but no GPU: the GPU the trace names
        from decodegap.floor_ledger import attach_floor_from_trace

        attach_floor_from_trace(report, floor_request)
    return report


def analyze(path, *, model=None, quant=None, weights=None, kv=None, gpu=None, tp: int = 1, batch: int = 1,
            context: int | None = None, tpot_ms: float | None = None, allreduce_us: float | None = None,
            jobs: int | None = None, ray=None) -> Analysis:
    """Analyze a torch.profiler trace (.json / .json.gz) or a folder of per-rank traces.

    Args:
        path: the trace file or folder.
        model: a Hugging Face config.json (or its folder): matches findings to the model's geometry and, with a
            GPU (given, or named by the trace), adds the floor and the gap ledger.
        quant, weights, kv: the quantization (hf_quant_config.json; or weight / KV formats such as nvfp4, fp8).
        gpu: h100, h200, b200, a100, l40s, rtx-pro-6000, mi300x.
        tp, batch, context: tensor-parallel ranks, sequences per step, tokens of KV per sequence.
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
    return build(run(path, model=model, quant=quant, weights=weights, kv=kv, gpu=gpu, tp=tp, batch=batch,
                     context=context, tpot_ms=tpot_ms, allreduce_us=allreduce_us, jobs=jobs, ray=ray))


def diff(before, after) -> dict:
    """Two profiles side by side (each an Analysis, a saved report, a trace or a folder): step time, categories,
    kernel groups new/gone/faster/slower, findings gone/kept/new. Returns the `decodegap.diff/1` dict."""
    from decodegap.compare import diff_reports, load_report

    def as_dict(side) -> dict:
        return side.to_dict() if isinstance(side, Analysis) else load_report(Path(side))

    return diff_reports(as_dict(before), as_dict(after))


def annotate(path, out, *, model=None, quant=None, weights=None, kv=None, gpu=None, tp: int = 1, batch: int = 1,
             context: int | None = None, tpot_ms: float | None = None, allreduce_us: float | None = None) -> list[Path]:
    """Analyze `path` and write the trace with decodegap's events added to `out` (the Perfetto overlay: a span per
    step, per layer inside it, and per kernel a finding blames, on a `decodegap` process track; gzip when `out`
    ends in .gz). A folder of traces gives a folder `out` with each rank's file. Returns the files written; the
    input is never modified. Arguments as for `analyze`."""
    from decodegap.annotate import write_overlay

    report = run(path, model=model, quant=quant, weights=weights, kv=kv, gpu=gpu, tp=tp, batch=batch,
                 context=context, tpot_ms=tpot_ms, allreduce_us=allreduce_us)
    return write_overlay(report, out)
