"""Make small real torch.profiler (Kineto) traces of a tiny Llama for decodegap's step / phase / layer tests.

What it makes (issue 12), each `<name>.json.gz` (export_chrome_trace, then gzip) with a sidecar
`<name>.truth.json` whose numbers the script measures while it runs (forward pre-hooks count model forwards and
the tokens each one sees, decoder-layer hooks count layers, loop counters count graph replays and profiler steps):

1. hf_compile_generate       torch.compile (Inductor, default mode) on the model forward; one greedy `generate`
                             at batch 2 after warm-up generates (compilation stays out of the trace); no step markers.
2. hf_cudagraph_decode       static KV cache; one decode forward (+ argmax) captured with torch.cuda.graph and
                             replayed N times, inputs updated in place between replays; no step markers.
3. train_steps               AdamW training loop, schedule(wait=1, warmup=1, active=3) + prof.step().
4. eager_hostbound_nomarkers eager decode loop at batch 1, no markers; a forward hook on the middle decoder layer
                             synchronizes and sleeps 2 ms, so the largest GPU idle gap lies inside each step.
5. gpu_step_annotation_cut   eager decode loop with schedule + prof.step(); in one interior profiled step the model
                             forward runs inside a nested record_function, and Kineto then gives the GPU-side
                             ProfilerStep annotation only the kernels launched outside it (the script checks this in
                             the exported trace and records what it found in the truth file).

The model: LlamaForCausalLM from a config with random weights (hidden 256, 4 heads, 2 KV heads, vocab 4096,
16 layers; 4 layers for training), bf16 on CUDA, SDPA with its cuDNN backend off. No downloads.

Size: each gzipped trace must stay under 400 kB. A trace over it is rewritten through scripts/trim_trace.py with a
window holding everything (every event kept; flow arrows and op args decodegap never reads dropped); one still over
it is captured again with fewer steps (4) or fewer layers (3, 5), and the truth file says so (`size_fit`).

Run on a CUDA machine (torch + transformers; about 90 s on one H200, 55 s of it Inductor compilation):
    python3 scripts/make_gpu_fixtures.py OUT_DIR [--only NAME ...]
Smoke-test the logic on a CPU (CPU activity only, 2 layers, no CUDA graph trace):
    python3 scripts/make_gpu_fixtures.py /tmp/fx --device cpu --layers 2
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field

import torch
from torch.profiler import ProfilerAction, ProfilerActivity, profile, record_function, schedule

VOCAB = 4096
PROMPT = 16


@dataclass
class Forward:
    batch: int
    tokens: int  # tokens per sequence this forward sees (input_ids.shape[1])
    cached_before: int  # KV length before it; 0 means prefill
    phase: str


@dataclass
class ForwardLog:
    """Counts model forwards through a forward pre-hook while `on` is set."""

    on: bool = False
    forwards: list[Forward] = field(default_factory=list)

    def hook(self, module, args, kwargs):
        if not self.on:
            return
        ids = kwargs.get("input_ids", args[0] if args else None)
        past = kwargs.get("past_key_values")
        cached = past.get_seq_length() if past is not None and hasattr(past, "get_seq_length") else 0
        cached = int(cached)
        tokens = int(ids.shape[1])
        phase = "prefill" if cached == 0 else ("decode" if tokens == 1 else "extend")
        self.forwards.append(Forward(int(ids.shape[0]), tokens, cached, phase))

    def summary(self) -> dict:
        phases: dict[str, dict] = {}
        for f in self.forwards:
            p = phases.setdefault(f.phase, {"count": 0, "batch": set(), "tokens_per_forward": set()})
            p["count"] += 1
            p["batch"].add(f.batch)
            p["tokens_per_forward"].add(f.batch * f.tokens)
        for p in phases.values():
            p["batch"] = sorted(p["batch"])
            p["tokens_per_forward"] = sorted(p["tokens_per_forward"])
        return {"forwards": len(self.forwards), "phases": phases, "each": [asdict(f) for f in self.forwards]}


def tiny_llama(layers: int, device: str):
    # SDPA's cuDNN backend builds a new plan whenever the KV length changes: ~50 ms of GPU idle before the first
    # attention kernel of every eager decode step (seen on the H200, torch 2.11). Engines use flash kernels.
    torch.backends.cuda.enable_cudnn_sdp(False)
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=layers, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=512)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    return model.to(device=device, dtype=dtype).eval()


def attach_log(model) -> ForwardLog:
    log = ForwardLog()
    model.register_forward_pre_hook(log.hook, with_kwargs=True)
    return log


def layers_per_forward(model, device: str) -> int:
    """Decoder-layer calls in one eager forward (hooks on every module whose class name ends in DecoderLayer)."""
    calls = []
    handles = [m.register_forward_hook(lambda *a: calls.append(1)) for m in model.modules()
               if type(m).__name__.endswith("DecoderLayer")]
    with torch.no_grad():
        model(input_ids=torch.randint(0, VOCAB, (1, 4), device=device))
    for h in handles:
        h.remove()
    return len(calls)


def prompt(batch: int, device: str) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, PROMPT), device=device, generator=None)


def activities(device: str):
    return [ProfilerActivity.CPU, ProfilerActivity.CUDA] if device == "cuda" else [ProfilerActivity.CPU]


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


LIMIT_BYTES = 400_000  # the project's size limit for one gzipped fixture
TRIM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "trim_trace.py")


def save(prof, out_dir: str, name: str, truth: dict) -> int:
    """Export, gzip, and if over the limit rewrite through trim_trace.py keeping every event (its default drops
    flow arrows and op args decodegap never reads). Writes the truth file; returns the gzipped size."""
    raw = os.path.join(out_dir, f"{name}.json")
    gz = raw + ".gz"
    prof.export_chrome_trace(raw)
    with open(raw, "rb") as src, gzip.open(gz, "wb", compresslevel=9) as dst:
        shutil.copyfileobj(src, dst)
    os.remove(raw)
    truth["exported_gz_bytes"] = os.path.getsize(gz)
    if os.path.getsize(gz) > LIMIT_BYTES:
        subprocess.run([sys.executable, TRIM, gz, gz, "--window", "0", "1e30"], check=True)
        truth["compacted"] = ("scripts/trim_trace.py TRACE TRACE --window 0 1e30: every event kept; flow arrows and "
                              "the args Concrete Inputs, Input Strides, Ev Idx, Record function id dropped")
    truth["trace"] = f"{name}.json.gz"
    truth["trace_gz_bytes"] = os.path.getsize(gz)
    truth["in_trace"] = count_marker_events(gz)
    truth["made_by"] = "scripts/make_gpu_fixtures.py"
    truth["torch"] = torch.__version__
    import transformers
    truth["transformers"] = transformers.__version__
    if torch.cuda.is_available():
        truth["gpu"] = torch.cuda.get_device_name()
    write_truth(out_dir, name, truth)
    print(f"{name}: {truth['trace_gz_bytes'] / 1e3:.0f} kB gz; steps {truth.get('steps')}", flush=True)
    return truth["trace_gz_bytes"]


def write_truth(out_dir: str, name: str, truth: dict) -> None:
    with open(os.path.join(out_dir, f"{name}.truth.json"), "w") as f:
        json.dump(truth, f, indent=2)


def load_events(path: str) -> list:
    with gzip.open(path, "rt") as f:
        return json.load(f)["traceEvents"]


def count_marker_events(path: str) -> dict:
    """Step annotations and graph launches actually present in the written trace."""
    events = load_events(path)
    marks = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("ph") == "X"]
    graphs = [e for e in events if e.get("cat") == "cuda_runtime" and "GraphLaunch" in str(e.get("name", ""))]
    return {"profiler_step_events": len(marks), "cuda_graph_launches": len(graphs),
            "gpu_kernels": sum(e.get("cat") == "kernel" for e in events), "events": len(events)}


def fit(out_dir: str, name: str, capture, knobs: list, knob_name: str) -> None:
    """Capture with the first knob value whose trace fits the size limit (fewer steps or layers each try)."""
    for i, knob in enumerate(knobs):
        prof, truth = capture(knob)
        truth[knob_name] = knob
        if i:
            truth["size_fit"] = f"{knob_name} reduced from {knobs[0]} to {knob} to keep the gzipped trace under " \
                                f"{LIMIT_BYTES // 1000} kB"
        if save(prof, out_dir, name, truth) <= LIMIT_BYTES or i == len(knobs) - 1:
            return


def phase_counts(summary: dict) -> dict:
    return {phase: p["count"] for phase, p in summary["phases"].items()}


def greedy_kwargs(new_tokens: int) -> dict:
    return dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0,
                disable_compile=True)


# 1 ------------------------------------------------------------------------------------------------------------
def hf_compile_generate(out_dir: str, device: str, layers: int) -> None:
    batch = 2
    model = tiny_llama(layers, device)
    n_layers = layers_per_forward(model, device)
    log = attach_log(model)
    torch._dynamo.config.cache_size_limit = 64
    model.forward = torch.compile(model.forward)  # Inductor, default mode; the hooks stay outside the compiled code
    ids = prompt(batch, device)
    mask = torch.ones_like(ids)
    t0 = time.time()
    with torch.no_grad():
        for _ in range(2):  # compiles the prefill graph and the decode graphs (static, then dynamic KV length)
            model.generate(input_ids=ids, attention_mask=mask, **greedy_kwargs(8))
    sync(device)
    print(f"hf_compile_generate: warm-up generates (compilation) {time.time() - t0:.1f} s", flush=True)

    def capture(new_tokens: int):
        log.forwards.clear()
        log.on = True
        with torch.no_grad(), profile(activities=activities(device), record_shapes=True) as prof:
            out = model.generate(input_ids=ids, attention_mask=mask, **greedy_kwargs(new_tokens))
            sync(device)
        log.on = False
        s = log.summary()
        return prof, {
            "name": "hf_compile_generate", "workload": "inference",
            "what": "torch.compile (Inductor, default mode) on model.forward; one greedy HF generate after two "
                    "warm-up generates (compilation not in the trace); DynamicCache; no step markers",
            "steps": phase_counts(s), "forwards": s["forwards"], "phases": s["phases"], "batch": batch,
            "prompt_tokens": PROMPT, "generated_tokens": int(out.shape[1] - ids.shape[1]), "layers": n_layers,
            "steps_delimited_by": "nothing: no annotations, no CUDA graphs; one model forward per step (steps must "
                                  "come from the kernel sequence); Inductor numbers its fused kernels by graph "
                                  "position",
            "each_forward": s["each"]}

    fit(out_dir, "hf_compile_generate", capture, [8, 6, 4], "max_new_tokens")


# 2 ------------------------------------------------------------------------------------------------------------
class StaticDecoder:
    """One decode forward over a StaticCache with every input in a fixed buffer, so it can be captured."""

    def __init__(self, model, batch: int, max_len: int, device: str, ids: torch.Tensor | None = None):
        from transformers import StaticCache

        self.model = model
        self.cache = StaticCache(config=model.config, max_cache_len=max_len)
        ids = prompt(batch, device) if ids is None else ids
        with torch.no_grad():
            logits = model(input_ids=ids, past_key_values=self.cache, use_cache=True,
                           cache_position=torch.arange(PROMPT, device=device)).logits
        self.first_token = logits[:, -1].argmax(-1)
        self.ids = self.first_token[:, None].clone()
        self.pos = torch.full((1,), PROMPT, dtype=torch.long, device=device)  # cache_position
        self.pos_ids = torch.full((batch, 1), PROMPT, dtype=torch.long, device=device)
        self.mask = torch.zeros(batch, 1, 1, max_len, dtype=torch.bool, device=device)
        self.mask[..., : PROMPT + 1] = True
        self.prompt_ids = ids

    def forward(self) -> torch.Tensor:
        with torch.no_grad():
            logits = self.model(input_ids=self.ids, position_ids=self.pos_ids, cache_position=self.pos,
                                attention_mask=self.mask, past_key_values=self.cache, use_cache=True).logits
        return logits[:, -1].argmax(-1)

    def kv_counters(self) -> list:
        """transformers 5's StaticLayer writes at its own device-side counter (cumulative_length), not at
        cache_position: forwards run for warm-up advance it, so it is saved and put back around them."""
        return [layer.cumulative_length.clone() for layer in self.cache.layers]

    def restore_kv_counters(self, saved: list) -> None:
        for layer, value in zip(self.cache.layers, saved, strict=True):
            layer.cumulative_length.copy_(value)

    def advance(self, next_token: torch.Tensor) -> None:
        """In place, on the device: the next step's token, position and attention mask."""
        self.ids.copy_(next_token[:, None])
        self.pos.add_(1)
        self.pos_ids.add_(1)
        self.mask.index_fill_(-1, self.pos, True)


