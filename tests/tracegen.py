"""Hand-built Kineto traces for edge cases: a tiny decode loop with layers, launches, ops and markers."""

from __future__ import annotations

import gzip
import json
import random
from collections import Counter
from pathlib import Path

LAYER_KERNELS = [("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT", "gemm", 20.0),
                 ("flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<64>>", "attention", 12.0),
                 ("void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add<c10::BFloat16>>",
                  "elementwise", 3.0),
                 ("void vllm::rms_norm_kernel<c10::BFloat16>", "norm", 4.0)]
STEP_KERNELS = [("void at::native::index_select_kernel<c10::BFloat16>", 5.0),
                ("nvjet_sm90_tst_256x8_64x6_2x1_v_bz_TNT", 40.0),
                ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::ArgMaxOps<float>>>",
                 6.0)]


def decode_loop(steps: int = 5, layers: int = 4, markers: str | None = "gpu", gap_us: float = 200.0,
                graph: bool = False, rocm: bool = False, integer_us: bool = False, old_categories: bool = False,
                prefill: bool = False, collective_us: float | None = None, rank: int | None = None,
                base_us: float = 1_000_000.0, extra_layer_kernels: tuple = (), positions: bool = False) -> dict:
    """A Kineto-shaped trace of `steps` decode steps of `layers` layers each. `positions`: learned position
    embeddings (OPT, GPT-2): the positions computed from the mask (two kernels), then a second embedding lookup."""
    events: list[dict] = []
    kernel_cat = "Kernel" if old_categories else "kernel"
    runtime_cat = "Runtime" if old_categories else "cuda_runtime"
    op_cat = "Operator" if old_categories else "cpu_op"
    launch = "hipLaunchKernel" if rocm else "cudaLaunchKernel"
    t_gpu = base_us
    corr = 1000
    ext = 1
    layer_kernels = list(LAYER_KERNELS)
    if rocm:
        layer_kernels[0] = ("Cijk_Alik_Bljk_BBS_BH_MT64x16x64_MI16x16x16x1_SN_1LDSB0", "gemm", 22.0)
    layer_kernels += list(extra_layer_kernels)
    if collective_us is not None:
        layer_kernels.append(("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                              "collective", collective_us))

    def ts(v: float):
        return int(round(v)) if integer_us else round(v, 3)

    last_launch_end = 0.0

    def emit_kernel(name: str, dur: float, op: str | None, dims=None, types=None) -> None:
        nonlocal t_gpu, corr, ext, last_launch_end
        corr += 1
        ext += 1
        cpu_t = t_gpu - 50
        last_launch_end = cpu_t + 6
        if op is not None and not graph:
            args = {"External id": ext}
            if dims is not None:
                args.update({"Input Dims": dims, "Input type": types})
            events.append({"ph": "X", "cat": op_cat, "name": op, "pid": 1, "tid": 1, "ts": ts(cpu_t),
                           "dur": 1.0, "args": args})
        if not graph:
            events.append({"ph": "X", "cat": runtime_cat, "name": launch, "pid": 1, "tid": 1,
                           "ts": ts(cpu_t + 1), "dur": 5.0,
                           "args": {"External id": ext, "correlation": corr}})
        events.append({"ph": "X", "cat": kernel_cat, "name": name, "pid": 0, "tid": 7, "ts": ts(t_gpu),
                       "dur": dur, "args": {"External id": -1 if graph else ext, "device": 0, "stream": 7,
                                            "correlation": graph_corr if graph else corr,
                                            "grid": [132, 1, 1], "block": [128, 1, 1]}})
        t_gpu += dur + 1.0

    total_steps = steps + (1 if prefill else 0)
    for s in range(total_steps):
        is_prefill = prefill and s == 0
        step_start = t_gpu
        graph_corr = 500_000 + s
        if graph:
            events.append({"ph": "X", "cat": runtime_cat, "name": "cudaGraphLaunch", "pid": 1, "tid": 1,
                           "ts": ts(t_gpu - 30), "dur": 9.0, "args": {"correlation": graph_corr, "External id": 0}})
        emit_kernel(STEP_KERNELS[0][0], STEP_KERNELS[0][1], "aten::embedding")
        if positions:
            emit_kernel("void at::native::tensor_kernel_scan_innermost_dim<long>", 2.0, "aten::cumsum")
            emit_kernel("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctorOnSelf_add<long>>",
                        1.0, "aten::sub")
            emit_kernel(STEP_KERNELS[0][0], 2.0, "aten::embedding")
        for _ in range(layers):
            for name, category, dur in layer_kernels:
                if is_prefill and category == "attention":
                    name, dur = "flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128>>", dur * 8
                op = {"gemm": "aten::mm", "attention": "flash_attn::fwd", "elementwise": "aten::add",
                      "norm": "vllm::rms_norm", "collective": "nccl:all_reduce", "cast": "aten::copy_"}[category]
                dims = {"gemm": [[1, 4096], [4096, 4096]], "collective": [[1, 4096]]}.get(category)
                types = ["c10::BFloat16"] * len(dims) if dims else None
                emit_kernel(name, dur * (8 if is_prefill and category == "gemm" else 1), op, dims, types)
        for name, dur in STEP_KERNELS[1:]:
            emit_kernel(name, dur, "aten::mm" if "nvjet" in name else "aten::argmax")
        step_end = t_gpu
        if markers:
            name = f"ProfilerStep#{s}"
            # the CPU side spans the step's launches, as torch.profiler's does (steps never overlap on the host)
            events.append({"ph": "X", "cat": "user_annotation", "name": name, "pid": 1, "tid": 1,
                           "ts": ts(step_start - 50.5), "dur": round(last_launch_end - step_start + 51, 3),
                           "args": {}})
            if markers == "gpu":
                events.append({"ph": "X", "cat": "gpu_user_annotation", "name": name, "pid": 0, "tid": 7,
                               "ts": ts(step_start), "dur": round(step_end - step_start, 3), "args": {}})
        t_gpu += gap_us
    doc = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "AMD Instinct MI300X" if rocm else
                                                     "NVIDIA H200"}],
           "traceEvents": events}
    if rank is not None:
        doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": 2}
    return doc


