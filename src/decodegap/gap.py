"""The gap ledger: the measured decode step beside its hardware floor, category by category, and how much of
the excess the findings explain. Used by `analyze --model ... --gpu ...`."""

from __future__ import annotations

from decodegap.errors import UserError

# Floor components land in these measured categories; everything else has a floor of zero.
FLOOR_CATEGORIES = ("gemm", "moe", "attention", "collective")


def prepare_model_options(options, model_path, quant_path, weights, kv, gpu, tp, batch, context,
                          allreduce_us) -> None:
    """Fill AnalysisOptions with the model geometry (for findings) and, with --gpu, the floor."""
    from decodegap.model import compute_floor, load_model, resolve_gpu, resolve_quant

    if model_path is None:
        raise UserError("--gpu needs --model (the floor is computed from the model's config.json)")
    options.model = load_model(model_path)
    if context is not None:
        options.active_tokens = batch * context
    if gpu is not None:
        scheme = resolve_quant(model_path, quant_path, weights, kv)
        options.floor = compute_floor(options.model, scheme, resolve_gpu(gpu), tp=tp, batch=batch,
                                      context=context if context is not None else 4096,
                                      allreduce_us=allreduce_us)


def gap_ledger(report) -> dict | None:
    floor = report.options.floor
    if floor is None:
        return None
    b = report.main.breakdown
    floor_by_category: dict[str, float] = {}
    for c in floor.components:
        floor_by_category[c.category] = floor_by_category.get(c.category, 0.0) + c.ms
    measured = {c.name: c.ms_per_step for c in b.categories}
    rows = []
    for name in sorted(set(measured) | set(floor_by_category), key=lambda n: -measured.get(n, 0.0)):
        got, least = measured.get(name, 0.0), floor_by_category.get(name, 0.0)
        rows.append({"category": name, "measured_ms": round(got, 4), "floor_ms": round(least, 4),
                     "excess_ms": round(max(got - least, 0.0), 4),
                     "efficiency": round(least / got, 4) if got > 0 and least > 0 else None})
    idle = max(b.step_ms.median - b.busy_ms_per_step, 0.0)
    rows.append({"category": "gpu_idle", "measured_ms": round(idle, 4), "floor_ms": 0.0,
                 "excess_ms": round(idle, 4), "efficiency": None})
    step = b.step_ms.median
    excess = max(step - floor.floor_ms, 0.0)
    explained = min(sum(f.ms_per_step for f in report.findings
                        if f.id not in ("profiler_overhead", "outside_step")), excess)
    return {"step_ms": round(step, 4), "floor_ms": round(floor.floor_ms, 4), "excess_ms": round(excess, 4),
            "efficiency": round(floor.floor_ms / step, 4) if step else None,
            "explained_by_findings_ms": round(explained, 4), "unexplained_ms": round(excess - explained, 4),
            "rows": rows}


def render_gap_text(gap: dict) -> str:
    lines = [f"GAP LEDGER: measured {gap['step_ms']:.3f} ms/step vs floor {gap['floor_ms']:.3f} ms "
             f"(efficiency {gap['efficiency']:.1%}); excess {gap['excess_ms']:.3f} ms, of which the findings "
             f"explain {gap['explained_by_findings_ms']:.3f} ms",
             f"  {'category':12} {'measured ms':>12} {'floor ms':>10} {'excess ms':>10} {'efficiency':>11}"]
    for r in gap["rows"]:
        eff = f"{r['efficiency']:.1%}" if r["efficiency"] is not None else ""
        lines.append(f"  {r['category']:12} {r['measured_ms']:12.3f} {r['floor_ms']:10.3f} {r['excess_ms']:10.3f} "
                     f"{eff:>11}")
    return "\n".join(lines)


def render_gap_markdown(gap: dict) -> str:
    lines = ["### Gap ledger", "",
             f"Measured **{gap['step_ms']:.3f} ms/step** vs floor **{gap['floor_ms']:.3f} ms** "
             f"(efficiency {gap['efficiency']:.1%}); the findings explain {gap['explained_by_findings_ms']:.3f} of "
             f"the {gap['excess_ms']:.3f} ms excess.", "",
             "| category | measured ms | floor ms | excess ms | efficiency |", "|---|---|---|---|---|"]
    for r in gap["rows"]:
        eff = f"{r['efficiency']:.1%}" if r["efficiency"] is not None else ""
        lines.append(f"| {r['category']} | {r['measured_ms']:.3f} | {r['floor_ms']:.3f} | {r['excess_ms']:.3f} | "
                     f"{eff} |")
    return "\n".join(lines)