def hf_cudagraph_decode(out_dir: str, device: str, layers: int) -> None:
    batch, steps = 2, 6
    model = tiny_llama(layers, device)
    n_layers = layers_per_forward(model, device)
    dec = StaticDecoder(model, batch, PROMPT + steps + 8, device)
    saved = dec.kv_counters()
    if device != "cuda":  # CPU smoke test: warm-up forwards, counters put back, the loop against HF generate
        for _ in range(3):
            dec.forward()
        dec.restore_kv_counters(saved)
        check_against_generate(model, dec, static_loop(dec, steps), steps)
        return
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the graph (writes slot PROMPT, rewritten by the first replay)
        for _ in range(3):
            dec.forward()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        next_token = dec.forward()
    dec.restore_kv_counters(saved)  # capture does not run the forward; the warm-up did
    torch.cuda.synchronize()

    def capture(n: int):
        replays, tokens = 0, []
        with profile(activities=activities(device), record_shapes=True) as prof:
            for _ in range(n):
                graph.replay()
                replays += 1
                tokens.append(next_token.clone())
                dec.advance(next_token)
            torch.cuda.synchronize()
        return prof, {
            "name": "hf_cudagraph_decode", "workload": "inference",
            "what": "StaticCache; one decode forward + argmax captured with torch.cuda.graph and replayed once per "
                    "step; the inputs (token, cache_position, position_ids, 4D bool mask) are updated in place by "
                    "small eager kernels between replays; the prefill ran before profiling",
            "steps": {"decode": replays}, "forwards": replays,
            "phases": {"decode": {"count": replays, "batch": [batch], "tokens_per_forward": [batch]}},
            "batch": batch, "layers": n_layers,
            "steps_delimited_by": "one cudaGraphLaunch per decode step (graph.replay); no annotations",
            "graph_tokens_match_eager_static_loop": same_tokens(tokens, eager_static_tokens(model, dec, n, device)),
            "graph_tokens_match_hf_generate": check_against_generate(model, dec, tokens, n)}

    fit(out_dir, "hf_cudagraph_decode", capture, [steps], "replays")