def write(doc, path: Path, gz: bool | None = None) -> Path:
    gz = path.name.endswith(".gz") if gz is None else gz
    text = json.dumps(doc)
    if gz:
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    return path


def write_kineto_layout(doc, path: Path) -> Path:
    """Like torch's exporter: one event per block, separated by '},\\n  {' (the streaming decoder's path)."""
    head = {k: v for k, v in doc.items() if k != "traceEvents"}
    parts = ["{"] + [f'  "{k}": {json.dumps(v)},' for k, v in head.items()] + ['  "traceEvents": [']
    body = ",\n".join("  " + json.dumps(e) for e in doc["traceEvents"])
    text = "\n".join(parts) + "\n" + body + "\n  ],\n  \"traceName\": \"x\"\n}\n"
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "wt") as f:
        f.write(text)
    return path


def engine_forwards(forwards: int = 1, layers: int = 8, annotation: str | None = None, graph: str | None = None,
                    phases: tuple = ("decode",), batch: int = 32, alternate: bool = False, inductor: bool = False,
                    hip: bool = False, prompt: int = 512, moe_from: int | None = None, experts: int = 8,
                    top_k: int = 2, seed: int = 0, item: bool = False, nope_every: int | None = None,
                    sampling_in_graph: bool = False) -> dict:
    """Forwards as engines run them: `forwards` passes of `layers` layers, each wrapped in the engine's annotation
    (`sglang`: step[DECODE bs=N], `vllm`: execute_..._context_..._generation_...), replayed from one graph per
    forward (`graph="full"`) or one graph per layer piece with eager attention between (`"piecewise"`), or eager.
    `alternate`: layers alternate between two attention kernels (sliding / full); `inductor`: kernels named and
    numbered as Inductor does per graph position; `phases` cycles over the forwards (decode, prefill, mixed).
    `moe_from`: layers from this index on are eager MoE layers (router, top-k, then a launch group per expert that got
    tokens: 1 to `top_k` x batch experts, drawn per layer and forward from `seed`), the first ones dense, as
    DeepSeek-V3 stacks are; every forward then launches a different number of kernels. `item`: after sampling, the
    host checks for a stop token, copies the token back and waits for it (`.item()`, as a generate loop does).
    `nope_every`: every that-many-th layer (the 4th, 8th, ... for 4) runs no rotary embedding, the others run it as
    five kernels (SmolLM3's NoPE layers), so layers differ in length. `sampling_in_graph`: the full graph also
    replays the argmax (a hand-written loop that captures the whole step), so no host op marks a forward."""
    import random

    rng = random.Random(seed)
    events: list[dict] = []
    launch_name = "hipLaunchKernel" if hip else "cudaLaunchKernel"
    graph_name = "hipGraphLaunch" if hip else "cudaGraphLaunch"
    state = {"t_gpu": 1000.0, "t_cpu": 500.0, "corr": 10, "graph_corr": None}
    vocab = 151936

    def launch(name: str, dur: float, op: str | None = None, dims=None, copy: bool = False) -> None:
        state["corr"] += 1
        corr = state["corr"]
        if state["graph_corr"] is None:
            cpu = state["t_cpu"]
            if op:
                args = {"External id": corr}
                if dims:
                    args |= {"Input Dims": dims, "Input type": ["c10::BFloat16"] * len(dims)}
                events.append({"ph": "X", "cat": "cpu_op", "name": op, "pid": 1, "tid": 1, "ts": cpu, "dur": 4.0,
                               "args": args})
            api = ("hipMemcpyAsync" if hip else "cudaMemcpyAsync") if copy else launch_name
            events.append({"ph": "X", "cat": "cuda_runtime", "name": api, "pid": 1, "tid": 1, "ts": cpu + 1,
                           "dur": 3.0, "args": {"correlation": corr, "External id": corr}})
            state["t_cpu"] += 6.0
            state["t_gpu"] = max(state["t_gpu"], cpu + 5)  # a kernel starts after its launch (an idle GPU waits)
        else:
            corr = state["graph_corr"]
        shape = {"bytes": 8} if copy else {"grid": [64, 1, 1], "block": [128, 1, 1]}
        op_id = {"External id": corr} if state["graph_corr"] is None else {}  # its op's, as Kineto writes it
        events.append({"ph": "X", "cat": "gpu_memcpy" if copy else "kernel", "name": name, "pid": 0, "tid": 7,
                       "ts": round(state["t_gpu"], 3), "dur": dur,
                       "args": {"device": 0, "stream": 7, "correlation": corr} | op_id | shape})
        state["t_gpu"] += dur + 0.5

    def start_graph() -> None:
        state["corr"] += 1
        state["graph_corr"] = state["corr"]
        events.append({"ph": "X", "cat": "cuda_runtime", "name": graph_name, "pid": 1, "tid": 1,
                       "ts": state["t_cpu"], "dur": 8.0, "args": {"correlation": state["corr"]}})
        state["t_cpu"] += 10.0
        state["t_gpu"] = max(state["t_gpu"], state["t_cpu"] + 5)

    def end_graph() -> None:
        state["graph_corr"] = None

    def layer_kernels(i: int, phase: str):
        n = 0

        def name(base: str) -> str:
            nonlocal n
            n += 1
            return f"triton_{base}_{i * 4 + n}" if inductor else base
        tokens = batch if phase == "decode" else batch * prompt
        attn = "kernel_unified_attention_3d" if alternate and i % 2 else "kernel_unified_attention_2d"
        if phase != "decode":
            attn = "flash_fwd_kernel_prefill"
        rope = [(name("poi_fused_rotary_cat"), 2.0, "aten::add", None)]
        if nope_every:
            rope = [] if (i + 1) % nope_every == 0 else [
                (f"void at::native::{kernel}", 1.0, f"aten::{op}", None)
                for kernel, op in (("mul_kernel", "mul"), ("neg_kernel", "neg"), ("CatArrayBatchedCopy", "cat"),
                                   ("mul_kernel", "mul"), ("CUDAFunctor_add", "add"))]
        pre = [(name("red_fused_add_mean_mul_pow_rsqrt"), 3.0, "aten::rms_norm", None),
               ("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT", 12.0, "aten::mm", [[tokens, 4096], [4096, 6144]])] + rope
        attention = [(attn, 20.0, "vllm::unified_attention", None)]
        if alternate and i % 2 and phase == "decode":
            attention.append(("reduce_segments", 3.0, "vllm::unified_attention", None))
        post = [("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_NNT", 10.0, "aten::mm", [[tokens, 4096], [4096, 4096]]),
                (name("red_fused_add_mean_mul_pow_rsqrt"), 3.0, "aten::rms_norm", None)]
        if moe_from is not None and i >= moe_from:
            post += [("nvjet_sm90_tst_64x8_64x16_1x1_v_bz_router_TNT", 4.0, "aten::mm", [[tokens, 4096], [4096, 64]]),
                     ("void at::native::softmax_warp_forward<float>", 2.0, "aten::softmax", None),
                     ("void at::native::sbtopk::gatherTopK<float>", 3.0, "aten::topk", None)]
            routed = max(1, tokens * top_k // experts)  # tokens an expert sees
            for _ in range(rng.randint(1, min(experts, top_k * batch))):  # one launch group per expert hit
                post += [("void at::native::index_elementwise_kernel<128, 4>", 2.0, "aten::index", None),
                         ("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_expert_TNT", 6.0, "aten::mm",
                          [[routed, 4096], [4096, 2048]]),
                         (name("poi_fused_mul_silu"), 1.0, "aten::mul", None),
                         ("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_expert_NNT", 5.0, "aten::mm",
                          [[routed, 1024], [1024, 4096]]),
                         ("void at::native::indexFuncLargeIndex<float>", 2.0, "aten::index_add_", None)]
            return pre, attention, post
        post += [("nvjet_sm90_tst_128x8_64x16_4x1_v_bz_TNT", 25.0, "aten::mm", [[tokens, 4096], [4096, 28672]]),
                 (name("poi_fused_mul_silu"), 3.0, "aten::mul", None),
                 ("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_splitK_TNT", 14.0, "aten::mm", [[tokens, 14336], [14336, 4096]])]
        return pre, attention, post

    for f in range(forwards):
        first_event = len(events)
        phase = phases[f % len(phases)]
        state["t_cpu"] = max(state["t_cpu"], state["t_gpu"] - 300)
        mark_start = state["t_cpu"]
        for _ in range(3):  # input preparation, eager
            launch("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<long>>", 2.0,
                   "aten::fill_")
        if graph == "full":
            start_graph()
        launch("void at::native::index_select_large_index<c10::BFloat16>", 6.0, "aten::embedding")
        for i in range(layers):
            pre, attention, post = layer_kernels(i, phase)
            if graph == "piecewise":
                start_graph()
            for name, dur, op, dims in pre:
                launch(name, dur, op, dims)
            if graph == "piecewise":
                end_graph()
            for name, dur, op, dims in attention:
                launch(name, dur, op, dims)
            if graph == "piecewise":
                start_graph()
            for name, dur, op, dims in post:
                launch(name, dur, op, dims)
            if graph == "piecewise":
                end_graph()
        launch("void vllm::rms_norm_kernel<c10::BFloat16>", 3.0, "aten::rms_norm")
        lm_rows = batch
        launch("nvjet_sm90_tst_256x8_64x6_2x1_v_bz_TNT", 60.0, "aten::mm", [[lm_rows, 4096], [4096, vocab]])
        if not sampling_in_graph:  # the argmax runs eagerly after the graph
            end_graph()
        launch("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::ArgMaxOps<float>>>",
               8.0, "aten::argmax")
        if sampling_in_graph:
            end_graph()
        if item:  # a stop-token check, the token copied to the host, and the host waiting for it
            launch("void at::native::vectorized_elementwise_kernel<4, at::native::CompareEqFunctor<long>>", 2.0,
                   "aten::eq")
            launch("Memcpy DtoH (Device -> Pinned)", 1.5, "aten::_local_scalar_dense", copy=True)
            cpu, done = state["t_cpu"], state["t_gpu"]
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "hipStreamSynchronize" if hip else
                           "cudaStreamSynchronize", "pid": 1, "tid": 1, "ts": cpu, "dur": max(done - cpu, 1.0),
                           "args": {"correlation": state["corr"] + 1, "External id": state["corr"]}})
            state["corr"] += 1
            state["t_cpu"] = max(cpu, done) + 2.0
        mark_end = state["t_cpu"] + 1
        if annotation == "sglang":
            mode = {"decode": "DECODE", "prefill": "EXTEND", "mixed": "MIXED"}[phase]
            toks = "" if phase == "decode" else f" toks={batch * prompt}"
            label = f"step[{mode} bs={batch}{toks}]"
        elif annotation == "vllm":
            prefill_reqs = {"decode": 0, "prefill": batch, "mixed": batch // 2}[phase]
            decode_reqs = batch - prefill_reqs
            tokens = decode_reqs + prefill_reqs * prompt
            prefill_tokens = prefill_reqs * prompt
            label = (f"execute_{tokens}_context_{prefill_reqs}(sq{prefill_tokens}sk{prefill_tokens}sqsq0sqsk0)"
                     f"_generation_{decode_reqs}(sq{decode_reqs}sk{decode_reqs * 900}sqsq0sqsk0)")
        else:
            label = None
        if label:
            events.append({"ph": "X", "cat": "user_annotation", "name": label, "pid": 1, "tid": 1,
                           "ts": mark_start - 0.5, "dur": mark_end - mark_start + 0.5, "args": {}})
        for e in events[first_event:]:  # the generator's own truth: which forward each event belongs to
            e["args"]["tracegen_forward"] = f
        state["t_gpu"] += 40.0  # the host prepares the next forward
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H200"}], "traceEvents": events}


def training_loop(iters: int = 6, layers: int = 6, moe_every: int | None = None, optimizer_marks: bool = True,
                  seed: int = 0, micro_batches: int = 1, profiler_steps: bool = False) -> dict:
    """Training iterations as an eager PyTorch loop runs them: zero_grad, then `micro_batches` times (gradient
    accumulation) a forward (embedding, `layers` pre-norm layers, output head, loss) and its backward on the autograd
    thread (layers in reverse), then a fused AdamW step (`Optimizer.step#AdamW.step` annotations unless
    `optimizer_marks` is False). `profiler_steps`: each iteration in a `ProfilerStep#N` annotation (prof.step() once
    per optimizer step), else none. `moe_every`: every that-many-th layer (1, 3, ... for 2) is an eager MoE layer
    (router, top-k, then 2-8 expert launch groups drawn per layer and micro-batch from `seed`) and the others dense, so
    iterations launch different numbers of kernels and the layers are unlike. Each event's args carry
    `tracegen_iteration`, and those of a forward or backward `tracegen_micro_batch` too."""
    import random

    rng = random.Random(seed)
    events: list[dict] = []
    state = {"t_gpu": 1000.0, "t_cpu": 500.0, "corr": 10}
    tokens = 2048

    def launch(name: str, dur: float, op: str, dims=None, thread: int = 1) -> None:
        state["corr"] += 1
        corr, cpu = state["corr"], state["t_cpu"]
        args = {"External id": corr} | ({"Input Dims": dims, "Input type": ["float"] * len(dims)} if dims else {})
        events.append({"ph": "X", "cat": "cpu_op", "name": op, "pid": 1, "tid": thread, "ts": cpu, "dur": 4.0,
                       "args": args})
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": thread,
                       "ts": cpu + 1, "dur": 3.0, "args": {"correlation": corr, "External id": corr}})
        state["t_cpu"] += 6.0
        state["t_gpu"] = max(state["t_gpu"], state["t_cpu"] + 5)
        events.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": round(state["t_gpu"], 3),
                       "dur": dur, "args": {"device": 0, "stream": 7, "correlation": corr,
                                            "grid": [64, 1, 1], "block": [128, 1, 1]}})
        state["t_gpu"] += dur + 0.5

    add = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>"
    gelu = "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>"
    norm = "void at::native::vectorized_layer_norm_kernel<float>"
    grad = "autograd::engine::evaluate_function: "

    def forward_backward() -> None:
        launch("void at::native::indexSelectLargeIndex<float>", 8.0, "aten::embedding", [[32000, 1024], [4, 512]])
        for i in range(layers):
            launch(norm, 6.0, "aten::layer_norm")
            launch("ampere_sgemm_128x64_tn", 40.0, "aten::mm", [[tokens, 1024], [1024, 3072]])
            launch("flash_fwd_kernel", 30.0, "aten::_scaled_dot_product_flash_attention")
            launch("ampere_sgemm_64x64_tn", 15.0, "aten::mm", [[tokens, 1024], [1024, 1024]])
            launch(add, 4.0, "aten::add")
            launch(norm, 6.0, "aten::layer_norm")
            if moe_every and i % moe_every == moe_every - 1:
                launch("ampere_sgemm_32x32_router_tn", 3.0, "aten::mm", [[tokens, 1024], [1024, 8]])
                launch("void at::native::sbtopk::gatherTopK<float>", 2.0, "aten::topk")
                for _ in range(rng.randint(2, 8)):  # one launch group per expert that got tokens
                    launch("ampere_sgemm_expert_nn", 10.0, "aten::mm", [[512, 1024], [1024, 4096]])
                    launch(gelu, 2.0, "aten::gelu")
                    launch("ampere_sgemm_expert_tn", 10.0, "aten::mm", [[512, 4096], [4096, 1024]])
            else:
                launch("ampere_sgemm_128x128_nn", 50.0, "aten::mm", [[tokens, 1024], [1024, 4096]])
                launch(gelu, 5.0, "aten::gelu")
                launch("ampere_sgemm_128x128_tn", 50.0, "aten::mm", [[tokens, 4096], [4096, 1024]])
            launch(add, 4.0, "aten::add")
        launch("ampere_sgemm_128x128_lm_tn", 200.0, "aten::mm", [[tokens, 1024], [1024, 32000]])
        launch("void at::native::cunn_SoftMaxForward<float>", 30.0, "aten::_log_softmax")
        launch("void at::native::nll_loss_forward_reduce_cuda_kernel_2d<float>", 5.0, "aten::nll_loss_forward")
        launch("void at::native::nll_loss_backward_reduce_cuda_kernel_2d<float>", 5.0, grad + "NllLossBackward0",
               thread=2)
        launch("void at::native::cunn_SoftMaxBackward<float>", 30.0, grad + "LogSoftmaxBackward0", thread=2)
        launch("ampere_sgemm_128x128_lm_nn", 400.0, grad + "MmBackward0", thread=2)
        for _ in range(layers):  # the layers' backward, last layer first
            for _ in range(2):
                launch("ampere_sgemm_128x128_nt", 100.0, grad + "MmBackward0", thread=2)
                launch("void at::native::vectorized_elementwise_kernel<4, at::native::GeluBackwardCUDAKernelImpl>", 5.0,
                       grad + "GeluBackward0", thread=2)
            launch("flash_bwd_dq_dk_dv_loop_kernel", 60.0, grad + "ScaledDotProductFlashAttentionBackward0", thread=2)
            launch("ampere_sgemm_128x64_nt", 80.0, grad + "MmBackward0", thread=2)
            launch("void at::native::layer_norm_grad_input_kernel<float>", 8.0, grad + "NativeLayerNormBackward0",
                   thread=2)
        launch("void at::native::embedding_backward_feature_kernel<float>", 20.0, grad + "EmbeddingBackward0", thread=2)

    for it in range(iters):
        first_event = len(events)
        iteration_start = state["t_cpu"]
        launch("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", 5.0, "aten::zero_")
        for mb in range(micro_batches):
            first_of_micro_batch = len(events)
            forward_backward()
            for e in events[first_of_micro_batch:]:
                e["args"]["tracegen_micro_batch"] = mb
        step_start = state["t_cpu"]
        for _ in range(3):
            launch("void at::native::multi_tensor_apply_kernel<FusedAdamMathFunctor>", 40.0, "aten::_fused_adamw_")
        if optimizer_marks:
            events.append({"ph": "X", "cat": "user_annotation", "name": "Optimizer.step#AdamW.step", "pid": 1, "tid": 1,
                           "ts": step_start, "dur": state["t_cpu"] - step_start, "args": {}})
        if profiler_steps:
            events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{it}", "pid": 1, "tid": 1,
                           "ts": iteration_start - 1, "dur": state["t_cpu"] - iteration_start + 2, "args": {}})
        for e in events[first_event:]:  # the generator's own truth: which iteration each event belongs to
            e["args"]["tracegen_iteration"] = it
        state["t_cpu"] += 100
        state["t_gpu"] += 50
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}], "traceEvents": events}


