"""Running the demo: build the model, time steps without the profiler, record a window of steps through
decodegap.capture's StepProfiler (in-process), analyze the trace, and compare KV read strategies."""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from decodegap.demo.config import DemoConfig
from decodegap.demo.model import DemoModel


def pick_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
    return torch.device(device)


def effective_kv_read(kv_read: str, device: torch.device) -> tuple[str, str | None]:
    """fused needs a GPU, or Triton's interpreter on a CPU; else gather_cast, with a note saying so."""
    if kv_read == "fused" and device.type == "cpu" and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        return "gather_cast", "fused needs a GPU or TRITON_INTERPRET=1 on a CPU: running gather_cast instead"
    return kv_read, None


def set_kv_read(model: DemoModel, kv_read: str, cuda_graph: bool) -> None:
    """Switch the attention's KV read on a built model (same weights, same pool); re-capture the graph."""
    model.kv_read = kv_read
    model._graph = None
    if cuda_graph:
        torch.cuda.synchronize()
        model.capture_graph()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(model: DemoModel, steps: int, warmup: int = 2) -> list[float]:
    """Milliseconds per step without the profiler: CUDA events around each step on a GPU, else the wall clock."""
    for _ in range(warmup):
        model.step()
    sync(model.device)
    out = []
    if model.device.type == "cuda":
        for _ in range(steps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            model.step()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end))
    else:
        for _ in range(steps):
            t0 = time.perf_counter()
            model.step()
            out.append((time.perf_counter() - t0) * 1e3)
    return out


def record(model: DemoModel, out_dir: str | Path, steps: int, warmup: int, timed_steps: int,
           record_shapes: bool) -> Path:
    """Run warmup + timed + profiled steps through the project's StepProfiler; the trace's path."""
    from decodegap.capture import StepProfiler

    prof = StepProfiler(warmup=warmup, steps=steps, timed_steps=timed_steps, out_dir=str(out_dir), enabled=True,
                        record_shapes=record_shapes, target=f"decodegap.demo:{model.kv_read}")
    with prof:
        for _ in range(warmup + timed_steps + steps):
            with prof.step():
                model.step()
    if prof.trace_path is None:
        raise RuntimeError(f"the profiler wrote no trace into {out_dir} (see the warning above)")
    return Path(prof.trace_path)


def model_options(config: DemoConfig):
    """AnalysisOptions that know the demo's own geometry: its KV width and active token count sharpen findings."""
    from decodegap.pipeline import AnalysisOptions
    from decodegap.floor.config import geometry_from_dict

    geometry = geometry_from_dict(hf_config(config), source="decodegap demo")
    return AnalysisOptions(model=geometry, active_tokens=config.batch * config.context)


def hf_config(c: DemoConfig) -> dict:
    """The demo slice as a Hugging Face style config (one rank's heads, experts and vocabulary, TP 1)."""
    return {"model_type": "deepseek_v3", "num_hidden_layers": c.layers, "hidden_size": c.hidden,
            "num_attention_heads": c.heads, "num_key_value_heads": c.heads, "q_lora_rank": c.q_lora,
            "kv_lora_rank": c.kv_lora, "qk_nope_head_dim": c.qk_nope, "qk_rope_head_dim": c.rope,
            "v_head_dim": c.v_head, "n_routed_experts": c.experts, "num_experts_per_tok": c.top_k,
            "moe_intermediate_size": c.moe_intermediate, "intermediate_size": c.dense_intermediate,
            "first_k_dense_replace": c.dense_layers, "n_shared_experts": 1, "vocab_size": c.vocab,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


def analyze(trace_path: Path, config: DemoConfig):
    """The project's analysis of a demo trace (on a CPU-only trace the analyzer breaks down CPU ops instead)."""
    from decodegap.pipeline import analyze_path

    return analyze_path(trace_path, model_options(config))


@dataclass
class CompareRow:
    kv_read: str
    ms_per_step: float  # median, without the profiler
    samples: list[float]
    trace: Path | None
    finding_ids: list[str] = field(default_factory=list)
    profiled_ms: float | None = None  # the analyzer's median step in the trace
    report: object | None = None  # decodegap.pipeline.Report of the recorded trace

    batch: int = 1

    @property
    def tok_per_s(self) -> float:
        return 1e3 * self.batch / self.ms_per_step if self.ms_per_step else 0.0


def compare(model: DemoModel, kv_reads: list[str], cuda_graph: bool, timed: int, out_dir: Path | None,
            record_steps: int, record_warmup: int, record_shapes: bool, log=print) -> list[CompareRow]:
    """Each strategy in turn on the same model: timed without the profiler, then (out_dir) recorded + analyzed."""
    rows = []
    for kv_read in kv_reads:
        set_kv_read(model, kv_read, cuda_graph)
        samples = time_steps(model, timed)
        row = CompareRow(kv_read, statistics.median(samples), samples, None, batch=model.config.batch)
        log(f"{kv_read}: {row.ms_per_step:.3f} ms/step (median of {timed}, no profiler)")
        if out_dir is not None:
            row.trace = record(model, out_dir / kv_read, record_steps, record_warmup, 2, record_shapes)
            report = analyze(row.trace, model.config)
            row.finding_ids = [f.id for f in report.findings]
            row.profiled_ms = report.main.breakdown.step_ms.median or None
            row.report = report
        rows.append(row)
    return rows


def compare_table(rows: list[CompareRow], markdown: bool = False) -> str:
    base = next((r.ms_per_step for r in rows if r.kv_read == "full_cast"), rows[0].ms_per_step)
    head = ["kv read", "ms/step", "tok/s", "speedup vs full_cast", "profiled ms/step", "findings"]
    body = [[r.kv_read, f"{r.ms_per_step:.3f}", f"{r.tok_per_s:.1f}", f"{base / r.ms_per_step:.2f}x",
             f"{r.profiled_ms:.3f}" if r.profiled_ms else "-", ", ".join(r.finding_ids) or "-"] for r in rows]
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(b) + " |" for b in body]
        return "\n".join(lines) + "\n"
    widths = [max(len(x) for x in col) for col in zip(head, *body, strict=True)]
    fmt = "  ".join("{:<%d}" % w if i in (0, 5) else "{:>%d}" % w for i, w in enumerate(widths))
    return "\n".join(fmt.format(*line) for line in [head, *body]) + "\n"