def eager_static_tokens(model, dec: StaticDecoder, steps: int, device: str) -> list:
    """The same static-buffer decode loop run eagerly (no graph) from the same prompt: the graph's reference."""
    return static_loop(StaticDecoder(model, dec.ids.shape[0], dec.mask.shape[-1], device, ids=dec.prompt_ids), steps)


def static_loop(dec: StaticDecoder, steps: int) -> list:
    tokens = []
    for _ in range(steps):
        nxt = dec.forward()
        tokens.append(nxt)
        dec.advance(nxt)
    return tokens


def same_tokens(a: list, b: list) -> bool:
    same = len(a) == len(b) and all(torch.equal(x.cpu(), y.cpu()) for x, y in zip(a, b, strict=True))
    print(f"CUDA-graph replay vs eager static loop greedy tokens: {'same' if same else 'DIFFERENT'}", flush=True)
    return same


def check_against_generate(model, dec: StaticDecoder, tokens: list, steps: int) -> bool:
    """HF's own greedy tokens from the same prompt (the prefill's token, then `steps` more); in bf16 on the GPU
    its masked-vs-causal attention may round differently and flip a near-tie argmax, so this is information."""
    with torch.no_grad():
        ref = model.generate(input_ids=dec.prompt_ids, attention_mask=torch.ones_like(dec.prompt_ids),
                             **greedy_kwargs(steps + 1))[:, PROMPT:]
    ours = torch.cat([dec.first_token[:, None]] + [t[:, None] for t in tokens], dim=1)
    same = bool(torch.equal(ref.cpu(), ours.cpu()))
    print(f"static decode loop vs HF generate greedy tokens: {'same' if same else 'DIFFERENT'}", flush=True)
    return same