def kineto_order(doc: dict) -> dict:
    """The events in the order Kineto writes them: every CPU-side op and annotation first, then the GPU activities
    and runtime calls by time (so a file cut short keeps the CPU side whole and loses the end of the GPU side)."""
    host_first = ("cpu_op", "user_annotation", "python_function")
    events = doc["traceEvents"]
    head = [e for e in events if e.get("cat") in host_first]
    tail = sorted((e for e in events if e.get("cat") not in host_first), key=lambda e: e.get("ts", 0))
    return doc | {"traceEvents": head + tail}


def generate_loop(forwards: int = 10, layers: int = 4, prompt: int = 16, batch: int = 1, kv_cache: bool = True,
                  record_shapes: bool = False, attention: str = "eager", logits: str = "all",
                  first: int = 0, generations: int = 1, experts: int = 0, top_k: int = 2, routing: str = "causal",
                  seed: int = 0, extend: int | list[int] = 0, vision_blocks: int = 0, patches: int = 256,
                  drafts: int = 0, draft_layers: int = 2) -> dict:
    """A greedy generate loop as an eager HF model runs it (modelled on an MPT block: layer norm, fused QKV, attention,
    output projection, residual add, layer norm, GELU MLP, residual add), one forward per new token, no annotations.
    Launch grids follow the tensors they cover (a layer norm launches one block per row, an elementwise kernel one per
    8,192 elements, a GEMM one per 64 x 1,024 tile of its output), so they grow with the tokens a forward processes.
    `kv_cache`: the first forward processes the prompt and each later one only the new token, appending its keys and
    values to the cache (two `aten::cat` per layer); without it (HF's `use_cache=False`) every forward processes the
    whole sequence again (prompt + tokens generated so far): each is a prefill. `record_shapes`: the CPU ops carry
    their input shapes. `attention`: "eager" (batched matmuls, `aten::bmm` as torch.matmul runs them, around a
    masked softmax) or "sdpa" (one flash kernel under `aten::_scaled_dot_product_flash_attention`). `logits`: "all"
    (the lm_head over every position, as older HF models do) or "last" (only each sequence's last position).
    `first`: the capture starts at that forward of the loop (a trace taken mid-generation). `generations`: that many
    generate calls back to back, `forwards` forwards each, each starting again from the prompt. `experts`: an eager
    MoE layer in place of the MLP (HF's Mixtral / OLMoE block: a router GEMM, softmax and top-`top_k` over every
    token, then a loop over the experts that got tokens, in expert order, each finding its tokens (`nonzero`: three
    one-block kernels), gathering them, running its gate/up GEMM, activation and down GEMM on them and adding them
    back): how many experts run, and on how many tokens each, follows the routing. `routing`: "causal" draws each
    token's experts once per sequence and position (seeded by `seed`), as a causal model routes them: a forward that
    recomputes the sequence routes the earlier tokens as before, the new one anew; "fresh" draws them anew in every
    forward (any routing: numerical noise flipping ties, a model that is not causal). `extend`: with a cache, the
    second forward processes that many new tokens at once (a chunked prefill's second chunk: an extend); a list: the
    new tokens of each forward after the prompt's (prompt-lookup decoding verifies a few at once: extends among the
    decodes). `vision_blocks`: each generation's first forward runs that many blocks of the same layer kernels over
    `patches` rows after its embedding lookup (a VLM's vision tower, whose blocks use the LLM's norm, attention and
    MLP kernels, as Qwen2.5-VL's do). `drafts`: before each forward after a generation's first, a draft model of
    `draft_layers` layers (same kernels) runs that many forwards over the same tokens, each sampling (assisted
    generation); its events carry `tracegen_draft` (the forward they precede) instead of `tracegen_forward`. Each
    event's args carry `tracegen_forward` (its index in the trace); the truth per forward is
    `generate_loop_truth(...)` with the same arguments."""
    hidden, heads, head_dim, inter, vocab = 2048, 16, 128, 8192, 50432
    events: list[dict] = []
    state = {"t_gpu": 1000.0, "t_cpu": 500.0, "corr": 10}

    def launch(name: str, grid: list[int], op: str, dims: list | None = None, block: list[int] | None = None) -> None:
        state["corr"] += 1
        corr, cpu = state["corr"], state["t_cpu"]
        args = {"External id": corr}
        if record_shapes and dims:
            args |= {"Input Dims": dims, "Input type": ["c10::BFloat16"] * len(dims)}
        events.append({"ph": "X", "cat": "cpu_op", "name": op, "pid": 1, "tid": 1, "ts": cpu, "dur": 4.0,
                       "args": args})
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                       "ts": cpu + 1, "dur": 3.0, "args": {"correlation": corr, "External id": corr}})
        state["t_cpu"] += 6.0
        state["t_gpu"] = max(state["t_gpu"], cpu + 5)
        dur = round(2.0 + 0.05 * grid[0] * grid[1] * grid[2], 3)  # more blocks, longer
        events.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": round(state["t_gpu"], 3),
                       "dur": dur, "args": {"device": 0, "stream": 7, "correlation": corr, "External id": corr,
                                            "grid": grid, "block": block or [128, 1, 1]}})
        state["t_gpu"] += dur + 0.5

    def cdiv(a: int, b: int) -> int:
        return -(-a // b)

    def elementwise(functor: str, elements: int, op: str, dims: list) -> None:
        launch(f"void at::native::vectorized_elementwise_kernel<8, at::native::{functor}<c10::BFloat16>>",
               [cdiv(elements, 8192), 1, 1], op, dims)

    def gemm(rows: int, k: int, n: int) -> None:
        launch("nvjet_sm90_tst_64x8_64x16_2x4_h_bz_TNT", [cdiv(rows, 64), cdiv(n, 1024), 1], "aten::mm",
               [[rows, k], [k, n]], [384, 1, 1])

    def layer_norm(rows: int) -> None:
        launch("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>",
               [rows, 1, 1], "aten::native_layer_norm", [[rows, hidden], [hidden], [hidden]], [32, 4, 1])

    def attend(q: int, kv: int) -> None:
        b, h, d = batch, heads, head_dim
        if kv_cache and kv > q:  # the new keys and values appended to the cache
            for _ in range(2):
                launch("void at::native::(anonymous namespace)::CatArrayBatchedCopy<c10::BFloat16, unsigned int, 4>",
                       [cdiv(b * h * kv * d, 8192), 1, 1], "aten::cat", [[b, h, kv - q, d], [b, h, q, d]])
        if attention == "sdpa":
            launch("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>",
                   [cdiv(q, 128), h, b], "aten::_scaled_dot_product_flash_attention",
                   [[b, h, q, d], [b, h, kv, d], [b, h, kv, d]])
            return
        launch("void cutlass::Kernel2<cutlass_75_wmma_tensorop_bf16_s161616gemm_bf16_32x32_32x1_tn_align1>",
               [cdiv(kv, 32), cdiv(q, 32), b * h], "aten::bmm", [[b * h, q, d], [b * h, d, kv]])
        elementwise("AUnaryFunctor_mul", b * h * q * kv * 4, "aten::mul", [[b, h, q, kv], []])
        launch("void at::native::elementwise_kernel<128, 2, at::native::masked_fill_kernel>",
               [cdiv(b * h * q * kv * 8, 8192), 1, 1], "aten::masked_fill_", [[b, h, q, kv], [1, 1, q, kv], []])
        launch("void (anonymous namespace)::softmax_warp_forward<float, float, float, 5, false, false>",
               [cdiv(b * h * q, 32), 1, 1], "aten::_softmax", [[b, h, q, kv], [], []], [32, 4, 1])
        launch("void cutlass::Kernel2<cutlass_75_wmma_tensorop_bf16_s161616gemm_bf16_32x32_32x1_nn_align1>",
               [cdiv(d, 64), cdiv(q, 32), b * h], "aten::bmm", [[b * h, q, kv], [b * h, kv, d]])

    def route(forward_i: int, position: int) -> list[list[int]]:
        """Each sequence's experts for the token at `position`."""
        key = f"{seed}-{position}" + (f"-{forward_i}" if routing == "fresh" else "")
        return [random.Random(f"{key}-{s}").sample(range(experts), top_k) for s in range(batch)]

    def moe(rows: int, positions: range, forward_i: int) -> None:
        expert_inter = 1024
        gemm(rows, hidden, experts)  # the router
        launch("void (anonymous namespace)::softmax_warp_forward<float, float, float, 6, false, false>",
               [cdiv(rows, 4), 1, 1], "aten::_softmax", [[rows, experts], [], []], [32, 4, 1])
        launch("void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>", [rows, 1, 1], "aten::topk",
               [[rows, experts], [], [], [], []])
        elementwise("BinaryFunctor_div", rows * top_k, "aten::div", [[rows, top_k], [rows, 1]])
        launch("void at::native::elementwise_kernel<128, 4, at::native::one_hot_kernel>",
               [cdiv(rows * top_k * experts, 512), 1, 1], "aten::one_hot", [[rows, top_k], []])
        tokens = Counter(e for p in positions for chosen in route(forward_i, p) for e in chosen)
        for e in sorted(tokens):  # the experts that got tokens, in expert order
            n = tokens[e]
            for kernel in ("void at_cuda_detail::cub::detail::scan::DeviceCompactInitKernel<int>",
                           "void at_cuda_detail::cub::detail::select::DeviceSelectSweepKernel<int>",
                           "void at::native::(anonymous namespace)::write_indices<long>"):
                launch(kernel, [1, 1, 1], "aten::nonzero", [[top_k, rows]])  # the expert's tokens
            launch("void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel>",
                   [cdiv(n * hidden, 512), 1, 1], "aten::index", [[rows, hidden], [n]])
            gemm(n, hidden, 2 * expert_inter)
            elementwise("silu_kernel", n * expert_inter, "aten::silu", [[n, expert_inter]])
            elementwise("CUDAFunctor_mul", n * expert_inter, "aten::mul", [[n, expert_inter], [n, expert_inter]])
            gemm(n, expert_inter, hidden)
            elementwise("CUDAFunctor_mul", n * hidden, "aten::mul", [[n, hidden], [n, 1]])
            launch("void at::native::indexFuncLargeIndex<c10::BFloat16, long, unsigned int, 2, 2, -2, true>",
                   [cdiv(n * hidden, 512), 1, 1], "aten::index_add_", [[rows, hidden], [n], [n, hidden]])

    def block(q: int, kv: int, forward_i: int) -> None:
        rows = batch * q
        layer_norm(rows)
        gemm(rows, hidden, 3 * hidden)
        attend(q, kv)
        gemm(rows, hidden, hidden)
        elementwise("CUDAFunctor_add", rows * hidden, "aten::add", [[batch, q, hidden], [batch, q, hidden]])
        layer_norm(rows)
        if experts:
            moe(rows, range(kv - q, kv), forward_i)
        else:
            gemm(rows, hidden, inter)
            elementwise("GeluCUDAKernelImpl", rows * inter, "aten::gelu", [[batch, q, inter]])
            gemm(rows, inter, hidden)
        elementwise("CUDAFunctor_add", rows * hidden, "aten::add", [[batch, q, hidden], [batch, q, hidden]])

    def forward(f: int, forward_i: int, n_layers: int = layers) -> None:
        news = _new_tokens(extend, f)
        q = (prompt + f) if not kv_cache else (prompt if f == 0 else news[-1])
        kv = (prompt + f) if not kv_cache else prompt + sum(news)
        rows = batch * q
        launch("void at::native::(anonymous namespace)::indexSelectLargeIndex<c10::BFloat16, long, unsigned int>",
               [cdiv(rows * hidden, 8192), 1, 1], "aten::embedding", [[vocab, hidden], [batch, q]])
        if f == 0 and vision_blocks:
            for _ in range(vision_blocks):
                block(patches // batch, patches // batch, forward_i)
        for _ in range(n_layers):
            block(q, kv, forward_i)
        layer_norm(rows)
        gemm(rows if logits == "all" else batch, hidden, vocab)
        launch("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::ArgMaxOps<float>>>",
               [batch, 1, 1], "aten::argmax", [[batch, vocab]])

    for i in range(forwards * generations):
        f = first + i % forwards
        for _ in range(drafts if f else 0):
            start = len(events)
            forward(f, i, draft_layers)
            for e in events[start:]:
                e["args"]["tracegen_draft"] = i
            state["t_cpu"] += 100.0
            state["t_gpu"] = max(state["t_gpu"], state["t_cpu"])
        start = len(events)
        forward(f, i)
        for e in events[start:]:
            e["args"]["tracegen_forward"] = i
        state["t_cpu"] += 300.0  # the host appends the token and prepares the next forward
        state["t_gpu"] = max(state["t_gpu"], state["t_cpu"])
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}], "traceEvents": events}


def _new_tokens(extend: int | list[int], f: int) -> list[int]:
    """The new tokens of forwards 1..f of a loop with a cache (`generate_loop`'s `extend`)."""
    each = list(extend) if isinstance(extend, list) else ([extend] if extend else [])
    return [each[i - 1] if i - 1 < len(each) else 1 for i in range(1, f + 1)]


def generate_loop_truth(forwards: int = 10, kv_cache: bool = True, first: int = 0, generations: int = 1,
                        extend: int | list[int] = 0, **_) -> list[str]:
    """The phase of each forward `generate_loop` writes with these arguments: with a KV cache the loop's first forward
    is the prefill, one of several new tokens (`extend`) a prefill too, and the others decode; without one every
    forward processes the whole sequence: a prefill."""
    return ["prefill" if not kv_cache or first + i == 0 or _new_tokens(extend, first + i)[-1] > 1 else "decode"
            for i in range(forwards)] * generations
