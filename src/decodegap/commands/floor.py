"""`decodegap floor`: the least time a decode step can take for a model, quantization, GPU and parallelism."""

from __future__ import annotations

import click


@click.command("floor")
@click.option(
    "--model",
    "model_path",
    required=True,
    type=click.Path(),
    help="config.json of the model, or the folder holding it (no download).",
)
@click.option(
    "--quant",
    "quant_path",
    type=click.Path(),
    help="hf_quant_config.json (default: one beside config.json, else its quantization_config).",
)
@click.option(
    "--weights",
    help="Weight format for every linear layer: bf16 fp16 fp8 int8 nvfp4 mxfp4 int4 q4_0 "
    "q4_k q5_k q6_k q8_0 (overrides --quant).",
)
@click.option("--kv", help="KV-cache dtype: bf16 fp16 fp8.")
@click.option("--gpu", "gpu_name", help="GPU id or name: h100 h200 b200 a100 l40s rtx-pro-6000 mi300x ...")
@click.option(
    "--bandwidth", "bandwidth_gbps", type=float, help="Memory bandwidth in GB/s (GPU not in the table)."
)
@click.option("--tflops", type=float, help="Dense BF16 TFLOPS (GPU not in the table).")
@click.option("--tp", type=int, default=1, show_default=True, help="Tensor-parallel GPUs.")
@click.option("--batch", type=int, default=1, show_default=True, help="Sequences decoded together.")
@click.option("--context", type=int, default=4096, show_default=True, help="KV tokens per sequence.")
@click.option(
    "--allreduce-us", type=float, help="All-reduce latency per call in us (default by interconnect)."
)
@click.option(
    "--dense-attention",
    is_flag=True,
    help="Run a DSA model's attention densely over the whole context (engines without sparse MLA).",
)
@click.option("--format", "fmt", type=click.Choice(["text", "md", "json"]), default="text", show_default=True)
def command(
    model_path: str,
    quant_path: str | None,
    weights: str | None,
    kv: str | None,
    gpu_name: str | None,
    bandwidth_gbps: float | None,
    tflops: float | None,
    tp: int,
    batch: int,
    context: int,
    allreduce_us: float | None,
    dense_attention: bool,
    fmt: str,
) -> None:
    """Least time one decode step can take: bytes and flops per GPU per component, plus all-reduces."""
    from decodegap.floor import compute_floor, load_model, resolve_gpu, resolve_quant
    from decodegap.report.floor import render

    geometry = load_model(model_path)
    scheme = resolve_quant(model_path, quant_path, weights, kv)
    gpu = resolve_gpu(gpu_name, bandwidth_gbps, tflops)
    floor = compute_floor(
        geometry,
        scheme,
        gpu,
        tp=tp,
        batch=batch,
        context=context,
        allreduce_us=allreduce_us,
        sparse_attention=not dense_attention,
    )
    click.echo(render(floor, fmt), nl=False)