# 3 ------------------------------------------------------------------------------------------------------------
def train_steps(out_dir: str, device: str, layers: int) -> None:
    batch, seq = 2, 64
    wait, warmup, active = 1, 1, 3

    def capture(n_layers_wanted: int):
        model = tiny_llama(n_layers_wanted, device).train()
        n_layers = layers_per_forward(model, device)
        log = attach_log(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        data = torch.randint(0, VOCAB, (batch, seq), device=device)
        recorded, forwards = [], 0
        with profile(activities=activities(device), record_shapes=True,
                     schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1)) as prof:
            for it in range(wait + warmup + active):
                action = prof.current_action
                log.forwards.clear()
                log.on = True
                loss = model(input_ids=data, labels=data).loss
                log.on = False
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                if action in (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE):
                    recorded.append(it)
                    forwards += len(log.forwards)
                prof.step()
            sync(device)
        return prof, {
            "name": "train_steps", "workload": "training",
            "what": "training loop: forward with labels (cross-entropy loss), loss.backward(), AdamW step, "
                    "zero_grad; profiler schedule(wait=1, warmup=1, active=3) and prof.step() per iteration",
            "steps": {"training": len(recorded), "decode": 0, "prefill": 0}, "forwards": forwards,
            "backward_passes": len(recorded), "optimizer_steps": len(recorded),
            "profiler_step_numbers": recorded, "batch": batch, "tokens_per_forward": batch * seq,
            "layers": n_layers,
            "steps_delimited_by": "ProfilerStep#N annotations (CPU and GPU side), one per training iteration"}

    fit(out_dir, "train_steps", capture, [min(layers, 4), min(layers, 3), min(layers, 2)], "model_layers")


# 4 and 5 -------------------------------------------------------------------------------------------------------
class EagerDecoder:
    """Batch-1 eager decode with a DynamicCache; the prefill runs at construction (outside any profiler)."""

    def __init__(self, model, device: str):
        from transformers import DynamicCache

        self.model = model
        self.cache = DynamicCache(config=model.config)
        with torch.no_grad():
            logits = model(input_ids=prompt(1, device), past_key_values=self.cache, use_cache=True).logits
        self.ids = logits[:, -1:].argmax(-1)

    def forward(self) -> torch.Tensor:
        with torch.no_grad():
            return self.model(input_ids=self.ids, past_key_values=self.cache, use_cache=True).logits

    def sample(self, logits: torch.Tensor) -> None:
        self.ids = logits[:, -1:].argmax(-1)  # stays on the device: no host sync between steps

    def step(self) -> None:
        self.sample(self.forward())


def eager_hostbound_nomarkers(out_dir: str, device: str, layers: int, steps: int) -> None:
    model = tiny_llama(layers, device)
    n_layers = layers_per_forward(model, device)
    stall_layer = n_layers // 2
    stalls = []
    log = attach_log(model)

    def stall(module, args, output):
        if log.on:  # the host waits for the GPU, then sleeps: an idle GPU gap in the middle of the step
            sync(device)
            time.sleep(0.002)
            stalls.append(1)

    model.model.layers[stall_layer].register_forward_hook(stall)
    dec = EagerDecoder(model, device)
    dec.step()  # one unprofiled decode step warms up the decode kernels
    sync(device)

    def capture(n: int):
        log.forwards.clear()
        stalls.clear()
        log.on = True
        with profile(activities=activities(device), record_shapes=True) as prof:
            for _ in range(n):
                dec.step()
            sync(device)
        log.on = False
        s = log.summary()
        return prof, {
            "name": "eager_hostbound_nomarkers", "workload": "inference",
            "what": f"eager HF decode loop, batch 1, DynamicCache, model(...) called {n} times; a forward hook on "
                    f"decoder layer {stall_layer} (0-based) calls torch.cuda.synchronize() then time.sleep(0.002) in "
                    "every step; the prefill and one decode step ran before profiling",
            "steps": phase_counts(s), "forwards": s["forwards"], "phases": s["phases"], "batch": 1,
            "layers": n_layers,
            "host_stall": {"after_layer": stall_layer, "sleep_s": 0.002, "synchronize": True,
                           "stalls_in_trace": len(stalls)},
            "steps_delimited_by": "nothing: no annotations, no CUDA graphs; the largest GPU idle gap of each step "
                                  f"is inside it (after layer {stall_layer}), not between steps",
            "each_forward": s["each"]}

    fit(out_dir, "eager_hostbound_nomarkers", capture, list(range(steps, 3, -1)), "decode_calls")
    path = os.path.join(out_dir, "eager_hostbound_nomarkers")
    with open(path + ".truth.json") as f:
        truth = json.load(f)
    truth["idle_gaps"] = idle_gaps_per_forward(path + ".json.gz")
    write_truth(out_dir, "eager_hostbound_nomarkers", truth)
    print(f"eager_hostbound_nomarkers: largest gap inside each step: {truth['idle_gaps']['largest_gap_inside']}")


def idle_gaps_per_forward(path: str) -> dict:
    """For each forward (from one CPU-side aten::embedding to the next; the kernels launched in between), the
    largest GPU idle gap inside it and the gap before its first kernel (the gap between steps)."""
    events = load_events(path)
    starts = sorted(e["ts"] for e in events if e.get("cat") == "cpu_op" and e.get("name") == "aten::embedding")
    launch_ts = {e["args"]["correlation"]: e["ts"] for e in events
                 if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    gpu = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")), key=lambda e: e["ts"])
    gap_before, prev_end = [], None
    for e in gpu:
        gap_before.append(0.0 if prev_end is None else max(e["ts"] - prev_end, 0.0))
        prev_end = e["ts"] + e["dur"] if prev_end is None else max(prev_end, e["ts"] + e["dur"])
    rows = []
    for i, t0 in enumerate(starts):
        t1 = starts[i + 1] if i + 1 < len(starts) else float("inf")
        mine = [j for j, e in enumerate(gpu) if t0 <= launch_ts.get(e["args"].get("correlation"), -1) < t1]
        if not mine:
            continue
        inner = max(mine[1:], key=lambda j: gap_before[j])
        rows.append({"gpu_activities": len(mine), "gap_before_first_us": round(gap_before[mine[0]], 1),
                     "largest_inner_gap_us": round(gap_before[inner], 1),
                     "largest_inner_gap_at_activity": inner - mine[0]})
    inside = all(r["largest_inner_gap_us"] > r["gap_before_first_us"] for r in rows[1:])
    return {"forwards_found_by_aten_embedding": len(starts), "per_forward": rows,
            "largest_gap_inside": inside}


def gpu_step_annotation_cut(out_dir: str, device: str, layers: int, steps: int) -> None:
    wait, warmup = 1, 1
    nested_step = wait + warmup + steps // 2  # an interior profiled step

    def capture(n_layers_wanted: int):
        model = tiny_llama(n_layers_wanted, device)
        n_layers = layers_per_forward(model, device)
        log = attach_log(model)
        dec = EagerDecoder(model, device)
        recorded = []
        with profile(activities=activities(device), record_shapes=True,
                     schedule=schedule(wait=wait, warmup=warmup, active=steps, repeat=1)) as prof:
            for it in range(wait + warmup + steps):
                log.on = prof.current_action in (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)
                if log.on:
                    recorded.append(it)
                with record_function("model_forward") if it == nested_step else nullcontext():
                    logits = dec.forward()
                dec.sample(logits)
                log.on = False
                prof.step()
            sync(device)
        s = log.summary()
        return prof, {
            "name": "gpu_step_annotation_cut", "workload": "inference",
            "what": f"eager HF decode loop, batch 1, DynamicCache, schedule(wait=1, warmup=1, active={steps}) + "
                    f"prof.step(); in ProfilerStep#{nested_step} alone the model forward runs inside "
                    "record_function('model_forward'), the argmax after it does not; the prefill ran before profiling",
            "steps": phase_counts(s), "forwards": s["forwards"], "phases": s["phases"], "batch": 1,
            "layers": n_layers, "profiler_step_numbers": recorded, "step_with_nested_annotation": nested_step,
            "steps_delimited_by": "ProfilerStep#N annotations: the CPU side spans each whole step; for the GPU side "
                                  "see gpu_side_annotation (measured in the written trace)",
            "each_forward": s["each"]}

    fit(out_dir, "gpu_step_annotation_cut", capture, [layers, layers * 3 // 4, layers // 2], "model_layers")
    path = os.path.join(out_dir, "gpu_step_annotation_cut")
    with open(path + ".truth.json") as f:
        truth = json.load(f)
    truth["gpu_side_annotation"] = gpu_annotation_coverage(path + ".json.gz")
    write_truth(out_dir, "gpu_step_annotation_cut", truth)
    cut = truth["gpu_side_annotation"]["steps_whose_gpu_annotation_is_cut_short"]
    print(f"gpu_step_annotation_cut: steps whose GPU-side annotation is cut short: {cut}", flush=True)


def gpu_annotation_coverage(path: str) -> dict:
    """Per ProfilerStep: GPU activities launched inside its CPU range, and how many of them lie inside the span of
    its GPU-side annotation."""
    events = load_events(path)
    cpu = {e["name"]: e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")}
    gpu = {e["name"]: e for e in events
           if e.get("cat") == "gpu_user_annotation" and e["name"].startswith("ProfilerStep#")}
    launch_ts = {e["args"]["correlation"]: e["ts"] for e in events
                 if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    activities_ = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    rows = {}
    for step, c in sorted(cpu.items()):
        mine = [k for k in activities_
                if c["ts"] <= launch_ts.get(k.get("args", {}).get("correlation"), -1) < c["ts"] + c["dur"]]
        g = gpu.get(step)
        inside = [k for k in mine if g and g["ts"] <= k["ts"] < g["ts"] + g["dur"]]
        rows[step] = {"gpu_activities_launched_in_cpu_range": len(mine), "of_them_inside_gpu_annotation": len(inside),
                      "gpu_annotation_us": round(g["dur"], 3) if g else None,
                      "gpu_span_of_launched_us": round(max(k["ts"] + k["dur"] for k in mine)
                                                       - min(k["ts"] for k in mine), 3) if mine else None}
    cut = [s for s, r in rows.items() if r["of_them_inside_gpu_annotation"] < r["gpu_activities_launched_in_cpu_range"]]
    return {"steps": rows, "steps_whose_gpu_annotation_is_cut_short": cut}


MAKERS = ["hf_cudagraph_decode", "train_steps", "eager_hostbound_nomarkers", "gpu_step_annotation_cut",
          "hf_compile_generate"]  # the compiled one last: its compilation takes the longest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--hostbound-steps", type=int, default=8)
    parser.add_argument("--annotated-steps", type=int, default=5)
    parser.add_argument("--only", nargs="*", choices=MAKERS)
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    failed = []
    for name in args.only or MAKERS:
        t0 = time.time()
        try:
            if name == "eager_hostbound_nomarkers":
                eager_hostbound_nomarkers(args.out_dir, args.device, args.layers, args.hostbound_steps)
            elif name == "gpu_step_annotation_cut":
                gpu_step_annotation_cut(args.out_dir, args.device, args.layers, args.annotated_steps)
            else:
                globals()[name](args.out_dir, args.device, args.layers)
        except Exception as exc:  # one failure must not cost the other traces of the same GPU run
            traceback.print_exc()
            failed.append(f"{name}: {type(exc).__name__}: {exc}")
        print(f"{name}: {time.time() - t0:.1f} s", flush=True)
    for line in failed:
        print("FAILED", line, file=sys.stderr)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
