"""Make decodegap's accuracy corpus (issue 20): real torch.profiler (Kineto) traces of HF transformers decode and
training loops, each with a truth file written by this generator (never by decodegap).

Every `<name>.json.gz` has a `<name>.truth.json` beside it. The truth comes from hooks and loop counters:
- a forward pre-hook and a forward hook on the model count its forwards and time them (time.time_ns(), converted to
  the trace's own clock: ns after the trace's top-level `baseTimeNanoseconds`), with batch, tokens per sequence, the
  KV length before the forward (from the cache: prefill when it was empty, decode for 1 token per sequence with a
  cache, extend otherwise), and whether the profiler was recording when the forward began and when it ended (a
  forward that the capture window cuts is `partial_at_edges`, one wholly inside counts in `steps`);
- hooks on the decoder-layer modules count layers per forward (one eager forward); `layer_kinds` groups the layers
  by the classes of their submodules (dense MLP vs MoE block, conv vs attention);
- the loops count training iterations, CUDA-graph replays and profiler steps;
- after export the generator reads the written trace back (raw events, no decodegap) for what only it can tell:
  kernels launched inside each forward's CPU span, the clock alignment, marker counts.

Loops (one function each, `LOOPS`): eager greedy generate; batched generate with left padding and sampling;
torch.compile'd forward (generate or a hand loop, compilation warmed up outside the trace); static cache + CUDA graph
replays; hand-written decode loops (argmax, with or without `.item()`); profiler schedules with prof.step() once per
forward (hand loop, or from a forward hook inside generate) and one ProfilerStep around a whole generate(); training
(forward + backward + AdamW) with ProfilerStep and with no marker; a deep eager stack without markers; windows that
start and stop inside a forward (prof.start()/prof.stop() from a decoder-layer hook); `decodegap record` on an
unmodified script; generate and hand loops without a KV cache (use_cache=False: every forward a prefill of the
sequence so far); training under gradient checkpointing (each layer's forward again inside the backward); generate
over a static cache run eagerly; prompt-lookup speculative decoding (forwards of several candidate tokens on a cache:
extends, between decodes); assisted generation (a small draft model's forwards between the target's verifying ones);
torch.compile(mode="reduce-overhead") over a static cache (an eager prefill, then decodes replayed by Inductor's CUDA
graph trees); transformers' continuous batching (the requests of a forward packed into one row, joining and leaving:
prefill, decode and mixed forwards); plain PyTorch without transformers (a gpt-fast-style model decoded eagerly or
with decode_one_token under torch.compile(mode="reduce-overhead"), and nanoGPT-style compiled training under bf16
autocast); encoder-decoder generate (the encoder's forward folded into the first decoder forward, the prefill);
sampling with num_return_sequences; generate over an offloaded cache; vision-language models in generate (greedy,
sampling, static cache) and in a hand loop (the image's pixel inputs go to the first forward, the prefill, where the
vision tower runs; the decodes run the text stack only); and cut files (a whole trace's JSON text truncated at a byte
offset).

Every trace is rewritten by scripts/trim_trace.py (every event kept except flow arrows and python_function; the args
Concrete Inputs, Input Strides, Ev Idx, Record function id dropped) and gzipped; one over the size limit is captured
again with fewer steps (the truth says so in `size_fit`).

Run on a CUDA machine (torch + transformers 5.x; decodegap importable for the record traces, e.g. PYTHONPATH=src):
    python3 scripts/make_accuracy_corpus.py OUT_DIR --jobs 4          # the whole corpus, 4 processes on one GPU
    python3 scripts/make_accuracy_corpus.py OUT_DIR --only llama_eager_generate qwen3_cudagraph
    python3 scripts/make_accuracy_corpus.py --list
    python3 scripts/make_accuracy_corpus.py OUT_DIR --holdout --jobs 5   # 13 traces the corpus does not hold
    python3 scripts/make_accuracy_corpus.py OUT_DIR --holdout6 --jobs 8  # 13 more on new ground, and 2 cuts of them
    python3 scripts/make_accuracy_corpus.py OUT_DIR --holdout7 --jobs 8  # 12 more in loops never read before
    python3 scripts/make_accuracy_corpus.py OUT_DIR --holdout8 --jobs 8  # 13 more: new loops and families
    python3 scripts/make_accuracy_corpus.py OUT_DIR --holdout9 --jobs 8  # 14 more: plain PyTorch, encoder-decoders, ..
    python3 scripts/make_accuracy_corpus.py OUT_DIR --holdout10 --jobs 8  # 14 more: vision-language models, T5, ..
    python3 scripts/make_accuracy_corpus.py OUT_DIR --holdout11 --jobs 8  # 14 more: Gemma 3n, NLLB-MoE, 4 VLMs, ..
    python3 scripts/make_accuracy_corpus.py OUT_DIR --cuts-of HOLDOUT_DIR   # every trace there cut short, two ways
    python3 scripts/make_accuracy_corpus.py OUT_DIR --cuts-of HOLDOUT_DIR --cut-keep 2,5   # after 2 and 5 forwards
    python3 scripts/make_accuracy_corpus.py --table tests/fixtures/traces/corpus   # the README's table rows
Smoke-test the logic on a CPU (CPU activity only, tiny sizes; CUDA-graph loops run their static loop eagerly):
    python3 scripts/make_accuracy_corpus.py /tmp/corpus --device cpu --smoke
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field

import torch
from torch.profiler import ProfilerAction, ProfilerActivity, profile, schedule

HERE = os.path.dirname(os.path.abspath(__file__))
TRIM = os.path.join(HERE, "trim_trace.py")
REPO = os.path.dirname(HERE)
VOCAB = 4096
PROMPT = 16
LIMIT_BYTES = 650_000  # one gzipped trace: the size fit aims under this (the brief: ~700 kB)
TOTAL_LIMIT = 25_000_000  # the whole corpus folder
RECORDING = (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)
SMOKE = False  # --smoke: tiny sizes for the CPU check


# models --------------------------------------------------------------------------------------------------------
DENSE = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=VOCAB, max_position_embeddings=512)
SMALL = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=VOCAB, max_position_embeddings=512)

# family -> (config class, config kwargs, what it is, notes); layers are set per trace
FAMILIES: dict[str, tuple[str, dict, str]] = {
    "llama": ("LlamaConfig", dict(DENSE), "dense GQA (Llama)"),
    "qwen2": ("Qwen2Config", dict(DENSE), "dense GQA with q/k/v bias (Qwen2)"),
    "qwen3": ("Qwen3Config", dict(DENSE, head_dim=64), "dense GQA with q/k norms (Qwen3)"),
    "mistral": ("MistralConfig", dict(DENSE, sliding_window=None), "dense GQA (Mistral)"),
    "phi3": ("Phi3Config", dict(DENSE, pad_token_id=0), "dense, fused qkv and gate_up projections (Phi-3)"),
    "gpt2": ("GPT2Config", dict(n_embd=256, n_head=4, n_positions=512, vocab_size=VOCAB),
             "GPT-2: learned positions, Conv1D projections, LayerNorm, GELU MLP"),
    "gpt_neox": ("GPTNeoXConfig", dict(hidden_size=256, intermediate_size=512, num_attention_heads=4,
                                       vocab_size=VOCAB, max_position_embeddings=512),
                 "GPT-NeoX: parallel attention + MLP, fused qkv, LayerNorm"),
    "mixtral": ("MixtralConfig", dict(SMALL, num_local_experts=8, num_experts_per_tok=2),
                "eager MoE, 8 experts top-2, a loop over the experts that got tokens (Mixtral)"),
    "qwen2_moe": ("Qwen2MoeConfig", dict(SMALL, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=128,
                                         shared_expert_intermediate_size=256),
                  "eager MoE with a gated shared expert (Qwen2-MoE)"),
    "qwen3_moe": ("Qwen3MoeConfig", dict(SMALL, head_dim=32, num_experts=8, num_experts_per_tok=2,
                                         moe_intermediate_size=128),
                  "eager MoE, 8 experts top-2 (Qwen3-MoE)"),
    "olmoe": ("OlmoeConfig", dict(SMALL, num_experts=8, num_experts_per_tok=2), "eager MoE (OLMoE)"),
    "deepseek_v3": ("DeepseekV3Config", dict(hidden_size=128, intermediate_size=256, moe_intermediate_size=128,
                                             num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8,
                                             n_shared_experts=1, num_experts_per_tok=2, n_group=1, topk_group=1,
                                             first_k_dense_replace=1, kv_lora_rank=64, q_lora_rank=96,
                                             qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32,
                                             vocab_size=VOCAB, max_position_embeddings=512),
                    "MLA attention; first_k_dense_replace dense layers, then eager MoE layers (DeepSeek-V3)"),
    "gemma2": ("Gemma2Config", dict(DENSE, head_dim=64, sliding_window=8),
               "alternating sliding (window 8) / full attention, logit soft-capping (Gemma 2)"),
    "gemma3": ("Gemma3TextConfig", dict(DENSE, head_dim=64, sliding_window=8),
               "5 sliding (window 8) : 1 full attention, q/k norms (Gemma 3 text)"),
    "gpt_oss": ("GptOssConfig", dict(hidden_size=128, intermediate_size=128, num_attention_heads=4,
                                     num_key_value_heads=2, head_dim=32, num_local_experts=8, num_experts_per_tok=2,
                                     sliding_window=8, vocab_size=VOCAB, max_position_embeddings=512),
                "alternating sliding/full attention with sinks (eager attention) + eager MoE (GPT-OSS)"),
    "lfm2": ("Lfm2Config", dict(hidden_size=256, intermediate_size=512, num_attention_heads=4,
                                num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=512),
             "hybrid: short-convolution layers and attention layers (LFM2): unlike layers"),
    "qwen3_next": ("Qwen3NextConfig", dict(SMALL, head_dim=32, num_experts=8, num_experts_per_tok=2,
                                           moe_intermediate_size=64, shared_expert_intermediate_size=64,
                                           linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=32,
                                           linear_value_head_dim=32),
                   "hybrid: gated-delta-net linear attention (torch fallback) 3 : 1 full attention, eager MoE "
                   "(Qwen3-Next): unlike layers"),
    "jamba": ("JambaConfig", dict(SMALL, num_experts=4, num_experts_per_tok=2, attn_layer_period=4,
                                  attn_layer_offset=2, expert_layer_period=2, expert_layer_offset=1, mamba_d_state=8,
                                  mamba_dt_rank=8, use_mamba_kernels=False),
              "hybrid: Mamba mixers (torch path) with attention every 4th layer, eager MoE every 2nd (Jamba): three "
              "kinds of layer"),
    "glm4_moe": ("Glm4MoeConfig", dict(SMALL, head_dim=32, n_routed_experts=8, num_experts_per_tok=2,
                                       moe_intermediate_size=128, first_k_dense_replace=1, n_group=1, topk_group=1),
                 "first_k_dense_replace dense layer, then eager MoE with a shared expert, GQA attention (GLM-4.5)"),
    "starcoder2": ("Starcoder2Config", dict(DENSE), "LayerNorm, biases, GELU MLP (StarCoder2)"),
    "granite": ("GraniteConfig", dict(DENSE), "Llama layout with embedding/residual/logit multipliers (Granite)"),
    "olmo2": ("Olmo2Config", dict(DENSE), "post-attention / post-MLP norms, q/k norms (OLMo 2)"),
    "phimoe": ("PhimoeConfig", dict(SMALL, num_local_experts=8, num_experts_per_tok=2),
               "eager MoE with sparsemixer routing, LayerNorm (Phi-3.5-MoE)"),
}
M2 = dict(mamba_n_heads=8, mamba_d_head=32, mamba_n_groups=1, mamba_d_state=16, mamba_chunk_size=64, mamba_d_conv=4,
          mamba_expand=2)  # Mamba-2 mixers (torch path)
# The second holdout's families (`--holdout2`): none of them is in the corpus or the first holdout.
FAMILIES.update({
    "granitemoe": ("GraniteMoeConfig", dict(SMALL, num_local_experts=8, num_experts_per_tok=2),
                   "MoE on grouped GEMMs (torch._grouped_mm: a fixed kernel count per layer), Granite multipliers"),
    "granitemoehybrid": ("GraniteMoeHybridConfig", dict(SMALL, num_local_experts=8, num_experts_per_tok=2,
                                                         shared_intermediate_size=256, **M2),
                         "hybrid: Mamba-2 mixers with attention every 4th layer, grouped-GEMM MoE and a shared MLP "
                         "in every layer (Granite 4)"),
    "bamba": ("BambaConfig", dict(SMALL, **M2, use_mamba_kernels=False),
              "hybrid: Mamba-2 mixers (torch path), attention every 4th layer, dense MLP (Bamba)"),
    "falcon_h1": ("FalconH1Config", dict(SMALL, head_dim=32, **M2, mamba_d_ssm=256),
                  "hybrid in every layer: attention and a Mamba-2 mixer side by side, then the MLP (Falcon-H1)"),
    "deepseek_v2": ("DeepseekV2Config", dict(hidden_size=128, intermediate_size=256, moe_intermediate_size=128,
                                             num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8,
                                             n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=2,
                                             kv_lora_rank=64, q_lora_rank=96, qk_rope_head_dim=16,
                                             qk_nope_head_dim=32, v_head_dim=32, vocab_size=VOCAB,
                                             max_position_embeddings=512),
                    "MLA attention; 2 dense layers, then eager MoE layers with a shared expert (DeepSeek-V2)"),
    "cohere2": ("Cohere2Config", dict(DENSE, head_dim=64, sliding_window=8),
                "parallel attention + MLP from one LayerNorm, 3 sliding : 1 full attention (Command R7B)"),
    "smollm3": ("SmolLM3Config", dict(DENSE, pad_token_id=0), "dense GQA, no rotary embedding in every 4th layer "
                                                                "(SmolLM3)"),
    "ernie4_5_moe": ("Ernie4_5_MoeConfig", dict(SMALL, moe_num_experts=8, moe_k=2, moe_intermediate_size=128,
                                                moe_layer_start_index=1, moe_num_shared_experts=1),
                     "a dense first layer, then eager MoE with a shared expert (ERNIE 4.5 MoE)"),
    "minimax": ("MiniMaxConfig", dict(SMALL, head_dim=32, num_local_experts=8, num_experts_per_tok=2),
                "hybrid: lightning (linear) attention 3 : 1 softmax attention, eager MoE (MiniMax-01)"),
    "exaone4": ("Exaone4Config", dict(DENSE, sliding_window=8, sliding_window_pattern=4),
                "post-norm layers, 3 sliding : 1 full attention (EXAONE 4)"),
    "nemotron_h": ("NemotronHConfig", dict(hidden_size=128, intermediate_size=256, num_attention_heads=4,
                                           num_key_value_heads=2, head_dim=32, mamba_num_heads=8, mamba_head_dim=16,
                                           n_groups=1, ssm_state_size=16, chunk_size=64, vocab_size=VOCAB),
                   "hybrid of single-mixer blocks: Mamba-2, MLP-only and attention blocks each a layer (Nemotron-H)"),
    "zamba2": ("Zamba2Config", dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=4, mamba_d_state=16,
                                    n_mamba_heads=8, mamba_headdim=32, intermediate_size=256, vocab_size=VOCAB,
                                    max_position_embeddings=512, use_mem_rope=False),
               "hybrid: Mamba-2 layers, every 3rd also runs a shared attention + MLP block (Zamba2)"),
    "mamba2": ("Mamba2Config", dict(hidden_size=128, num_heads=8, head_dim=32, n_groups=1, state_size=16,
                                    chunk_size=64, vocab_size=VOCAB),
               "attention-free: Mamba-2 layers only (torch path)"),
    "recurrent_gemma": ("RecurrentGemmaConfig", dict(hidden_size=128, intermediate_size=256, num_attention_heads=4,
                                                     num_key_value_heads=1, lru_width=128, attention_window_size=16,
                                                     vocab_size=VOCAB),
                        "Griffin: two RG-LRU recurrent blocks : one local attention block (RecurrentGemma)"),
    "jetmoe": ("JetMoeConfig", dict(hidden_size=128, num_local_experts=4, num_experts_per_tok=2, kv_channels=32,
                                    intermediate_size=256, num_key_value_heads=4, vocab_size=VOCAB),
               "mixture of attention heads and of MLP experts (JetMoE)"),
    "qwen3_5_moe": ("Qwen3_5MoeTextConfig", dict(SMALL, head_dim=32, num_experts=8, num_experts_per_tok=2,
                                                 moe_intermediate_size=64, shared_expert_intermediate_size=64,
                                                 linear_num_value_heads=4, linear_num_key_heads=2,
                                                 linear_key_head_dim=32, linear_value_head_dim=32),
                    "hybrid: gated-delta-net 3 : 1 full attention, grouped-GEMM MoE (Qwen3.5-MoE)"),
    "olmo3": ("Olmo3Config", dict(DENSE, sliding_window=8), "3 sliding : 1 full attention, post-norms (OLMo 3)"),
    "dots1": ("Dots1Config", dict(SMALL, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=128,
                                  first_k_dense_replace=1, n_shared_experts=1),
              "a dense first layer, then grouped-GEMM MoE with a shared expert (dots.llm1)"),
    "hunyuan_moe": ("HunYuanMoEV1Config", dict(SMALL, head_dim=32, num_experts=8, moe_topk=2,
                                               moe_intermediate_size=128),
                    "eager MoE in every layer (Hunyuan-A13B)"),
    "lfm2_moe": ("Lfm2MoeConfig", dict(SMALL, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64,
                                       num_dense_layers=2),
                 "hybrid: conv and attention layers in turn, 2 dense then grouped-GEMM MoE (LFM2-MoE)"),
})
# The third holdout's families (`--holdout3`): older and other dense designs none of the above has.
FAMILIES.update({
    "phi": ("PhiConfig", dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, vocab_size=VOCAB,
                              max_position_embeddings=512, partial_rotary_factor=0.5),
            "parallel attention + MLP from one LayerNorm, partial rotary, GELU (Phi-2)"),
    "stablelm": ("StableLmConfig", dict(DENSE, partial_rotary_factor=0.25), "LayerNorm, a quarter rotary (StableLM 2)"),
    "falcon": ("FalconConfig", dict(hidden_size=256, num_attention_heads=4, vocab_size=VOCAB, multi_query=True,
                                    parallel_attn=True, new_decoder_architecture=False),
               "multi-query attention in parallel with the MLP, fused qkv (Falcon-7B)"),
    "bloom": ("BloomConfig", dict(hidden_size=256, n_head=4, vocab_size=VOCAB),
              "ALiBi position biases, eager attention, an embedding LayerNorm (BLOOM)"),
    "opt": ("OPTConfig", dict(hidden_size=256, ffn_dim=512, num_attention_heads=4, vocab_size=VOCAB,
                              max_position_embeddings=512, word_embed_proj_dim=256),
            "learned positions, ReLU MLP, biases (OPT)"),
    "gptj": ("GPTJConfig", dict(n_embd=256, n_head=4, rotary_dim=32, vocab_size=VOCAB, n_positions=512),
             "parallel attention + MLP, interleaved partial rotary, eager attention (GPT-J)"),
    "gpt_bigcode": ("GPTBigCodeConfig", dict(n_embd=256, n_head=4, vocab_size=VOCAB, n_positions=512,
                                             multi_query=True),
                    "multi-query attention, learned positions (StarCoder 1 / SantaCoder)"),
    "gemma": ("GemmaConfig", dict(DENSE, head_dim=64), "GeGLU MLP, scaled embeddings (Gemma 1)"),
    "glm4": ("Glm4Config", dict(DENSE, head_dim=64, pad_token_id=0), "post-attention and post-MLP norms, fused "
                                                                       "gate_up (GLM-4-0414)"),
    "olmo": ("OlmoConfig", dict(DENSE), "non-parametric LayerNorm (OLMo 1)"),
    "mpt": ("MptConfig", dict(d_model=256, n_heads=4, vocab_size=VOCAB, max_seq_len=512),
            "ALiBi, no biases, blocks named `blocks`, eager attention (MPT)"),
    "codegen": ("CodeGenConfig", dict(n_embd=256, n_head=4, rotary_dim=32, vocab_size=VOCAB, n_positions=512),
                "fused qkv with an interleaved head layout, parallel attention + MLP, eager attention (CodeGen)"),
    "nemotron": ("NemotronConfig", dict(DENSE, head_dim=64), "squared-ReLU MLP without gate, LayerNorm1P "
                                                              "(Nemotron-4)"),
    "persimmon": ("PersimmonConfig", dict(hidden_size=256, intermediate_size=512, num_attention_heads=4,
                                          vocab_size=VOCAB, max_position_embeddings=512),
                  "q/k LayerNorms, squared-ReLU MLP, partial rotary (Persimmon)"),
    "xglm": ("XGLMConfig", dict(d_model=256, ffn_dim=512, attention_heads=4, vocab_size=VOCAB,
                                max_position_embeddings=512),
             "sinusoidal positions, GELU, eager attention (XGLM)"),
})
# The fifth holdout's families (`--holdout5`): designs no earlier set has, and two variants of ones it has.
FAMILIES.update({
    "mistral_sw": ("MistralConfig", dict(DENSE, sliding_window=8),
                   "dense GQA with a sliding window (8) in every layer (Mistral 7B v0.1)"),
    "bamba_attn0": ("BambaConfig", dict(SMALL, **M2, use_mamba_kernels=False),
                    "hybrid: Mamba-2 mixers (torch path), attention at layer 0 and every 4th after it, dense MLP "
                    "(Bamba with the attention layer first)"),
    "cohere": ("CohereConfig", dict(DENSE, pad_token_id=0, bos_token_id=1, eos_token_id=2),
               "parallel attention + MLP from one LayerNorm, logit scale, no sliding window (Command R)"),
    "gemma4": ("Gemma4TextConfig", dict(DENSE, head_dim=64, global_head_dim=64, sliding_window=8,
                                        vocab_size_per_layer_input=VOCAB, hidden_size_per_layer_input=32),
               "5 sliding (window 8) : 1 full attention, the last layer full, per-layer input embeddings added in "
               "every layer (Gemma 4 text)"),
    "afmoe": ("AfmoeConfig", dict(SMALL, head_dim=32, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64,
                                  num_dense_layers=1, sliding_window=8),
              "a dense first layer, then eager MoE with a shared expert; 3 sliding : 1 full attention (Arcee AFMoE)"),
    "falcon_mamba": ("FalconMambaConfig", dict(hidden_size=128, state_size=8, vocab_size=VOCAB, use_mambapy=False),
                     "attention-free: Mamba-1 layers only (selective scan, torch path) (Falcon-Mamba)"),
})
# The sixth holdout's families (`--holdout6`): hybrids of linear attention (KDA, gated delta net) with softmax
# attention, sparse-attention and zero-expert MoE designs, and sliding attention with sinks over MoE; none in any set.
FAMILIES.update({
    "kimi_linear": ("KimiLinearConfig", dict(SMALL, num_key_value_heads=4, moe_intermediate_size=64,
                                             num_local_experts=8, num_experts_per_tok=2, kv_lora_rank=64,
                                             q_lora_rank=None, qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32,
                                             linear_head_dim=32, linear_num_heads=4, first_k_dense_replace=1,
                                             pad_token_id=0, bos_token_id=1, eos_token_id=2),
                    "hybrid: Kimi delta attention (torch fallback) 3 : 1 MLA, a dense first layer, then eager MoE "
                    "with a shared expert (Kimi Linear): three kinds of layer"),
    "olmo_hybrid": ("OlmoHybridConfig", dict(DENSE, pad_token_id=0, eos_token_id=2),
                    "hybrid: gated-delta-net linear attention (torch fallback) 3 : 1 attention with q/k norms, "
                    "post-norms, dense MLP (OLMo Hybrid)"),
    "qwen3_5": ("Qwen3_5TextConfig", dict(DENSE, head_dim=64, linear_num_value_heads=4, linear_num_key_heads=2,
                                          linear_key_head_dim=32, linear_value_head_dim=32),
                "hybrid: gated-delta-net 3 : 1 gated full attention, dense MLP (Qwen3.5 text)"),
    "glm_moe_dsa": ("GlmMoeDsaConfig", dict(hidden_size=128, intermediate_size=256, moe_intermediate_size=128,
                                            num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8,
                                            n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=2,
                                            kv_lora_rank=64, q_lora_rank=96, qk_rope_head_dim=16, qk_nope_head_dim=32,
                                            v_head_dim=32, index_topk=8, index_head_dim=32, index_n_heads=4,
                                            index_topk_freq=2, vocab_size=VOCAB, max_position_embeddings=512),
                    "MLA with DeepSeek sparse attention (an indexer keeps 8 keys; every other layer reuses the "
                    "previous one's top-k), 2 dense layers, then eager MoE with a shared expert (GLM-5)"),
    "longcat_flash": ("LongcatFlashConfig", dict(hidden_size=128, ffn_hidden_size=256, expert_ffn_hidden_size=64,
                                                 num_attention_heads=4, kv_lora_rank=64, q_lora_rank=96,
                                                 qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32, head_dim=16,
                                                 n_routed_experts=8, zero_expert_num=4, moe_topk=2, vocab_size=VOCAB,
                                                 max_position_embeddings=512),
                      "two MLA + MLP sublayers a layer and a shortcut eager MoE with 4 zero-computation (identity) "
                      "experts of 12: the experts run vary by token (LongCat-Flash)"),
    "mimo_v2_flash": ("MiMoV2FlashConfig", dict(SMALL, head_dim=48, v_head_dim=32, moe_intermediate_size=64,
                                                n_routed_experts=8, num_experts_per_tok=2, sliding_window=8),
                      "full attention at layer 0 and every 6th, sliding (window 8) between, with sinks (eager "
                      "attention); a dense first layer, then eager MoE (MiMo-V2-Flash)"),
})
# The eighth holdout's families (`--holdout8`): a Llama 4 text stack (dense and MoE layers in turn, NoPE layers, chunked
# attention), DBRX's own expert loop, a Mamba-1 hybrid with a shared attention block, an attention-free xLSTM, ZAYA's
# convolutional attention with top-1 MoE, per-layer head counts (Laguna), parallel attention + MoE (Command A MoE),
# differential attention, FlexOlmo's MoE, and dense stacks for the new loops (Seed-OSS, ERNIE 4.5, Llama on flex
# attention); none in any set.
FAMILIES.update({
    "llama4": ("Llama4TextConfig", dict(SMALL, head_dim=32, intermediate_size_mlp=256, num_local_experts=4,
                                        num_experts_per_tok=1, interleave_moe_layer_step=2, attention_chunk_size=8,
                                        pad_token_id=0),
               "Llama 4 text: dense and MoE layers in turn (the MoE: a shared expert and 4 routed experts run as one "
               "bmm over all of them), every 4th layer NoPE (no rotary, no q/k norm, full attention), chunked "
               "attention (chunks of 8) in the others: three kinds of layer"),
    "dbrx": ("DbrxConfig", dict(d_model=128, n_heads=4, max_seq_len=512, vocab_size=VOCAB,
                                attn_config=dict(kv_n_heads=2, clip_qkv=8.0, rope_theta=10000.0),
                                ffn_config=dict(ffn_hidden_size=64, moe_num_experts=16, moe_top_k=4)),
             "fine-grained eager MoE (16 experts top-4, DBRX's own Python loop over the experts that got tokens), "
             "fused Wqkv with clipping, LayerNorm, blocks named `blocks` (DBRX)"),
    "zamba": ("ZambaConfig", dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=4,
                                  n_mamba_heads=2, mamba_d_state=8, vocab_size=VOCAB, max_position_embeddings=512,
                                  attn_layer_period=3, attn_layer_offset=2, use_mamba_kernels=False),
              "hybrid: Mamba-1 layers (torch path), every 3rd also runs one shared attention + MLP block on the hidden "
              "state concatenated with the embeddings (Zamba 1)"),
    "xlstm": ("xLSTMConfig", dict(hidden_size=128, num_heads=4, vocab_size=VOCAB, chunk_size=4, mode="train",
                                  use_cache=False),
              "attention-free: mLSTM blocks (matrix-memory LSTM) with gated MLPs, in xLSTM's training mode: "
              "chunkwise-parallel torch kernels over chunks of 4 tokens, no cache (xLSTM 7B)"),
    "zaya": ("ZayaConfig", dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                moe_intermediate_size=128, num_experts=8, router_hidden_size=64, vocab_size=VOCAB,
                                max_position_embeddings=512),
             "compressed convolutional attention (q/k through causal depthwise + grouped convolutions whose states sit "
             "in the cache beside the KV), eager MoE top-1 of 8 with an MLP router fed the previous layer's router "
             "state, residual scaling (ZAYA1)"),
    "laguna": ("LagunaConfig", dict(SMALL, head_dim=32, moe_intermediate_size=64, shared_expert_intermediate_size=64,
                                    num_experts=8, num_experts_per_tok=2, sliding_window=8),
               "per-layer head counts (8 heads in the full-attention layers, 4 in the sliding ones, window 8), "
               "softplus output gates, a dense first layer, then eager MoE with a shared expert (Laguna)"),
    "cohere2_moe": ("Cohere2MoeConfig", dict(SMALL, head_dim=32, num_experts=8, num_experts_per_tok=2, sliding_window=8,
                                             first_k_dense_replace=1, pad_token_id=0, bos_token_id=1, eos_token_id=2),
                    "parallel attention + MoE from one LayerNorm: a dense full-attention first layer, then eager MoE "
                    "layers 3 sliding (window 8) : 1 full (Command A MoE)"),
    "diffllama": ("DiffLlamaConfig", dict(DENSE), "differential attention: two softmax maps a head, one "
                                                    "subtracted from the other with a learned lambda, a per-head "
                                                    "RMSNorm (DiffLlama)"),
    "flex_olmo": ("FlexOlmoConfig", dict(SMALL, num_experts=7, num_experts_per_tok=2, pad_token_id=0, eos_token_id=2),
                  "eager MoE (7 experts top-2) with post-attention / post-MLP norms and q/k norms (FlexOlmo)"),
    "seed_oss": ("SeedOssConfig", dict(DENSE, head_dim=64), "dense GQA with q/k/v biases (Seed-OSS)"),
    "ernie4_5": ("Ernie4_5Config", dict(DENSE, head_dim=64), "dense GQA (ERNIE 4.5 dense)"),
    "llama_flex": ("LlamaConfig", dict(DENSE), "dense GQA (Llama) on attn_implementation='flex_attention': a compiled "
                                               "flex-attention kernel and a block mask built every forward instead of "
                                               "SDPA"),
})
# The ninth holdout's families (`--holdout9`): programs without transformers (a gpt-fast-style dense transformer and
# the same with a hand-written MoE block, in plain PyTorch), encoder-decoders (BART; a distil-whisper-shaped speech
# model), and decoder-only families no set had.
PLAIN_DENSE = dict(dim=256, n_head=4, n_local_heads=2, intermediate_size=512, vocab_size=VOCAB, rope_base=10000.0,
                   norm_eps=1e-5)
FAMILIES.update({
    "gptfast": (None, dict(PLAIN_DENSE),
                "plain PyTorch, no transformers: a gpt-fast-style dense transformer (fused wqkv, its own RMSNorm, "
                "rotary as real pairs, SwiGLU, GQA expanded by repeat_interleave) over a preallocated KV-cache tensor "
                "per layer (index_put_ at input_pos; attention over the whole cache length, masked by a causal-mask "
                "row per position)"),
    "gptfast_moe": (None, dict(PLAIN_DENSE, intermediate_size=256, experts=8, top_k=2),
                    "plain PyTorch: the gpt-fast-style transformer with a hand-written MoE MLP: a softmax router, "
                    "top-2 of 8 renormalised, then an eager loop over all 8 experts, each taking its tokens by "
                    "torch.where (a host sync per expert; an expert with no token is skipped) and adding its output "
                    "by index_add_"),
    "bart": ("BartConfig", dict(vocab_size=VOCAB, d_model=256, encoder_layers=4, encoder_attention_heads=4,
                                decoder_attention_heads=4, encoder_ffn_dim=512, decoder_ffn_dim=512,
                                max_position_embeddings=512),
             "encoder-decoder (BART): a 4-layer bidirectional text encoder run once, decoder layers with self- and "
             "cross-attention (learned positions, LayerNorm, GELU)"),
    "whisper": ("WhisperConfig", dict(vocab_size=VOCAB, num_mel_bins=80, d_model=256, encoder_layers=6,
                                      encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=512,
                                      decoder_ffn_dim=512, max_source_positions=1500, max_target_positions=448,
                                      decoder_start_token_id=1, pad_token_id=0, eos_token_id=2, bos_token_id=1,
                                      suppress_tokens=None, begin_suppress_tokens=None),
                "speech encoder-decoder shaped as distil-whisper: two conv layers and 6 encoder layers over 1500 "
                "audio frames (30 s of 80-bin log-mel features) run once, then a shallow decoder with cross-attention "
                "(Whisper)"),
    "hunyuan_dense": ("HunYuanDenseV1Config", dict(DENSE, head_dim=64),
                      "dense GQA with q/k norms after the rotary embedding (Hunyuan dense v1)"),
    "arcee": ("ArceeConfig", dict(DENSE, bos_token_id=1, eos_token_id=2, pad_token_id=0),
              "dense GQA with a ReLU² MLP and no gate projection (Arcee AFM)"),
    "minimax_m2": ("MiniMaxM2Config", dict(SMALL, head_dim=32, num_local_experts=8, num_experts_per_tok=2,
                                           bos_token_id=1, eos_token_id=2),
                   "eager MoE in every layer, q/k RMSNorms over all heads' width (MiniMax-M2)"),
    "granitemoeshared": ("GraniteMoeSharedConfig", dict(SMALL, num_local_experts=8, num_experts_per_tok=2,
                                                        shared_intermediate_size=256),
                         "grouped-GEMM MoE beside a shared MLP in every layer, Granite multipliers (GraniteMoE "
                         "shared)"),
    "glm4_moe_lite": ("Glm4MoeLiteConfig", dict(hidden_size=128, intermediate_size=256, moe_intermediate_size=128,
                                                num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8,
                                                n_shared_experts=1, num_experts_per_tok=2, kv_lora_rank=64,
                                                q_lora_rank=96, qk_rope_head_dim=16, qk_nope_head_dim=32,
                                                v_head_dim=32, vocab_size=VOCAB, max_position_embeddings=512,
                                                pad_token_id=0),
                      "MLA attention; a dense first layer, then eager MoE with a shared expert (GLM-4.7-Flash)"),
    "doge": ("DogeConfig", dict(DENSE), "dynamic mask attention: a per-head mask made from the values (dt_proj, A) "
                                         "added to the attention scores, learned residual scales, dense MLP (Doge; "
                                         "its cross-domain MoE, is_moe, fails in transformers 5.17's decoder layer)"),
    "bitnet": ("BitNetConfig", dict(DENSE), "BitNet b1.58's layout with unquantized weights: sub-norms before o_proj "
                                            "and down_proj, a gated ReLU² MLP (BitNet)"),
    "exaone_moe": ("ExaoneMoeConfig", dict(SMALL, head_dim=32, num_experts=8, num_experts_per_tok=2,
                                           moe_intermediate_size=64, sliding_window=8, sliding_window_pattern=4),
                   "3 sliding (window 8) : 1 full attention; a dense first layer, then eager MoE with a shared expert "
                   "(EXAONE MoE)"),
})
# The tenth holdout's families (`--holdout10`): vision-language models (a vision tower run in the prefill over an
# image's patches, then the text stack; the decodes run the text stack only), encoder-decoders of the T5 line, and
# decoder-only families no set had. A VLM's entry holds its text, vision and top-level config kwargs (vlm_config);
# the layers set per trace are the text decoder's.
VLM_TEXT = dict(DENSE, bos_token_id=1, eos_token_id=2, pad_token_id=0)
IMAGE_IDS = dict(image_token_id=4001, video_token_id=4002, vision_start_token_id=4003, vision_end_token_id=4004)
FAMILIES.update({
    "qwen2_5_vl": ("Qwen2_5_VLConfig",
                   dict(text=dict(VLM_TEXT, rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                                                             "mrope_section": [8, 12, 12]}),
                        vision=dict(depth=4, hidden_size=128, intermediate_size=256, num_heads=4, out_hidden_size=256,
                                    patch_size=14, window_size=56, fullatt_block_indexes=[1, 3]),
                        top=dict(IMAGE_IDS)),
                   "vision-language (Qwen2.5-VL): a 4-block ViT over 14-px patches (2D rotary, window attention in "
                   "blocks 0 and 2, full in 1 and 3, cu_seqlens-split attention), a 2x2 patch merger into the text "
                   "stack; a dense GQA text decoder with multimodal (3-section) rotary positions"),
    "qwen3_vl": ("Qwen3VLConfig",
                 dict(text=dict(VLM_TEXT, head_dim=64, rope_parameters={
                          "rope_type": "default", "rope_theta": 1e6, "mrope_section": [8, 12, 12],
                          "mrope_interleaved": True}),
                      vision=dict(depth=4, hidden_size=128, intermediate_size=256, num_heads=4, out_hidden_size=256,
                                  patch_size=16, num_position_embeddings=64, deepstack_visual_indexes=[1, 2]),
                      top=dict(IMAGE_IDS)),
                 "vision-language (Qwen3-VL): a 4-block ViT over 16-px patches with learned + 2D rotary positions, "
                 "a patch merger, and DeepStack: features of vision blocks 1 and 2 added to the hidden states of the "
                 "first text layers at the image positions; a dense text decoder with q/k norms and interleaved "
                 "multimodal rotary positions"),
    "gemma3_vlm": ("Gemma3Config",
                   dict(text=dict(VLM_TEXT, head_dim=64, sliding_window=8),
                        vision=dict(hidden_size=128, intermediate_size=256, num_hidden_layers=3, num_attention_heads=4,
                                    image_size=64, patch_size=8),
                        top=dict(mm_tokens_per_image=16, boi_token_index=4001, eoi_token_index=4002,
                                 image_token_index=4003)),
                   "vision-language (Gemma 3): a 3-layer SigLIP tower over 8-px patches of a 64-px image, average-"
                   "pooled to 16 soft tokens by the projector; the text stack 5 sliding (window 8) : 1 full attention "
                   "(bidirectional over the image tokens in the prefill)"),
    "mllama": ("MllamaConfig",
               dict(text=dict(VLM_TEXT),
                    vision=dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_global_layers=1,
                                attention_heads=4, image_size=56, patch_size=14, max_num_tiles=2,
                                vision_output_dim=384, intermediate_layers_indices=[0, 1],
                                supported_aspect_ratios=[[1, 1], [1, 2], [2, 1]]),
                    top=dict(image_token_index=4003)),
               "vision-language with cross-attention (Llama 3.2 Vision): a tiled vision encoder (2 local + 1 global "
               "layer, 2 tiles of 56 px) run in the prefill; the text stack has gated cross-attention layers (every "
               "3rd from layer 1) among self-attention ones: two kinds of text layer; the cross-attention K/V of the "
               "image are cached in the prefill and read by every decode"),
    "llava": ("LlavaConfig",
              dict(text=dict(VLM_TEXT, model_type="llama"),
                   vision=dict(model_type="clip_vision_model", hidden_size=128, intermediate_size=256,
                               num_hidden_layers=3, num_attention_heads=4, image_size=56, patch_size=14,
                               projection_dim=128),
                   top=dict(image_token_index=4003, vision_feature_layer=-2)),
              "vision-language (LLaVA): a 3-layer CLIP ViT over 14-px patches of a 56-px image (16 patch features "
              "from its second-to-last layer, the class token dropped), a 2-layer MLP projector, a Llama text "
              "decoder"),
    "apertus": ("ApertusConfig", dict(DENSE, pad_token_id=0, bos_token_id=1, eos_token_id=2),
                "dense GQA with q/k norms and an ungated MLP (up_proj, xIELU activation, down_proj) (Apertus)"),
    "nanochat": ("NanoChatConfig", dict(DENSE, pad_token_id=0, bos_token_id=1, eos_token_id=2),
                 "dense, parameter-free RMSNorms, q/k norms, an ungated ReLU² MLP (fc1, fc2), logit soft-capping "
                 "(nanochat)"),
    "vaultgemma": ("VaultGemmaConfig", dict(DENSE, head_dim=64, sliding_window=8),
                   "Gemma 2's layout without post-norms: alternating sliding (window 8) / full attention, attention "
                   "and logit soft-capping (VaultGemma)"),
    "helium": ("HeliumConfig", dict(DENSE, head_dim=64), "dense GQA, Llama layout (Kyutai Helium)"),
    "mamba": ("MambaConfig", dict(hidden_size=128, state_size=8, vocab_size=VOCAB, use_mambapy=False),
              "attention-free: Mamba-1 layers only (selective scan, torch path), a conv state and an SSM state in "
              "MambaCache (Mamba)"),
    "cwm": ("CwmConfig", dict(DENSE, head_dim=64, sliding_window=8),
            "1 full : 3 sliding (window 8) attention, the full one first, Llama 3 rotary (Code World Model)"),
    "ministral3": ("Ministral3Config", dict(DENSE, head_dim=64, pad_token_id=0, bos_token_id=1, eos_token_id=2),
                   "dense GQA with Llama 4 attention scaling: the queries multiplied by a factor that grows with the "
                   "position (Ministral 3)"),
    "switch_transformers": ("SwitchTransformersConfig",
                            dict(vocab_size=VOCAB, d_model=256, d_ff=512, d_kv=64, num_heads=4, num_experts=8,
                                 expert_capacity=64, encoder_sparse_step=2, decoder_sparse_step=2,
                                 decoder_start_token_id=0, pad_token_id=0, eos_token_id=1),
                            "encoder-decoder MoE (Switch Transformers): T5 blocks, every 2nd block's MLP a top-1 "
                            "switch router over 8 experts (a loop over the experts), relative position buckets, "
                            "eager attention; the encoder as deep as the decoder"),
    "t5": ("T5Config", dict(vocab_size=VOCAB, d_model=256, d_ff=512, d_kv=64, num_heads=4,
                            feed_forward_proj="gated-gelu", decoder_start_token_id=0, pad_token_id=0, eos_token_id=1),
           "encoder-decoder (T5 v1.1): gated-GELU MLPs, RMS-style LayerNorms, a relative position bias computed in the "
           "first block (its own submodule: a layer kind of its own) and passed on; the encoder as deep as the decoder "
           "(a deeper decoder fails in transformers 5.17)"),
})
# The eleventh holdout's families (`--holdout11`): Gemma 3n's text stack (AltUp, LAuReL, per-layer inputs, layers that
# reuse an earlier layer's KV cache), NLLB-MoE and UMT5 encoder-decoders, four more VLMs (Qwen2-VL's M-RoPE, PaliGemma's
# prefix-LM, LFM2-VL's conv + attention text stack, InternVL's pixel-shuffled InternViT), and decoder-only families
# no set had.
FAMILIES.update({
    "gemma3n": ("Gemma3nTextConfig", dict(DENSE, head_dim=64, sliding_window=8, vocab_size_per_layer_input=VOCAB,
                                          hidden_size_per_layer_input=32, laurel_rank=16, altup_num_inputs=4,
                                          pad_token_id=0, bos_token_id=1, eos_token_id=2),
                "Gemma 3n text: AltUp (4 predicted copies of the hidden state, one run through the layer, then "
                "corrected), a LAuReL low-rank residual, per-layer input embeddings in every layer, gaussian top-k "
                "activation sparsity in the first 2 layers' MLPs, sliding (window 8) / full attention with full at "
                "layer 1 and every 4th after it; the last 3 of 8 layers (1 of 4) read the KV cache of the last earlier "
                "layer of their attention type and have no K/V projections or norms of their own: two kinds of "
                "layer"),
    "solar_open": ("SolarOpenConfig", dict(SMALL, head_dim=32, n_routed_experts=8, num_experts_per_tok=2,
                                           moe_intermediate_size=64, n_shared_experts=1, pad_token_id=0,
                                           bos_token_id=1, eos_token_id=2),
                   "eager MoE with a shared expert in every layer (no dense first layer), sigmoid routing with a "
                   "correction bias, GQA attention (Solar Open)"),
    "jais2": ("Jais2Config", dict(DENSE, pad_token_id=0, bos_token_id=1, eos_token_id=2),
              "dense GQA with LayerNorms, biases, and an ungated ReLU² MLP (up_proj, down_proj) (Jais 2)"),
    "ministral": ("MinistralConfig", dict(DENSE, head_dim=64, sliding_window=8, pad_token_id=0, bos_token_id=1,
                                          eos_token_id=2),
                  "dense GQA, full and sliding (window 8) attention in turn, the full one first (Ministral 8B's "
                  "interleaved layout)"),
    "glm": ("GlmConfig", dict(DENSE, head_dim=64, pad_token_id=0, bos_token_id=1, eos_token_id=2),
            "dense GQA with q/k/v biases, rotary on half of each head (interleaved pairs), a fused gate_up "
            "projection, no post-norms (GLM-4 9B)"),
    "biogpt": ("BioGptConfig", dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, vocab_size=VOCAB,
                                    max_position_embeddings=512, pad_token_id=0, bos_token_id=1, eos_token_id=2),
               "learned positions (offset by 2), scaled embeddings, pre-LayerNorm, GELU MLP with biases (BioGPT)"),
    "nllb_moe": ("NllbMoeConfig", dict(vocab_size=VOCAB, d_model=256, encoder_layers=4, encoder_ffn_dim=512,
                                       decoder_ffn_dim=512, encoder_attention_heads=4, decoder_attention_heads=4,
                                       num_experts=8, expert_capacity=64, encoder_sparse_step=2,
                                       decoder_sparse_step=2, max_position_embeddings=512, decoder_start_token_id=2,
                                       pad_token_id=1, bos_token_id=0, eos_token_id=2),
                 "encoder-decoder MoE (NLLB-MoE): every 2nd layer's MLP a top-2 router over 8 experts (a loop over "
                 "the experts, capacity-limited), the others dense; sinusoidal positions, pre-LayerNorm, eager "
                 "attention; a 4-layer encoder run once"),
    "umt5": ("UMT5Config", dict(vocab_size=VOCAB, d_model=256, d_ff=512, d_kv=64, num_heads=4,
                                feed_forward_proj="gated-gelu", decoder_start_token_id=0, pad_token_id=0,
                                eos_token_id=1),
             "encoder-decoder (UMT5): T5 v1.1's blocks, but every block has its own relative position bias (T5: the "
             "first block only), so every decoder block has the same submodules; the encoder as deep as the "
             "decoder"),
    "qwen2_vl": ("Qwen2VLConfig",
                 dict(text=dict(VLM_TEXT, rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                                                           "mrope_section": [8, 12, 12]}),
                      vision=dict(depth=4, embed_dim=128, hidden_size=256, num_heads=4, mlp_ratio=2, patch_size=14),
                      top=dict(IMAGE_IDS)),
                 "vision-language (Qwen2-VL): a 4-block ViT over 14-px patches (2D rotary, full attention in every "
                 "block, LayerNorm, QuickGELU MLP), a 2x2 patch merger into the text stack; a dense GQA text decoder "
                 "with q/k/v biases and multimodal (3-section) rotary positions"),
    "paligemma": ("PaliGemmaConfig",
                  dict(text=dict(VLM_TEXT, model_type="gemma", head_dim=64),
                       vision=dict(hidden_size=128, intermediate_size=256, num_hidden_layers=3, num_attention_heads=4,
                                   image_size=56, patch_size=14),
                       top=dict(image_token_index=4003, projection_dim=256, hidden_size=256)),
                  "vision-language prefix-LM (PaliGemma): a 3-layer SigLIP tower over 14-px patches of a 56-px "
                  "image (16 soft tokens), a linear projector, a Gemma 1 text decoder; the image and prompt (the "
                  "prefix, token_type_ids 0) attend to each other both ways in the prefill, the decodes causally"),
    "lfm2_vl": ("Lfm2VlConfig",
                dict(text=dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2,
                               vocab_size=VOCAB, max_position_embeddings=512, pad_token_id=0, bos_token_id=1,
                               eos_token_id=2),
                     vision=dict(hidden_size=128, intermediate_size=256, num_hidden_layers=3, num_attention_heads=4,
                                 num_patches=64, patch_size=8),
                     top=dict(image_token_id=4003, projector_hidden_size=256)),
                "vision-language (LFM2-VL): a 3-layer SigLIP2 NaFlex tower over 64 patches (8x8, padded patch "
                "sequence with a mask and spatial shapes), a 2x2 pixel-unshuffle + MLP projector (16 image tokens); "
                "the text stack LFM2's: short-convolution and attention layers in turn (two kinds of text layer)"),
    "internvl": ("InternVLConfig",
                 dict(text=dict(VLM_TEXT, model_type="qwen2"),
                      vision=dict(hidden_size=128, intermediate_size=256, num_hidden_layers=3, num_attention_heads=4,
                                  image_size=[112, 112], patch_size=[14, 14]),
                      top=dict(image_token_id=4003, image_seq_length=16)),
                 "vision-language (InternVL 3): a 3-layer InternViT (layer scale, LayerNorm, a class token) over 14-px "
                 "patches of a 112-px image, a 0.5 pixel shuffle (64 patches to 16 tokens) and an MLP projector, a "
                 "Qwen2 text decoder"),
})
VLM = {"qwen2_5_vl", "qwen3_vl", "gemma3_vlm", "mllama", "llava"}
VLM |= {"qwen2_vl", "paligemma", "lfm2_vl", "internvl"}  # the eleventh holdout's
MOE = {"mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v3", "gpt_oss", "qwen3_next", "jamba", "glm4_moe",
       "phimoe", "granitemoe", "granitemoehybrid", "deepseek_v2", "ernie4_5_moe", "minimax", "jetmoe", "qwen3_5_moe",
       "dots1", "hunyuan_moe", "lfm2_moe", "afmoe", "kimi_linear", "glm_moe_dsa", "longcat_flash", "mimo_v2_flash",
       "zaya", "laguna", "cohere2_moe", "flex_olmo"}
# MoE families that run their experts on grouped GEMMs unless a spec says otherwise (the others: the eager loop)
GROUPED_EXPERTS = {"granitemoe", "granitemoehybrid", "qwen3_5_moe", "dots1", "lfm2_moe"}
MOE |= {"minimax_m2", "granitemoeshared", "glm4_moe_lite", "exaone_moe"}  # the ninth holdout's
GROUPED_EXPERTS |= {"granitemoeshared"}
MOE |= {"solar_open"}  # the eleventh holdout's (NLLB-MoE is built by build_seq2seq)
PLAIN = {"gptfast", "gptfast_moe"}  # plain PyTorch: no config, no transformers model (build_plain)
NO_ATTENTION = {"mamba2", "falcon_mamba", "xlstm", "mamba"}  # no attention implementation to choose
# no SDPA path in transformers 5.17
EAGER_ATTENTION = {"gpt_oss", "bloom", "gptj", "mpt", "codegen", "xglm", "mimo_v2_flash", "switch_transformers"}
EAGER_ATTENTION |= {"nllb_moe"}
OTHER_ATTENTION = {"llama_flex": "flex_attention"}  # family variants on another attention implementation


def family_config(family: str, layers: int):
    import transformers

    cname, kw, _ = FAMILIES[family]
    kw = {k: dict(v) if isinstance(v, dict) else v for k, v in kw.items()}  # DBRX's sub-configs are dicts
    layer_key = {"gpt2": "n_layer", "bloom": "n_layer", "gptj": "n_layer", "gpt_bigcode": "n_layer",
                 "codegen": "n_layer", "mpt": "n_layers", "xglm": "num_layers", "longcat_flash": "num_layers",
                 "dbrx": "n_layers"}
    kw[layer_key.get(family, "num_hidden_layers")] = layers
    if family == "longcat_flash":  # its num_hidden_layers counts the attention sublayers (cache slots), 2 a layer
        kw["num_hidden_layers"] = 2 * layers
    if family in ("lfm2", "lfm2_moe"):  # attention at every other layer, the conv layers between
        kw["layer_types"] = ["conv" if i % 2 == 0 else "full_attention" for i in range(layers)]
    if family in ("qwen3_next", "qwen3_5_moe", "minimax", "kimi_linear"):  # Kimi: as released (its default: 4, 8, ..)
        kw["layer_types"] = ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(layers)]
    if family == "granitemoehybrid":
        kw["layer_types"] = ["attention" if i % 4 == 2 else "mamba" for i in range(layers)]
    if family == "bamba":
        kw["attn_layer_indices"] = [i for i in range(layers) if i % 4 == 3]
    if family == "bamba_attn0":
        kw["attn_layer_indices"] = [i for i in range(layers) if i % 4 == 0]
    if family == "zamba2":
        kw["layers_block_type"] = ["hybrid" if i % 3 == 2 else "mamba" for i in range(layers)]
    if family == "nemotron_h":  # M: Mamba-2, -: MLP, *: attention; one block a layer
        kw["hybrid_override_pattern"] = ("M-M*-" * layers)[:layers]
    if family == "laguna":  # full attention at layer 0 and every 3rd, with twice the heads of the sliding layers
        kw["layer_types"] = ["full_attention" if i % 3 == 0 else "sliding_attention" for i in range(layers)]
        kw["num_attention_heads_per_layer"] = [8 if i % 3 == 0 else 4 for i in range(layers)]
    if family == "gemma3n":  # full attention at layer 1 and every 4th after it; the last 3/8 of the layers share KV
        kw["layer_types"] = ["full_attention" if i % 4 == 1 else "sliding_attention" for i in range(layers)]
        kw["num_kv_shared_layers"] = layers * 3 // 8
        kw["activation_sparsity_pattern"] = [0.95 if i < 2 else 0.0 for i in range(layers)]
    if family == "ministral":  # full and sliding in turn, the full one first
        kw["layer_types"] = ["full_attention" if i % 2 == 0 else "sliding_attention" for i in range(layers)]
    return getattr(transformers, cname)(**kw)


def build(family: str, layers: int, device: str, experts: str | None = None):
    """Random weights from a tiny config (no downloads); bf16 on CUDA; SDPA (eager attention for GPT-OSS); MoE
    experts on transformers' eager path (a Python loop over the experts that got tokens), or grouped GEMMs for
    GROUPED_EXPERTS, unless `experts` says."""
    torch.backends.cuda.enable_cudnn_sdp(False)  # cuDNN SDPA re-plans on every new KV length (~50 ms GPU idle)
    from transformers import AutoModelForCausalLM

    config = family_config(family, layers)
    torch.manual_seed(0)
    experts = experts or ("grouped_mm" if family in GROUPED_EXPERTS else "eager")
    attn = OTHER_ATTENTION.get(family, "eager" if family in EAGER_ATTENTION else "sdpa")
    kw = {} if family in NO_ATTENTION else {"attn_implementation": attn}
    if family in MOE:
        kw["experts_implementation"] = experts
    model = AutoModelForCausalLM.from_config(config, **kw)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = model.to(device=device, dtype=dtype).eval()
    if family in MOE:
        got = getattr(model.config, "_experts_implementation", None)
        assert got == experts, f"{family}: experts implementation {got}, wanted {experts}"
    return model


def decoder_layers(model) -> list:
    cfg = model.config
    n = cfg.num_layers if cfg.model_type == "longcat_flash" else cfg.num_hidden_layers  # LongCat: see family_config
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.ModuleList) and len(m) == n and name.rsplit(".", 1)[-1] in ("layers", "h", "blocks"):
            return list(m)
    raise RuntimeError(f"no decoder-layer list of {n} in {type(model).__name__}")


def layer_info(model, device: str) -> dict:
    """Decoder-layer calls in one eager forward (hooks on the decoder-layer modules) and the layers grouped by the
    (submodule name, class) pairs inside them (block_layer_info), with the config's layer layout."""
    cfg = model.config
    info = {k: getattr(cfg, k) for k in ("layer_types", "first_k_dense_replace", "sliding_window", "num_experts",
                                         "n_routed_experts", "num_local_experts", "num_experts_per_tok",
                                         "decoder_sparse_step", "mlp_only_layers", "no_rope_layers",
                                         "mlp_layer_types", "indexer_types", "zero_expert_num", "num_kv_shared_layers")
            if getattr(cfg, k, None) is not None}
    return block_layer_info(decoder_layers(model),
                            lambda: model(input_ids=torch.randint(0, VOCAB, (1, 4), device=device)),
                            {"config_info": info, "model_class": type(model).__name__})


def prompt(batch: int, device: str, length: int = PROMPT) -> torch.Tensor:
    return torch.randint(1, VOCAB, (batch, length), device=device)


def activities(device: str):
    return [ProfilerActivity.CPU, ProfilerActivity.CUDA] if device == "cuda" else [ProfilerActivity.CPU]


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def recorded(ctx: Ctx, spec: Spec, log, body) -> profile:
    """body() run once under torch.profiler (no grad), the forward log recording only inside it; the profiler."""
    log.clear()
    with torch.no_grad(), profile(activities=activities(ctx.device), record_shapes=spec.rs) as prof:
        log.set_rec(True)
        body()
        sync(ctx.device)
        log.set_rec(False)
    return prof


# truth: forwards -----------------------------------------------------------------------------------------------
@dataclass
class Fwd:
    batch: int
    tokens: int
    cached_before: int
    phase: str
    t0: int
    rec0: bool
    ep0: int
    t1: int = 0
    rec1: bool = False
    ep1: int = 0
    extra: dict = field(default_factory=dict)


class ForwardLog:
    """Forwards of the model, timed by a pre-hook and a hook, with the profiler's recording state at both ends.

    `rec` is True while the profiler records; every change of it bumps `epoch`. A forward is whole when it began
    and ended while recording with no change in between; partial when the state changed during it."""

    def __init__(self, model=None, training: bool = False):
        self.rec = False
        self.epoch = 0
        self.forwards: list[Fwd] = []
        self.training = training
        self.cached_override = None  # callable -> int, for caches whose length lives on the device
        # callable(ids, kwargs) -> (batch, tokens, cached, phase, extra), for inputs no cache describes (continuous
        # batching packs the requests of a forward into one row)
        self.describe = None
        if model is not None:
            model.register_forward_pre_hook(self.pre, with_kwargs=True, prepend=True)
            model.register_forward_hook(self.post, always_call=True)

    def set_rec(self, value: bool) -> None:
        if value != self.rec:
            self.rec = value
            self.epoch += 1

    def pre(self, module, args, kwargs):
        t0 = time.time_ns()
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            ids = kwargs["inputs_embeds"]
        if self.describe is not None:
            batch, tokens, cached, phase, extra = self.describe(ids, kwargs)
            self.forwards.append(Fwd(batch, tokens, cached, phase, t0, self.rec, self.epoch, extra=extra))
            return
        past = kwargs.get("past_key_values")
        if self.cached_override is not None:
            cached = self.cached_override()
        elif past is None:
            cached = 0
        else:
            cached = past.get_seq_length()
            if isinstance(cached, torch.Tensor):
                raise RuntimeError("cache length on the device: would sync; set cached_override")
        cached, tokens = int(cached), int(ids.shape[1])
        if cached == 0 and tokens == 1 and self.forwards and self.cached_override is None:
            # A cache that keeps no KV length (Mamba-2's state; a first layer of linear attention, whose cache
            # reports 0): one new token right after a forward of this log continues that forward's sequences.
            cached = self.forwards[-1].cached_before + self.forwards[-1].tokens
        if self.training:
            phase = "training"
        else:
            phase = "prefill" if cached == 0 else ("decode" if tokens == 1 else "extend")
        self.forwards.append(Fwd(int(ids.shape[0]), tokens, cached, phase, t0, self.rec, self.epoch))

    def post(self, module, args, output):
        f = self.forwards[-1]
        f.t1, f.rec1, f.ep1 = time.time_ns(), self.rec, self.epoch

    def add(self, batch, tokens, cached, phase, t0, t1, rec0, ep0, **extra) -> None:
        """A forward the hooks do not see (a CUDA-graph replay, a training iteration)."""
        self.forwards.append(Fwd(batch, tokens, cached, phase, t0, rec0, ep0, t1, self.rec, self.epoch, extra))

    def clear(self) -> None:
        self.forwards.clear()

    def split(self):
        whole = [f for f in self.forwards if f.rec0 and f.rec1 and f.ep0 == f.ep1]
        partial = [f for f in self.forwards if f.ep0 != f.ep1]
        return whole, partial


def steps_of(forwards) -> dict:
    return dict(Counter(f.phase for f in forwards))


# save and read back --------------------------------------------------------------------------------------------
def versions() -> dict:
    import transformers

    v = {"torch": torch.__version__, "transformers": transformers.__version__}
    if torch.cuda.is_available():
        v["gpu"] = torch.cuda.get_device_name()
    return v


def trim(raw: str, gz: str) -> None:
    subprocess.run([sys.executable, TRIM, raw, gz, "--window", "0", "1e30"], check=True,
                   stdout=subprocess.DEVNULL)


def load_doc(path: str) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)


LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def read_back(path: str, forwards: list[Fwd]) -> dict:
    """What the written trace holds, read from its raw events: the clock base, marker counts, and per forward the
    runtime launches inside its CPU span and how many of them have their GPU activity (same correlation)."""
    doc = load_doc(path)
    base = int(doc.get("baseTimeNanoseconds", 0))
    events = doc["traceEvents"]
    gpu_corr = Counter()
    for e in events:
        if e.get("cat") in GPU_CATS and "correlation" in e.get("args", {}):
            gpu_corr[e["args"]["correlation"]] += 1
    launches = sorted((e["ts"], e["args"]["correlation"]) for e in events
                      if e.get("cat") in LAUNCH_CATS and isinstance(e.get("args"), dict)
                      and "correlation" in e["args"] and e["args"]["correlation"] in gpu_corr)
    cpu_ops = sorted(e["ts"] for e in events if e.get("cat") == "cpu_op")
    import bisect

    rows = []
    lts = [t for t, _ in launches]
    for f in forwards:
        s_us, e_us = (f.t0 - base) / 1000.0, (f.t1 - base) / 1000.0
        i, j = bisect.bisect_left(lts, s_us), bisect.bisect_right(lts, e_us)
        k = bisect.bisect_left(cpu_ops, s_us)
        first_op = cpu_ops[k] - s_us if k < len(cpu_ops) and cpu_ops[k] <= e_us else None
        rows.append({"kernels": sum(gpu_corr[c] for _, c in launches[i:j]), "launches_with_gpu_work": j - i,
                     "first_cpu_op_after_start_us": None if first_op is None else round(first_op, 3)})
    marks = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("ph") == "X"]
    graphs = [e for e in events if e.get("cat") == "cuda_runtime" and "GraphLaunch" in str(e.get("name", ""))]
    return {"base": base, "rows": rows, "record_shapes_header": doc.get("record_shapes"),
            "in_trace": {"profiler_step_cpu": sum(e.get("cat") == "user_annotation" for e in marks),
                         "profiler_step_gpu": sum(e.get("cat") == "gpu_user_annotation" for e in marks),
                         "cuda_graph_launches": len(graphs),
                         "gpu_activities": sum(e.get("cat") in GPU_CATS for e in events),
                         "kernels": sum(e.get("cat") == "kernel" for e in events),
                         "cpu_ops": len(cpu_ops), "events": len(events)},
            "decodegap_record": doc.get("decodegap_record")}


def each_forward(forwards: list[Fwd], whole, partial, base: int, rows: list) -> list:
    out = []
    for f, r in zip(forwards, rows, strict=True):
        where = "whole" if f in whole else ("partial" if f in partial else "outside")
        d = {"batch": f.batch, "tokens": f.tokens, "cached_before": f.cached_before, "phase": f.phase,
             "window": where, "cpu_start_ns": f.t0 - base, "cpu_end_ns": f.t1 - base}
        for k, v in f.extra.items():
            if k.endswith("_ns_abs"):
                d[k[: -len("_abs")]] = v - base  # in the trace's clock too
            else:
                d[k] = v
        d.update(r)
        out.append(d)
    return out


def save(prof, out_dir: str, name: str, log: ForwardLog, truth: dict, raw_path: str | None = None) -> int:
    """Export (or take `raw_path`), trim, gzip; write the truth file. Returns the gzipped size."""
    gz = os.path.join(out_dir, f"{name}.json.gz")
    if raw_path is None:
        raw_path = os.path.join(out_dir, f"{name}.raw.json")
        prof.export_chrome_trace(raw_path)
    truth["exported_bytes"] = os.path.getsize(raw_path)
    trim(raw_path, gz)
    os.remove(raw_path)
    whole, partial = log.split()
    back = read_back(gz, log.forwards)
    truth["steps"] = steps_of(whole)
    truth["partial_at_edges"] = len(partial)
    truth.setdefault("forwards_outside_window", len(log.forwards) - len(whole) - len(partial))
    truth["batch"] = sorted({f.batch for f in whole}) or sorted({f.batch for f in log.forwards})
    truth["tokens_per_forward"] = {ph: sorted({f.batch * f.tokens for f in whole if f.phase == ph})
                                   for ph in truth["steps"]}
    truth["each_forward"] = each_forward(log.forwards, whole, partial, back["base"], back["rows"])
    w = [r for f, r in zip(log.forwards, back["rows"], strict=True) if f in whole]
    truth["kernels_per_whole_forward"] = [r["kernels"] for r in w]
    offs = [r["first_cpu_op_after_start_us"] for r in w if r["first_cpu_op_after_start_us"] is not None]
    truth["clock_check"] = {
        "rule": "cpu_start_ns = time.time_ns() at the forward pre-hook - baseTimeNanoseconds; Kineto ts (us) * 1000 "
                "is on the same clock. Measured: the first cpu_op at or after each whole forward's start, in us",
        "base_time_ns": back["base"],
        "first_cpu_op_after_start_us": {"min": min(offs), "median": sorted(offs)[len(offs) // 2],
                                        "max": max(offs)} if offs else None}
    truth["in_trace"] = back["in_trace"]
    if back["decodegap_record"] is not None:
        truth["decodegap_record_header"] = {k: back["decodegap_record"].get(k)
                                            for k in ("target", "warmup", "timed_steps", "steps", "record_shapes")}
    if back["record_shapes_header"] is not None:
        truth["record_shapes_header"] = back["record_shapes_header"]
    truth["trace"] = f"{name}.json.gz"
    truth["trace_gz_bytes"] = os.path.getsize(gz)
    truth["trimmed"] = ("scripts/trim_trace.py RAW OUT --window 0 1e30: every event kept but flow arrows and "
                        "python_function; the args Concrete Inputs, Input Strides, Ev Idx, Record function id dropped")
    truth["made_by"] = "scripts/make_accuracy_corpus.py"
    truth.update(versions())
    write_truth(out_dir, name, truth)
    print(f"{name}: {truth['trace_gz_bytes'] / 1e3:.0f} kB gz; steps {truth['steps']}; partial "
          f"{truth['partial_at_edges']}; layers {truth.get('layers')} kinds {truth.get('layer_kinds')}; "
          f"kernels/forward {truth['kernels_per_whole_forward'][:12]}", flush=True)
    return truth["trace_gz_bytes"]


def write_truth(out_dir: str, name: str, truth: dict) -> None:
    order = ["name", "family", "loop", "workload", "record_shapes", "steps", "partial_at_edges", "layers",
             "layer_kinds", "batch", "tokens_per_forward", "what", "how"]
    doc = {k: truth[k] for k in order if k in truth}
    doc.update({k: v for k, v in truth.items() if k not in doc})
    with open(os.path.join(out_dir, f"{name}.truth.json"), "w") as f:
        json.dump(doc, f, indent=1)


# the traces ----------------------------------------------------------------------------------------------------
@dataclass
class Spec:
    name: str
    family: str
    loop: str
    layers: int = 4
    steps: list = field(default_factory=lambda: [10, 7, 5])  # tokens / steps to try, the first that fits
    batch: int = 1
    rs: bool = True  # record_shapes
    opts: dict = field(default_factory=dict)
    cost: float = 4.0  # seconds on the H200, for spreading the work over processes


class Ctx:
    def __init__(self, out_dir: str, device: str):
        self.out_dir, self.device = out_dir, device


def base_truth(spec: Spec, info: dict, what: str, how: str, workload: str = "inference") -> dict:
    t = {"name": spec.name, "family": spec.family, "loop": spec.loop, "workload": workload,
         "record_shapes": spec.rs, "what": what, "how": how, "family_is": FAMILIES[spec.family][2]}
    t.update(info)
    if spec.opts.get("budget_note"):
        t["size_fit_budget"] = spec.opts["budget_note"]
    return t


def gen_kwargs(n: int, sample: bool = False) -> dict:
    kw = dict(max_new_tokens=n, min_new_tokens=n, pad_token_id=0, disable_compile=True)
    if sample:
        kw.update(do_sample=True, top_k=50, top_p=0.9, temperature=0.8)
    else:
        kw.update(do_sample=False)
    return kw


def fit(ctx: Ctx, spec: Spec, capture) -> None:
    """capture(n) -> (prof, log, truth, raw_path|None); the first n of spec.steps whose trace fits LIMIT_BYTES."""
    tried = []
    for i, n in enumerate(spec.steps):
        prof, log, truth, raw = capture(n)
        truth["size_knob"] = n
        if i:
            truth["size_fit"] = (f"size knob (tokens / steps / replays / iterations) reduced from {spec.steps[0]} to "
                                 f"{n}: the trace at {tried} was over {LIMIT_BYTES // 1000} kB gzipped")
        size = save(prof, ctx.out_dir, spec.name, log, truth, raw)
        if size <= LIMIT_BYTES:
            return
        tried.append(n)
    print(f"{spec.name}: still {size / 1e3:.0f} kB at the smallest knob", flush=True)


def _one_generate(ctx: Ctx, spec: Spec, extra: dict, what, ids: torch.Tensor | None = None) -> None:
    """A warm-up generate, then profile() around one generate(max_new_tokens=n, **extra); `what(n)` describes it."""
    model = build(spec.family, spec.layers, ctx.device)
    info = layer_info(model, ctx.device)
    log = ForwardLog(model)
    ids = prompt(spec.batch, ctx.device) if ids is None else ids
    warm = spec.opts.get("warmup_tokens", 3)  # as many as the capture: every shape compiled first (flex attention)
    with torch.no_grad():
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **gen_kwargs(warm), **extra)  # warm-up
    sync(ctx.device)

    def capture(n):
        prof = recorded(ctx, spec, log, lambda: model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                                               **gen_kwargs(n), **extra))
        how = "profile(activities=[CPU, CUDA]) around one generate(); a warm-up generate ran before"
        return prof, log, base_truth(spec, info, what(n), how), None

    fit(ctx, spec, capture)


def loop_eager_generate(ctx: Ctx, spec: Spec) -> None:
    _one_generate(ctx, spec, {}, lambda n: f"greedy model.generate(max_new_tokens={n}) at batch {spec.batch}, prompt "
                                           f"{PROMPT} tokens, DynamicCache; no step markers")


def loop_beam_generate(ctx: Ctx, spec: Spec) -> None:
    """Beam search: generate(num_beams=opts beams, default 3) on batch x beams rows; the cache is reordered by the
    surviving beams after every step (an index_select per layer's keys and values, between the forwards)."""
    beams = spec.opts.get("beams", 3)
    _one_generate(ctx, spec, dict(num_beams=beams, early_stopping=False, length_penalty=0.0),
                  lambda n: f"beam search model.generate(num_beams={beams}, max_new_tokens={n}) at batch {spec.batch} "
                            f"({spec.batch * beams} rows), prompt {PROMPT} tokens, DynamicCache reordered by beam "
                            "every step; no step markers")


def loop_nocache_generate(ctx: Ctx, spec: Spec) -> None:
    """generate(use_cache=False): no KV cache, so every forward runs the whole sequence so far (prompt + the tokens
    made): n prefills of 16, 17, .. 16 + n - 1 tokens per sequence."""
    _one_generate(ctx, spec, {"use_cache": False},
                  lambda n: f"greedy model.generate(max_new_tokens={n}, use_cache=False) at batch {spec.batch}, prompt "
                            f"{PROMPT} tokens: no KV cache, every forward recomputes the whole sequence ({PROMPT} .. "
                            f"{PROMPT + n - 1} tokens); no step markers")


def loop_static_generate(ctx: Ctx, spec: Spec) -> None:
    """generate(cache_implementation="static", max_cache_len=opts cache_len, default 128) run eagerly
    (disable_compile: no torch.compile, no CUDA graph): the StaticCache is preallocated as a server would, longer than
    the sequence, and every forward attends over that whole length (masked), so KV shapes stay the same all along.
    Its KV length is a device tensor (reading it in the pre-hook would sync), so the log counts it on the host from
    this generate's forwards so far, checked against the returned cache after each generate."""
    model = build(spec.family, spec.layers, ctx.device)
    info = layer_info(model, ctx.device)
    log = ForwardLog(model)
    start = [0]  # index of this generate's first forward in the log
    log.cached_override = lambda: sum(f.tokens for f in log.forwards[start[0]:])
    ids = prompt(spec.batch, ctx.device)
    cache_len = spec.opts.get("cache_len", 128)
    got = {}

    def run(n):
        start[0] = len(log.forwards)
        got["cache"] = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), cache_implementation="static",
                                      max_cache_len=cache_len, return_dict_in_generate=True,
                                      **gen_kwargs(n)).past_key_values

    def check():  # after the window: the cache's own length is a device read
        kv = got.pop("cache")
        want = sum(f.tokens for f in log.forwards[start[0]:])
        assert type(kv).__name__ == "StaticCache" and int(kv.get_seq_length()) == want, (type(kv), want)
        assert kv.get_max_length() == cache_len, kv.get_max_length()
        return {"class": type(kv).__name__, "max_length": cache_len, "kv_length_after": want}

    with torch.no_grad():
        run(3)  # warm-up
    sync(ctx.device)
    check()

    def capture(n):
        prof = recorded(ctx, spec, log, lambda: run(n))
        t = base_truth(spec, info, f"greedy model.generate(max_new_tokens={n}, cache_implementation='static', "
                                   f"max_cache_len={cache_len}) at batch {spec.batch}, prompt {PROMPT} tokens, eager "
                                   "(disable_compile, no CUDA graph): every forward attends over the whole "
                                   f"preallocated {cache_len} positions (masked); no step markers",
                       "profile() around one generate(); a warm-up generate ran before; KV length before each forward "
                       "counted on the host (the tokens of the generate's forwards so far), checked against the "
                       "returned StaticCache")
        t["static_cache"] = check()
        return prof, log, t, None

    fit(ctx, spec, capture)


def loop_prompt_lookup_generate(ctx: Ctx, spec: Spec) -> None:
    """generate(prompt_lookup_num_tokens=k) at batch 1 (speculative decoding without a draft model): each forward
    runs the last token and up to k candidates copied from where the last tokens occurred earlier in the sequence
    (the prefill too: prompt + candidates); rejected candidates are cropped from the cache before the next forward.
    So a forward takes 1 new token (decode) or several (extend). The prompt is 8 tokens twice: candidates are found."""
    k = spec.opts.get("lookup", 4)
    half = prompt(1, ctx.device, PROMPT // 2)
    _one_generate(ctx, spec, {"prompt_lookup_num_tokens": k},
                  lambda n: f"prompt-lookup decoding: greedy model.generate(prompt_lookup_num_tokens={k}, "
                            f"max_new_tokens={n}) at batch 1, prompt {PROMPT // 2} tokens twice; each forward "
                            f"verifies up to {k} candidate tokens on the DynamicCache (cropped after a rejection); "
                            "no step markers", ids=torch.cat([half, half], dim=1))


def loop_assisted_generate(ctx: Ctx, spec: Spec) -> None:
    """Assisted generation (speculative decoding with a draft model): generate(assistant_model=a model of the same
    family with opts draft_layers layers, default 2) at batch 1. Each round the draft proposes candidates (its own
    forwards on its own DynamicCache; with random weights its confidence falls under 0.4 after one token, so one
    candidate), then the target verifies the last token + the candidates in one forward (the first: prompt +
    candidates, a prefill; then extends of 2, a decode when no candidate is left to verify), and both caches are
    cropped to the accepted tokens. The steps are the target's forwards; the draft's forwards run between them and
    are logged apart (`assistant` in the truth), as are its layers."""
    draft_layers = spec.opts.get("draft_layers", 2)
    model = build(spec.family, spec.layers, ctx.device)
    info = layer_info(model, ctx.device)
    draft = build(spec.family, draft_layers, ctx.device)
    draft_info = layer_info(draft, ctx.device)
    log, dlog = ForwardLog(model), ForwardLog(draft)
    ids = prompt(1, ctx.device)

    def run(n):
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), assistant_model=draft, **gen_kwargs(n))

    with torch.no_grad():
        run(4)  # warm-up
    sync(ctx.device)

    def capture(n):
        log.clear()
        dlog.clear()
        with torch.no_grad(), profile(activities=activities(ctx.device), record_shapes=spec.rs) as prof:
            log.set_rec(True)
            dlog.set_rec(True)
            run(n)
            sync(ctx.device)
            log.set_rec(False)
            dlog.set_rec(False)
        t = base_truth(spec, info, f"assisted generation: greedy model.generate(assistant_model=<{draft_layers}-layer "
                                   f"{spec.family}>, max_new_tokens={n}) at batch 1, prompt {PROMPT} tokens: each "
                                   "round the draft proposes candidates (its own forwards and DynamicCache), then one "
                                   "target forward verifies them (the first a prefill of prompt + candidates, then "
                                   "extends of the last token + candidates); no step markers",
                       "profile() around one generate(); a warm-up generate ran before; hooks on both models")
        t["expect"] = ("the target's forwards are the steps (steps, layers, layer_kinds are the target's); the draft's "
                       "forwards (`assistant`) are a smaller model's, between the steps, not steps")
        return prof, log, t, None

    fit(ctx, spec, capture)
    path = os.path.join(ctx.out_dir, f"{spec.name}.truth.json")  # the last capture's: add the draft's forwards
    truth = json.load(open(path))
    base = truth["clock_check"]["base_time_ns"]
    whole, partial = dlog.split()
    truth["assistant"] = {
        "layers": draft_info["layers"], "layer_kinds": draft_info["layer_kinds"],
        "model_class": draft_info["model_class"], "steps": steps_of(whole), "partial_at_edges": len(partial),
        "each_forward": [{"batch": f.batch, "tokens": f.tokens, "cached_before": f.cached_before, "phase": f.phase,
                          "window": "whole" if f in whole else "partial" if f in partial else "outside",
                          "cpu_start_ns": f.t0 - base, "cpu_end_ns": f.t1 - base} for f in dlog.forwards]}
    write_truth(ctx.out_dir, spec.name, truth)
    print(f"{spec.name}: draft forwards {truth['assistant']['steps']}", flush=True)


def warm_up(ctx: Ctx, spec: Spec, run, what: str) -> None:
    """Two runs before the capture: the compiler compiles and records its CUDA graphs there, not in the trace."""
    t0 = time.time()
    for _ in range(2):
        run(spec.steps[0])
    sync(ctx.device)
    print(f"{spec.name}: warm-up {what} (compilation, graph recording) {time.time() - t0:.1f} s", flush=True)


def fit_replayed(ctx: Ctx, spec: Spec, capture) -> None:
    """fit(), then a warning where the trace holds fewer CUDA graph launches than the decodes the loop replayed (the
    compiler skipped its graphs)."""
    fit(ctx, spec, capture)
    truth = json.load(open(os.path.join(ctx.out_dir, f"{spec.name}.truth.json")))
    got = truth["in_trace"]["cuda_graph_launches"]
    if got < truth["cuda_graph_replays_expected"]:
        print(f"{spec.name}: WARNING {got} graph launches in the trace for "
              f"{truth['cuda_graph_replays_expected']} decodes (CUDA graphs skipped?)", flush=True)


def loop_reduce_overhead_hand(ctx: Ctx, spec: Spec) -> None:
    """torch.compile(model.forward, mode="reduce-overhead") over a StaticCache in a hand loop, as generate() runs a
    static cache when it compiles: the prefill eager (not compiled), then every decode through the compiled forward,
    which Inductor's CUDA graph trees replay (one cudaGraphLaunch a forward, after copying the new inputs into the
    graph's buffers); torch.compiler.cudagraph_mark_step_begin() before each decode, the next token and
    cache_position made on the device (no host sync). Compilation and graph recording ran in two warm-up loops
    outside the trace (the cache reset in place between loops). The KV length lives on the device in a StaticCache,
    so the log counts it on the host."""
    from transformers import StaticCache

    model = build(spec.family, spec.layers, ctx.device)
    info = layer_info(model, ctx.device)  # eager, before compiling
    log = ForwardLog(model)
    kv = [0]
    log.cached_override = lambda: kv[0]
    cache_len = PROMPT + spec.steps[0] + 8
    cache = StaticCache(config=model.config, max_cache_len=cache_len)
    eager_forward = model.forward
    torch._dynamo.config.cache_size_limit = 64
    compiled = torch.compile(eager_forward, mode="reduce-overhead")
    ids0 = prompt(spec.batch, ctx.device)
    prefill_pos = torch.arange(PROMPT, device=ctx.device)

    def run(n):
        cache.reset()  # keys, values and the device-side length zeroed in place (the graphs' addresses stay)
        kv[0] = 0
        model.forward = eager_forward
        with torch.no_grad():
            logits = model(input_ids=ids0, past_key_values=cache, use_cache=True, cache_position=prefill_pos).logits
            kv[0] = PROMPT
            nxt, pos = logits[:, -1:].argmax(-1), prefill_pos[-1:] + 1
            model.forward = compiled
            for _ in range(n - 1):
                torch.compiler.cudagraph_mark_step_begin()
                logits = model(input_ids=nxt, past_key_values=cache, use_cache=True, cache_position=pos).logits
                kv[0] += 1
                nxt, pos = logits[:, -1:].argmax(-1), pos + 1
        model.forward = eager_forward
        assert int(cache.get_seq_length()) == kv[0], (int(cache.get_seq_length()), kv[0])  # after the window

    warm_up(ctx, spec, run, "loops")

    def capture(n):
        prof = recorded(ctx, spec, log, lambda: run(n))  # run's last check reads the device-side length
        t = base_truth(spec, info, f"torch.compile(model.forward, mode='reduce-overhead') on a StaticCache of "
                                   f"{cache_len}: a hand loop at batch {spec.batch}, the prefill eager, then {n - 1} "
                                   "decodes through the compiled forward, each a CUDA graph tree replay "
                                   "(cudaGraphLaunch), argmax and cache_position on the device; no markers",
                       "two warm-up loops compiled and recorded the graphs first (not in the trace); profile() around "
                       "one loop; KV length counted on the host, checked against the cache after the loop")
        t["cuda_graph_replays_expected"] = n - 1 if ctx.device == "cuda" else 0
        return prof, log, t, None

    fit_replayed(ctx, spec, capture)


def loop_continuous_batching(ctx: Ctx, spec: Spec) -> None:
    """transformers' continuous batching: a ContinuousBatchingManager (init_continuous_batching) over a
    PagedAttentionCache (blocks of 16 tokens), attention 'paged|sdpa', no CUDA graphs, no compile, synchronous
    batches, greedy. Each forward packs its scheduled requests' tokens into one row (input_ids [1, total]): whole
    prompts and prompt chunks (a budget of opts batch_tokens, default 32, tokens a forward) and one token per decoding
    request, so a forward is a prefill, an extend (prompt chunks only), a decode or mixed (decodes and prompt tokens
    together). Three requests wait when the loop starts, two more join from a forward hook after forwards 2 and 3,
    and each leaves at its own max_new_tokens: the requests per forward change. The phase of a forward comes from the
    scheduled requests (host-side state read in the pre-hook): per request the tokens it runs and its length before.
    The manager's generation loop (what start() runs on a background thread) runs on the profiling thread:
    torch.profiler records the CPU ops of its own thread only."""
    import threading

    from transformers import ContinuousBatchingConfig, GenerationConfig

    if ctx.device != "cuda":  # CPU smoke: transformers sizes the paged cache by psutil's free host memory (0 without)
        from transformers.generation.continuous_batching.cache import PagedAttentionMemoryHandler

        PagedAttentionMemoryHandler.get_available_memory = lambda self: 1 << 32
    model = build(spec.family, spec.layers, ctx.device)
    info = layer_info(model, ctx.device)  # on sdpa, before the paged attention
    model.set_attn_implementation("paged|sdpa")
    log = ForwardLog(model)
    budget = spec.opts.get("batch_tokens", 32)
    gen = GenerationConfig(do_sample=False, max_new_tokens=spec.steps[0], eos_token_id=-1, pad_token_id=0)
    cbc = ContinuousBatchingConfig(block_size=16, num_blocks=64, max_batch_tokens=budget, max_requests_per_batch=8,
                                   max_blocks_per_request=0, allow_block_sharing=False, use_cuda_graph=False,
                                   use_async_batching=False)
    manager = model.init_continuous_batching(generation_config=gen, continuous_batching_config=cbc)
    status = manager.background_thread_status
    state = {"prompt_len": {}, "joins": {}, "last_join": 0, "tag": ""}

    def describe(ids, kwargs):
        reqs = manager.batch_processor.inputs_and_outputs.requests_in_batch
        q = [fs.query_length for fs in reqs]
        past = [fs.state.position_offset - fs.query_length for fs in reqs]  # prepare_batch_tensors advanced it
        rids = [fs.state.request_id for fs in reqs]
        kinds = ["decode" if p >= state["prompt_len"][r] else "prefill" if p == 0 else "extend"
                 for r, p in zip(rids, past, strict=True)]
        assert sum(q) == ids.shape[1], (q, tuple(ids.shape))  # no padding: no CUDA graphs, no compile
        if all(k == "decode" for k in kinds):
            phase = "decode"
        elif "decode" in kinds:
            phase = "mixed"
        else:
            phase = "prefill" if all(k == "prefill" for k in kinds) else "extend"
        return int(ids.shape[0]), int(ids.shape[1]), sum(past), phase, {
            "requests": rids, "query_lengths": q, "lengths_before": past, "request_phases": kinds}

    log.describe = describe

    def join(module, args, output):  # after the log's post-hook: forward k has ended
        k = len(log.forwards)
        for i, (plen, new) in state["joins"].pop(k, []):
            add(i, plen, new)
        if k == state["last_join"]:
            status.request_stop(type(status).FLUSH_AND_STOP, 0)  # the loop ends when every request is done

    model.register_forward_hook(join)

    def add(i, plen, new):
        rid = f"{state['tag']}r{i}"
        state["prompt_len"][rid] = plen
        manager.add_request(input_ids=[int(x) for x in torch.randint(1, VOCAB, (plen,))], request_id=rid,
                            max_new_tokens=new)
        state["requests"].append({"request": rid, "prompt": plen, "max_new_tokens": new})

    def serve(n, tag):
        """One session: requests (prompt length, max_new_tokens, after which forward it joins; 0: before the loop)."""
        plan = [(16, n, 0), (12, max(2, n - 3), 0), (20, max(2, n - 5), 0), (10, max(2, n // 2), 2), (14, 3, 3)]
        log.clear()
        status.clear()
        state.update(tag=tag, joins={}, requests=[], last_join=max(j for _, _, j in plan))
        for i, (plen, new, after) in enumerate(plan):
            if after:
                state["joins"].setdefault(after, []).append((i, (plen, new)))
            else:
                add(i, plen, new)
        watchdog = threading.Timer(300, lambda: status.request_stop(type(status).HARD_STOP, 0))
        watchdog.start()
        try:
            manager._run_generation_loop()  # on this thread, returns once flushed
        finally:
            watchdog.cancel()
        done = {}
        while (r := manager.get_result(timeout=0.01)) is not None:
            done[r.request_id] = r
        for req in state["requests"]:
            r = done.get(req["request"])
            assert r is not None and r.error is None and len(r.generated_tokens) == req["max_new_tokens"], (req, r)
            req["generated"] = len(r.generated_tokens)
        return list(state["requests"])

    torch.manual_seed(2)
    with torch.no_grad():
        serve(spec.steps[0], "warm_")
    sync(ctx.device)

    def capture(n):
        with torch.no_grad(), profile(activities=activities(ctx.device), record_shapes=spec.rs) as prof:
            log.set_rec(True)
            reqs = serve(n, f"n{n}_")
            sync(ctx.device)
            log.set_rec(False)
        t = base_truth(spec, info, f"continuous batching (transformers' ContinuousBatchingManager, paged|sdpa on a "
                                   f"PagedAttentionCache, no CUDA graphs): {len(reqs)} greedy requests, 3 queued at "
                                   "the start and 2 joining after forwards 2 and 3, each leaving at its own "
                                   "max_new_tokens "
                                   f"(longest {n}); every forward packs its requests' tokens into one row, prompts "
                                   f"chunked to {budget} tokens a forward: prefill, decode and mixed forwards",
                       "profile() around one session of the manager's generation loop, run on this thread; a warm-up "
                       "session ran before; the phase of each forward from the scheduled requests (a request whose "
                       "length before the forward is at least its prompt decodes; mixed: decodes and prompt tokens "
                       "in one forward)")
        t["requests"] = reqs
        t["requests_per_forward"] = [len(f.extra["requests"]) for f in log.forwards]
        t["continuous_batching_config"] = {"block_size": 16, "num_blocks": 64, "max_batch_tokens": budget,
                                           "attn_implementation": "paged|sdpa", "use_cuda_graph": False,
                                           "use_async_batching": False}
        t["batch_note"] = "batch: the packed row (1); requests_per_forward and each_forward.requests: the requests"
        return prof, log, t, None

    fit(ctx, spec, capture)


def loop_nocache_hand(ctx: Ctx, spec: Spec) -> None:
    """Hand-written loop without a cache: model(input_ids=the whole sequence, use_cache=False), the argmax token
    appended on the device (torch.cat), no host sync."""
    model = build(spec.family, spec.layers, ctx.device)
    info = layer_info(model, ctx.device)
    log = ForwardLog(model)
    ids0 = prompt(spec.batch, ctx.device)

    def run(n):
        ids = ids0
        with torch.no_grad():
            for _ in range(n):
                logits = model(input_ids=ids, use_cache=False).logits
                ids = torch.cat([ids, logits[:, -1:].argmax(-1)], dim=1)

    run(3)  # warm-up
    sync(ctx.device)

    def capture(n):
        prof = recorded(ctx, spec, log, lambda: run(n))
        return prof, log, base_truth(
            spec, info, f"hand-written loop at batch {spec.batch} without a cache: model(input_ids=the whole "
                        f"sequence, use_cache=False) {n} times ({PROMPT} .. {PROMPT + n - 1} tokens), the argmax token "
                        "appended on the device (torch.cat), no host sync",
            "profile() around the loop; a warm-up loop ran before; no markers"), None

    fit(ctx, spec, capture)


def padded_prompts(batch: int, device: str):
    lengths = [PROMPT - (5 * i) % 9 for i in range(batch)]  # 16, 12, 8(+..) ...: different lengths
    ids = torch.zeros(batch, PROMPT, dtype=torch.long, device=device)
    mask = torch.zeros(batch, PROMPT, dtype=torch.long, device=device)
    for b, n in enumerate(lengths):  # left padding with pad id 0
        ids[b, PROMPT - n:] = torch.randint(1, VOCAB, (n,), device=device)
        mask[b, PROMPT - n:] = 1
    return ids, mask, lengths


def loop_sample_padded(ctx: Ctx, spec: Spec) -> None:
    model = build(spec.family, spec.layers, ctx.device)
    info = layer_info(model, ctx.device)
    log = ForwardLog(model)
    ids, mask, lengths = padded_prompts(spec.batch, ctx.device)
    torch.manual_seed(1)
    with torch.no_grad():
        model.generate(input_ids=ids, attention_mask=mask, **gen_kwargs(3, sample=True))
    sync(ctx.device)

    def capture(n):
        prof = recorded(ctx, spec, log,
                        lambda: model.generate(input_ids=ids, attention_mask=mask, **gen_kwargs(n, sample=True)))
        t = base_truth(spec, info, f"sampling model.generate(do_sample, top_k=50, top_p=0.9, temperature=0.8, "
                                   f"max_new_tokens={n}) at batch {spec.batch}, prompts of {lengths} tokens "
                                   f"left-padded to {PROMPT} (attention_mask zeros)",
                       "profile() around one generate(); a warm-up generate ran before")
        t["prompt_lengths"] = lengths
        return prof, log, t, None

    fit(ctx, spec, capture)


def loop_compiled_generate(ctx: Ctx, spec: Spec) -> None:
    experts = spec.opts.get("experts", "eager")
    if ctx.device != "cuda" and experts == "grouped_mm":
        experts = "eager"
    model = build(spec.family, spec.layers, ctx.device, experts=experts)
    info = layer_info(model, ctx.device)
    log = ForwardLog(model)
    torch._dynamo.config.cache_size_limit = 64
    model.forward = torch.compile(model.forward)  # Inductor default mode; the hooks stay outside the compiled code
    ids = prompt(spec.batch, ctx.device)
    mask = torch.ones_like(ids)
    n0 = spec.steps[0]
    t0 = time.time()
    with torch.no_grad():
        for _ in range(2):  # compiles prefill, first decode (static), later decodes (dynamic KV length)
            model.generate(input_ids=ids, attention_mask=mask, **gen_kwargs(n0))
    sync(ctx.device)
    print(f"{spec.name}: warm-up generates (compilation) {time.time() - t0:.1f} s", flush=True)

    def capture(n):
        prof = recorded(ctx, spec, log, lambda: model.generate(input_ids=ids, attention_mask=mask, **gen_kwargs(n)))
        t = base_truth(spec, info, f"torch.compile(model.forward) (Inductor, default mode); greedy generate("
                                   f"max_new_tokens={n}) at batch {spec.batch}" +
                       (f"; MoE experts_implementation={experts}" if spec.family in MOE else ""),
                       "two warm-up generates compiled every graph first (compilation not in the trace); "
                       "profile() around one generate(); layers counted in an eager forward before compiling")
        t["experts_implementation"] = experts if spec.family in MOE else None
        return prof, log, t, None

    fit(ctx, spec, capture)


def loop_compiled_hand(ctx: Ctx, spec: Spec) -> None:
    from transformers import DynamicCache

    model = build(spec.family, spec.layers, ctx.device)
    info = layer_info(model, ctx.device)
    log = ForwardLog(model)
    torch._dynamo.config.cache_size_limit = 64
    model.forward = torch.compile(model.forward)
    ids0 = prompt(spec.batch, ctx.device)

    def run(n):
        cache = DynamicCache(config=model.config)
        ids = ids0
        with torch.no_grad():
            for _ in range(n):
                logits = model(input_ids=ids, past_key_values=cache, use_cache=True).logits
                ids = logits[:, -1:].argmax(-1)
        return ids

    t0 = time.time()
    for _ in range(2):
        run(spec.steps[0])
    sync(ctx.device)
    print(f"{spec.name}: warm-up loops (compilation) {time.time() - t0:.1f} s", flush=True)

    def capture(n):
        prof = recorded(ctx, spec, log, lambda: run(n))
        return prof, log, base_truth(
            spec, info, f"torch.compile(model.forward); a hand-written loop: model(input_ids, past_key_values="
                        f"DynamicCache) {n} times (the prefill first), argmax on the device, no host sync",
            "two warm-up loops compiled every graph first; profile() around one loop"), None

    fit(ctx, spec, capture)


class StaticDecoder:
    """One decode forward over a StaticCache with every input in a fixed buffer, so it can be captured
    (scripts/make_gpu_fixtures.py's, with transformers 5's device-side KV write counter saved and put back)."""

    def __init__(self, model, batch: int, max_len: int, device: str):
        from transformers import StaticCache

        self.model = model
        self.cache = StaticCache(config=model.config, max_cache_len=max_len)
        self.prompt_ids = prompt(batch, device)
        with torch.no_grad():
            logits = model(input_ids=self.prompt_ids, past_key_values=self.cache, use_cache=True,
                           cache_position=torch.arange(PROMPT, device=device)).logits
        self.first_token = logits[:, -1].argmax(-1)
        self.ids = self.first_token[:, None].clone()
        self.pos = torch.full((1,), PROMPT, dtype=torch.long, device=device)
        self.pos_ids = torch.full((batch, 1), PROMPT, dtype=torch.long, device=device)
        self.mask = torch.zeros(batch, 1, 1, max_len, dtype=torch.bool, device=device)
        self.mask[..., : PROMPT + 1] = True

    def forward(self) -> torch.Tensor:
        with torch.no_grad():
            logits = self.model(input_ids=self.ids, position_ids=self.pos_ids, cache_position=self.pos,
                                attention_mask=self.mask, past_key_values=self.cache, use_cache=True).logits
        return logits[:, -1].argmax(-1)

    def kv_counters(self) -> list:
        return [layer.cumulative_length.clone() for layer in self.cache.layers]

    def restore_kv_counters(self, saved: list) -> None:
        for layer, value in zip(self.cache.layers, saved, strict=True):
            layer.cumulative_length.copy_(value)

    def advance(self, next_token: torch.Tensor) -> None:
        self.ids.copy_(next_token[:, None])
        self.pos.add_(1)
        self.pos_ids.add_(1)
        self.mask.index_fill_(-1, self.pos, True)


def loop_cudagraph(ctx: Ctx, spec: Spec) -> None:
    model = build(spec.family, spec.layers, ctx.device)
    info = layer_info(model, ctx.device)
    log = ForwardLog()  # the replays are logged by the loop (no module call happens)
    n_max = spec.steps[0]
    dec = StaticDecoder(model, spec.batch, PROMPT + n_max + 8, ctx.device)
    saved = dec.kv_counters()
    cuda = ctx.device == "cuda"
    if cuda:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                dec.forward()
        torch.cuda.current_stream().wait_stream(side)
        dec.restore_kv_counters(saved)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_next = dec.forward()
        dec.restore_kv_counters(saved)
        torch.cuda.synchronize()

    def capture(n):
        log.clear()
        dec.restore_kv_counters(saved)
        dec.pos.fill_(PROMPT)
        dec.pos_ids.fill_(PROMPT)
        dec.mask.zero_()
        dec.mask[..., : PROMPT + 1] = True
        dec.ids.copy_(dec.first_token[:, None])
        sync(ctx.device)
        with profile(activities=activities(ctx.device), record_shapes=spec.rs) as prof:
            log.set_rec(True)
            for i in range(n):
                t0, r0, e0 = time.time_ns(), log.rec, log.epoch
                if cuda:
                    graph.replay()
                    nxt = static_next
                else:  # CPU smoke: the same static forward, eagerly
                    nxt = dec.forward()
                log.add(spec.batch, 1, PROMPT + i, "decode", t0, time.time_ns(), r0, e0, replay=i)
                dec.advance(nxt)
            sync(ctx.device)
            log.set_rec(False)
        return prof, log, base_truth(
            spec, info, f"StaticCache; one decode forward + argmax captured with torch.cuda.graph and replayed {n} "
                        f"times at batch {spec.batch}; inputs (token, cache_position, position_ids, 4D bool mask) "
                        "updated in place by small eager kernels between replays; no markers",
            "prefill, 3 warm-up forwards (KV write counters restored) and the capture ran before profile(); each "
            "`each_forward` span is one graph.replay() call" + ("" if cuda else " (CPU smoke: eager forward)")), None

    fit(ctx, spec, capture)


def hand_step(model, ids, cache, item: bool):
    logits = model(input_ids=ids, past_key_values=cache, use_cache=True).logits
    nxt = logits[:, -1:].argmax(-1)
    if item:
        nxt.view(-1)[0].item()  # the host reads a token: aten::item / _local_scalar_dense, a device sync
    return nxt


def loop_hand(ctx: Ctx, spec: Spec) -> None:
    """Hand-written loop with the prefill inside the window (opts: item, prefill_outside)."""
    from transformers import DynamicCache

    model = build(spec.family, spec.layers, ctx.device)
    info = layer_info(model, ctx.device)
    log = ForwardLog(model)
    item = spec.opts.get("item", False)
    outside = spec.opts.get("prefill_outside", False)
    ids0 = prompt(spec.batch, ctx.device)
    with torch.no_grad():  # warm-up
        cache = DynamicCache(config=model.config)
        ids = ids0
        for _ in range(3):
            ids = hand_step(model, ids, cache, item)
    sync(ctx.device)

    def capture(n):
        log.clear()
        with torch.no_grad():
            cache = DynamicCache(config=model.config)
            ids = hand_step(model, ids0, cache, item) if outside else ids0
            sync(ctx.device)
            with profile(activities=activities(ctx.device), record_shapes=spec.rs) as prof:
                log.set_rec(True)
                for _ in range(n):
                    ids = hand_step(model, ids, cache, item)
                sync(ctx.device)
                log.set_rec(False)
        what = (f"hand-written loop at batch {spec.batch}: model(input_ids, past_key_values=DynamicCache) then "
                f"logits[:, -1:].argmax(-1)" + (" and .item() of the first token (a host sync per step)" if item
                                                 else ", the token stays on the device (no host sync)")
                + f"; {n} forwards" + ("; the prefill ran before profiling" if outside else ", the prefill first"))
        return prof, log, base_truth(spec, info, what, "profile() around the loop; a warm-up loop ran before; "
                                                       "no markers"), None

    fit(ctx, spec, capture)


def loop_hand_extend(ctx: Ctx, spec: Spec) -> None:
    """Hand loop inside the window: a prefill of 12 tokens, an extend of 4 more tokens on that cache (chunked
    prefill), then decodes; argmax on the device."""
    from transformers import DynamicCache

    model = build(spec.family, spec.layers, ctx.device)
    info = layer_info(model, ctx.device)
    log = ForwardLog(model)
    ids0 = prompt(spec.batch, ctx.device)
    first, second = ids0[:, :12], ids0[:, 12:]

    def run(n):
        cache = DynamicCache(config=model.config)
        with torch.no_grad():
            model(input_ids=first, past_key_values=cache, use_cache=True)
            ids = hand_step(model, second, cache, False)
            for _ in range(n - 2):
                ids = hand_step(model, ids, cache, False)

    run(4)  # warm-up
    sync(ctx.device)

    def capture(n):
        prof = recorded(ctx, spec, log, lambda: run(n))
        return prof, log, base_truth(
            spec, info, f"hand-written loop at batch {spec.batch}: a prefill of 12 tokens, an extend of the next 4 "
                        f"prompt tokens on the same DynamicCache (chunked prefill), then {n - 2} decode forwards; "
                        "argmax on the device, no host sync",
            "profile() around the loop; a warm-up loop ran before; no markers"), None

    fit(ctx, spec, capture)


def loop_deep(ctx: Ctx, spec: Spec) -> None:
    spec.opts.setdefault("prefill_outside", True)
    loop_hand(ctx, spec)


def loop_profstep_hand(ctx: Ctx, spec: Spec) -> None:
    """schedule(wait=1, warmup=1, active=n) + prof.step() after every forward of a hand loop; the prefill is the
    `wait` step (not recorded)."""
    from transformers import DynamicCache

    model = build(spec.family, spec.layers, ctx.device)
    info = layer_info(model, ctx.device)
    log = ForwardLog(model)
    item = spec.opts.get("item", False)
    ids0 = prompt(spec.batch, ctx.device)

    def capture(n):
        log.clear()
        wait, warmup = 1, 1
        with torch.no_grad(), profile(activities=activities(ctx.device), record_shapes=spec.rs,
                                      schedule=schedule(wait=wait, warmup=warmup, active=n, repeat=1)) as prof:
            cache = DynamicCache(config=model.config)
            ids = ids0
            log.set_rec(prof.current_action in RECORDING)
            for _ in range(wait + warmup + n):
                ids = hand_step(model, ids, cache, item)
                prof.step()
                log.set_rec(prof.current_action in RECORDING)
            sync(ctx.device)
        return prof, log, base_truth(
            spec, info, f"hand-written loop at batch {spec.batch} (argmax{', .item()' if item else ''}), "
                        f"schedule(wait=1, warmup=1, active={n}) and prof.step() after every forward: the prefill "
                        "is the wait step, one decode the warmup step, then one ProfilerStep per decode forward",
            "torch.profiler schedule; the trace holds the active steps"), None

    fit(ctx, spec, capture)


def loop_profstep_generate_hook(ctx: Ctx, spec: Spec) -> None:
    """prof.step() from a forward hook on the model, inside one generate(): one ProfilerStep per forward."""
    model = build(spec.family, spec.layers, ctx.device)
    info = layer_info(model, ctx.device)
    log = ForwardLog(model)
    ids = prompt(spec.batch, ctx.device)
    state = {"prof": None}

    def step_hook(module, args, output):
        p = state["prof"]
        if p is not None:
            p.step()
            log.set_rec(p.current_action in RECORDING)

    model.register_forward_hook(step_hook)  # after ForwardLog.post (registered first)

    def capture(n):
        log.clear()
        wait, warmup = 1, 1
        with torch.no_grad(), profile(activities=activities(ctx.device), record_shapes=spec.rs,
                                      schedule=schedule(wait=wait, warmup=warmup, active=n, repeat=1)) as prof:
            state["prof"] = prof
            log.set_rec(prof.current_action in RECORDING)
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **gen_kwargs(n + 4))
            state["prof"] = None
            sync(ctx.device)
            log.set_rec(False)
        return prof, log, base_truth(
            spec, info, f"greedy generate(max_new_tokens={n + 4}) at batch {spec.batch}; a forward hook on the model "
                        f"calls prof.step() after every forward; schedule(wait=1, warmup=1, active={n}): the prefill "
                        f"waits, the first decode warms up, the next {n} decode forwards are recorded, the last 2 are "
                        "after the window",
            "torch.profiler schedule, prof.step() from a module forward hook"), None

    fit(ctx, spec, capture)


def loop_profstep_wraps_generate(ctx: Ctx, spec: Spec) -> None:
    """One ProfilerStep around a whole generate(): schedule(wait=0, warmup=1, active=1), prof.step() per generate."""
    model = build(spec.family, spec.layers, ctx.device)
    info = layer_info(model, ctx.device)
    log = ForwardLog(model)
    ids = prompt(spec.batch, ctx.device)

    def capture(n):
        log.clear()
        with torch.no_grad(), profile(activities=activities(ctx.device), record_shapes=spec.rs,
                                      schedule=schedule(wait=0, warmup=1, active=1, repeat=1)) as prof:
            log.set_rec(prof.current_action in RECORDING)
            for _ in range(2):
                model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **gen_kwargs(n))
                sync(ctx.device)
                prof.step()
                log.set_rec(prof.current_action in RECORDING)
        return prof, log, base_truth(
            spec, info, f"two greedy generate(max_new_tokens={n}) calls at batch {spec.batch}, prof.step() after "
                        "each; schedule(wait=0, warmup=1, active=1): the second generate is one ProfilerStep holding "
                        f"{n} forwards (1 prefill + {n - 1} decode)",
            "torch.profiler schedule; ProfilerStep#1 spans a whole generate()"), None

    fit(ctx, spec, capture)


def train_iteration(model, opt, data, log: ForwardLog, batch: int, seq: int, it: int, micro: int = 1,
                    layer_calls: list | None = None) -> None:
    """One optimizer step; `micro` > 1: gradient accumulation over that many micro-batches (forward + backward
    each) before it. `layer_calls`: a list the decoder layers' pre-hooks append to (gradient checkpointing)."""
    t0, r0, e0 = time.time_ns(), log.rec, log.epoch
    n = len(log.forwards)
    c0 = len(layer_calls) if layer_calls is not None else 0
    fwd_end = 0
    for _ in range(micro):
        loss = model(input_ids=data, labels=data).loss
        fwd_end = fwd_end or time.time_ns()  # the first micro-batch's forward
        (loss / micro).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    seen = len(log.forwards) - n  # the model's hooks fire once per model call, never for a recompute in backward
    assert seen == micro, f"the model's hooks saw {seen} forwards for {micro} micro-batches"
    del log.forwards[n:]  # the hooks saw the forward; the iteration is logged instead
    extra = {} if layer_calls is None else {"model_forwards": seen, "decoder_layer_calls": len(layer_calls) - c0}
    log.add(batch, seq, 0, "training", t0, time.time_ns(), r0, e0, iteration=it, forward_end_ns_abs=fwd_end,
            micro_batches=micro, **extra)


def loop_train(ctx: Ctx, spec: Spec) -> None:
    """Training iterations (forward with labels, backward, AdamW, zero_grad); opts markers: profstep | none;
    micro: micro-batches per optimizer step (gradient accumulation); checkpointing: gradient checkpointing."""
    batch, seq = 2, 64
    markers = spec.opts.get("markers", "profstep")
    micro = spec.opts.get("micro", 1)
    model = build(spec.family, spec.layers, ctx.device).train()
    info = layer_info(model, ctx.device)  # before checkpointing: one plain forward
    log = ForwardLog(model, training=True)
    layer_calls = None
    if spec.opts.get("checkpointing"):
        model.gradient_checkpointing_enable()  # torch.utils.checkpoint (non-reentrant) around each decoder layer
        layer_calls = []
        for m in decoder_layers(model):  # a pre-hook: a recompute may stop before the layer returns
            m.register_forward_pre_hook(lambda *a: layer_calls.append(1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = torch.randint(1, VOCAB, (batch, seq), device=ctx.device)
    train_iteration(model, opt, data, log, batch, seq, -1, micro, layer_calls)  # optimizer state, autograd warm-up
    if layer_calls is not None:  # every layer ran twice: in the forward and again in the backward
        calls = log.forwards[-1].extra["decoder_layer_calls"]
        assert calls == 2 * info["layers"] * micro, f"{calls} decoder-layer calls for {info['layers']} layers"
    sync(ctx.device)

    def capture(n):
        log.clear()
        if markers == "profstep":
            wait, warmup = 1, 1
            with profile(activities=activities(ctx.device), record_shapes=spec.rs,
                         schedule=schedule(wait=wait, warmup=warmup, active=n, repeat=1)) as prof:
                log.set_rec(prof.current_action in RECORDING)
                for it in range(wait + warmup + n):
                    train_iteration(model, opt, data, log, batch, seq, it, micro, layer_calls)
                    prof.step()
                    log.set_rec(prof.current_action in RECORDING)
                sync(ctx.device)
            how = f"schedule(wait=1, warmup=1, active={n}) + prof.step() per iteration: ProfilerStep#2.. per iteration"
        else:
            with profile(activities=activities(ctx.device), record_shapes=spec.rs) as prof:
                log.set_rec(True)
                for it in range(n):
                    train_iteration(model, opt, data, log, batch, seq, it, micro, layer_calls)
                sync(ctx.device)
                log.set_rec(False)
            how = "plain profile() around the iterations: no ProfilerStep, no marker"
        accum = f"{micro} micro-batches (forward, backward) per optimizer step; " if micro > 1 else ""
        ckpt = ("gradient checkpointing (every decoder layer's forward runs again inside the backward); "
                if layer_calls is not None else "")
        t = base_truth(spec, info, f"training: forward with labels (cross-entropy), loss.backward(), AdamW step, "
                                   f"zero_grad; {ckpt}{accum}batch {batch} x {seq} tokens; {n} iterations in the "
                                   "window", how + "; one unprofiled iteration ran first", workload="training")
        t["iterations_note"] = "steps.training counts whole iterations; each_forward spans whole iterations"
        if layer_calls is not None:
            t["gradient_checkpointing"] = {
                "model_forwards_per_iteration": micro, "decoder_layer_calls_per_iteration": 2 * info["layers"] * micro,
                "note": "pre-hooks on the model and on the decoder layers: the model is called once per iteration "
                        "(no extra forward); each layer's forward runs in the forward and again in the backward"}
        return prof, log, t, None

    fit(ctx, spec, capture)


def loop_train_checkpointed(ctx: Ctx, spec: Spec) -> None:
    """loop_train with no marker under gradient checkpointing: the backward recomputes each decoder layer's
    forward, so the trace holds every layer's forward kernels twice an iteration but one model call."""
    spec.opts.setdefault("markers", "none")
    spec.opts["checkpointing"] = True
    loop_train(ctx, spec)


def loop_midstep(ctx: Ctx, spec: Spec) -> None:
    """prof.start() from a decoder-layer hook in forward `a`, prof.stop() from the same hook in forward `b`: the
    first and last forwards of the window are partial."""
    from transformers import DynamicCache

    model = build(spec.family, spec.layers, ctx.device)
    info = layer_info(model, ctx.device)
    log = ForwardLog(model)
    layers = decoder_layers(model)
    mid = len(layers) // 2
    item = spec.opts.get("item", False)
    ids0 = prompt(spec.batch, ctx.device)
    state = {"prof": None, "start_at": -1, "stop_at": -1, "events": []}

    def edge(module, args, output):
        p, i = state["prof"], len(log.forwards) - 1
        if p is None:
            return
        if i == state["start_at"]:
            p.start()
            log.set_rec(True)
            state["events"].append(("start", i, time.time_ns()))
        elif i == state["stop_at"]:
            log.set_rec(False)
            p.stop()
            state["events"].append(("stop", i, time.time_ns()))

    layers[mid].register_forward_hook(edge)

    def capture(n):
        log.clear()
        state["events"].clear()
        prof = profile(activities=activities(ctx.device), record_shapes=spec.rs)
        state.update(prof=prof, start_at=2, stop_at=2 + n + 1)
        with torch.no_grad():
            cache = DynamicCache(config=model.config)
            ids = ids0
            for _ in range(n + 5):  # prefill, a decode, [start inside #2], n whole, [stop inside #n+3], one more
                ids = hand_step(model, ids, cache, item)
        sync(ctx.device)
        state["prof"] = None
        t = base_truth(spec, info, f"hand-written loop at batch {spec.batch} (argmax{', .item()' if item else ''}); "
                                   f"prof.start() is called from a forward hook on decoder layer {mid} (0-based) in "
                                   f"forward 2 and prof.stop() from the same hook in forward {n + 3}: the window "
                                   f"begins and ends mid-forward; {n} forwards lie wholly inside it",
                       "profile() object started and stopped by hand from the hook; no markers")
        t["window_edges"] = {"layer_hook": mid, "start_in_forward": 2, "stop_in_forward": n + 3}
        return prof, log, t, None

    fit(ctx, spec, capture)


RECORD_APP = '''"""An unmodified decode script for `decodegap record` (no profiler code): greedy generate on a
tiny {family}. It logs its model forwards (pre-hook / hook times, tokens, KV length) to FORWARD_LOG for the
corpus truth."""
import json, os, sys, time
sys.path.insert(0, {scripts!r})
import torch
from make_accuracy_corpus import build, prompt, ForwardLog

device = {device!r}
model = build({family!r}, {layers}, device)
log = ForwardLog(model)
log.rec = True
ids = prompt({batch}, device)
with torch.no_grad():
    model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens={tokens},
                   min_new_tokens={tokens}, do_sample=False, pad_token_id=0, disable_compile=True)
if device == "cuda":
    torch.cuda.synchronize()
with open(os.environ["FORWARD_LOG"], "w") as f:
    json.dump({{"forwards": [vars(x) for x in log.forwards]}}, f)
'''


def loop_record(ctx: Ctx, spec: Spec) -> None:
    """`decodegap record --target <ModelForCausalLM>.forward` around an unmodified generate script."""
    import transformers

    warmup, timed, steps = 4, 3, spec.steps[0]
    tokens = warmup + timed + steps + 3
    model_cls = {"llama": "LlamaForCausalLM", "mixtral": "MixtralForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM",
                 "qwen3": "Qwen3ForCausalLM", "jamba": "JambaForCausalLM"}[spec.family]
    module = getattr(transformers, model_cls).__module__
    target = f"{module}:{model_cls}.forward"
    work = tempfile.mkdtemp(prefix=f"rec_{spec.name}_")
    app = os.path.join(work, "decode_app.py")
    with open(app, "w") as f:
        f.write(RECORD_APP.format(family=spec.family, scripts=HERE, device=ctx.device, layers=spec.layers,
                                  batch=spec.batch, tokens=tokens))
    out = os.path.join(work, "traces")
    flog = os.path.join(work, "forwards.json")
    env = dict(os.environ, FORWARD_LOG=flog)
    src = os.environ.get("DECODEGAP_SRC") or os.path.join(REPO, "src")  # a snapshot, if the tree is mid-edit
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, "-m", "decodegap", "record", "--target", target, "--warmup", str(warmup),
           "--timed-steps", str(timed), "--steps", str(steps), "--out", out,
           "--record-shapes" if spec.rs else "--no-record-shapes", "--", sys.executable, app]
    t0 = time.time()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    print(f"{spec.name}: decodegap record rc {r.returncode} in {time.time() - t0:.1f} s\n{r.stderr[-1500:]}",
          flush=True)
    r.check_returncode()
    traces = [os.path.join(out, x) for x in os.listdir(out) if x.endswith(".json.gz")]
    assert len(traces) == 1, traces
    raw = os.path.join(ctx.out_dir, f"{spec.name}.raw.json")
    with gzip.open(traces[0], "rb") as src_f, open(raw, "wb") as dst:
        dst.write(src_f.read())
    data = json.load(open(flog))
    info = layer_info(build(spec.family, spec.layers, ctx.device), ctx.device)  # the same model, in this process
    log = ForwardLog()
    first, last = warmup + timed, warmup + timed + steps  # record's profiled calls: [W+K, W+K+N)
    for i, d in enumerate(data["forwards"]):
        inside = first <= i < last
        log.forwards.append(Fwd(d["batch"], d["tokens"], d["cached_before"], d["phase"], d["t0"], inside, 0,
                                d["t1"], inside, 0, {"call_index": i}))
    t = base_truth(spec, info, f"unmodified script: greedy generate(max_new_tokens={tokens}) at batch "
                                       f"{spec.batch}; run under `decodegap record --target {target} --warmup "
                                       f"{warmup} --timed-steps {timed} --steps {steps}`",
                   "decodegap record wraps the model class's forward: calls W+K .. W+K+N-1 (0-based, the prefill is "
                   "call 0) run under torch.profiler, each in a ProfilerStep; the script's own hooks log every forward")
    t["record_command"] = " ".join(cmd[1:-2]) + " -- python3 decode_app.py"
    t["forwards_outside_window"] = len(data["forwards"]) - steps
    t["size_knob"] = steps
    save(None, ctx.out_dir, spec.name, log, t, raw)
    check_one_step_per_forward(ctx.out_dir, spec.name)


def check_one_step_per_forward(out_dir: str, name: str) -> None:
    """Each whole forward of a record trace holds the start of exactly one ProfilerStep (CPU side): the call
    indices of the truth agree with record's window (raises if not)."""
    path = os.path.join(out_dir, name)
    truth = json.load(open(path + ".truth.json"))
    doc = load_doc(path + ".json.gz")
    starts = [e["ts"] * 1000 for e in doc["traceEvents"]
              if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("ProfilerStep#")]
    per = [sum(f["cpu_start_ns"] <= s <= f["cpu_end_ns"] for s in starts) for f in truth["each_forward"]]
    want = [1 if f["window"] == "whole" else 0 for f in truth["each_forward"]]
    truth["profiler_step_starts_per_forward"] = per
    write_truth(out_dir, name, truth)
    assert per == want, f"{name}: ProfilerStep starts per forward {per}, want {want}"


# the ninth holdout's loops: plain PyTorch (gpt-fast style), encoder-decoders, generate variants -------------------
class PlainRMSNorm(torch.nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(dim))

    def forward(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def plain_rope(seq_len: int, n_elem: int, base: float) -> torch.Tensor:
    """gpt-fast's precompute_freqs_cis: cos/sin pairs per position, [seq_len, n_elem / 2, 2]."""
    freqs = 1.0 / (base ** (torch.arange(0, n_elem, 2)[: (n_elem // 2)].float() / n_elem))
    freqs = torch.outer(torch.arange(seq_len, device=freqs.device), freqs)
    cis = torch.polar(torch.ones_like(freqs), freqs)
    return torch.stack([cis.real, cis.imag], dim=-1)


def plain_apply_rope(x: torch.Tensor, cis: torch.Tensor) -> torch.Tensor:
    xs = x.float().reshape(*x.shape[:-1], -1, 2)
    cis = cis.view(1, xs.size(1), 1, xs.size(3), 2)
    out = torch.stack([xs[..., 0] * cis[..., 0] - xs[..., 1] * cis[..., 1],
                       xs[..., 1] * cis[..., 0] + xs[..., 0] * cis[..., 1]], -1)
    return out.flatten(3).type_as(x)


class PlainKVCache(torch.nn.Module):
    """gpt-fast's KVCache: two preallocated buffers [batch, kv heads, max_seq, head_dim], written at input_pos."""

    def __init__(self, batch: int, max_seq: int, heads: int, head_dim: int, dtype, device):
        super().__init__()
        shape = (batch, heads, max_seq, head_dim)
        self.register_buffer("k_cache", torch.zeros(shape, dtype=dtype, device=device))
        self.register_buffer("v_cache", torch.zeros(shape, dtype=dtype, device=device))

    def update(self, input_pos, k, v):
        self.k_cache[:, :, input_pos] = k
        self.v_cache[:, :, input_pos] = v
        return self.k_cache, self.v_cache


class PlainAttention(torch.nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.dim, self.n_head, self.n_local = c["dim"], c["n_head"], c["n_local_heads"]
        self.head_dim = self.dim // self.n_head
        self.wqkv = torch.nn.Linear(self.dim, (self.n_head + 2 * self.n_local) * self.head_dim, bias=False)
        self.wo = torch.nn.Linear(self.dim, self.dim, bias=False)
        self.kv_cache = None

    def forward(self, x, cis, mask, input_pos):
        bsz, seqlen, _ = x.shape
        kv = self.n_local * self.head_dim
        q, k, v = self.wqkv(x).split([self.dim, kv, kv], dim=-1)
        q = plain_apply_rope(q.view(bsz, seqlen, self.n_head, self.head_dim), cis)
        k = plain_apply_rope(k.view(bsz, seqlen, self.n_local, self.head_dim), cis)
        v = v.view(bsz, seqlen, self.n_local, self.head_dim)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if self.kv_cache is not None and input_pos is not None:
            k, v = self.kv_cache.update(input_pos, k, v)
        k = k.repeat_interleave(self.n_head // self.n_local, dim=1)
        v = v.repeat_interleave(self.n_head // self.n_local, dim=1)
        if mask is None:
            y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            y = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0)
        return self.wo(y.transpose(1, 2).contiguous().view(bsz, seqlen, self.dim))


class PlainFFN(torch.nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = torch.nn.Linear(dim, hidden, bias=False)
        self.w3 = torch.nn.Linear(dim, hidden, bias=False)
        self.w2 = torch.nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.w2(torch.nn.functional.silu(self.w1(x)) * self.w3(x))


class PlainMoE(torch.nn.Module):
    """Router top-k of E, then a loop over every expert: torch.where picks its (token, slot) pairs (a host sync), an
    expert with none is skipped, the others run on their tokens and index_add_ their weighted output."""

    def __init__(self, dim: int, hidden: int, experts: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.gate = torch.nn.Linear(dim, experts, bias=False)
        self.experts = torch.nn.ModuleList(PlainFFN(dim, hidden) for _ in range(experts))

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        scores = torch.nn.functional.softmax(self.gate(x), dim=-1, dtype=torch.float)
        weights, chosen = torch.topk(scores, self.top_k, dim=-1)
        weights = (weights / weights.sum(-1, keepdim=True)).to(x.dtype)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            token, slot = torch.where(chosen == e)
            if token.numel() == 0:
                continue
            out.index_add_(0, token, expert(x[token]) * weights[token, slot, None])
        return out.view(shape)


class PlainBlock(torch.nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.attention_norm = PlainRMSNorm(c["dim"], c["norm_eps"])
        self.attention = PlainAttention(c)
        self.ffn_norm = PlainRMSNorm(c["dim"], c["norm_eps"])
        self.feed_forward = (PlainMoE(c["dim"], c["intermediate_size"], c["experts"], c["top_k"]) if c.get("experts")
                             else PlainFFN(c["dim"], c["intermediate_size"]))

    def forward(self, x, cis, mask, input_pos):
        h = x + self.attention(self.attention_norm(x), cis, mask, input_pos)
        return h + self.feed_forward(self.ffn_norm(h))


class PlainTransformer(torch.nn.Module):
    """gpt-fast's Transformer: forward(idx, input_pos) over the caches of setup_caches (the causal-mask rows and rotary
    pairs of input_pos); forward(idx, targets=...) without caches: causal SDPA and the cross-entropy (nanoGPT)."""

    def __init__(self, c: dict, layers: int):
        super().__init__()
        self.c = c
        self.tok_embeddings = torch.nn.Embedding(c["vocab_size"], c["dim"])
        self.layers = torch.nn.ModuleList(PlainBlock(c) for _ in range(layers))
        self.norm = PlainRMSNorm(c["dim"], c["norm_eps"])
        self.output = torch.nn.Linear(c["dim"], c["vocab_size"], bias=False)
        self.freqs_cis = plain_rope(512, c["dim"] // c["n_head"], c["rope_base"])
        self.causal_mask = None

    def _apply(self, fn, *args, **kwargs):  # .to() moves the rotary table too (a plain attribute, as gpt-fast's)
        out = super()._apply(fn, *args, **kwargs)
        self.freqs_cis = fn(self.freqs_cis)
        return out

    def setup_caches(self, batch: int, max_seq: int) -> None:
        w = self.output.weight
        for b in self.layers:
            b.attention.kv_cache = PlainKVCache(batch, max_seq, self.c["n_local_heads"],
                                                self.c["dim"] // self.c["n_head"], w.dtype, w.device)
        self.causal_mask = torch.tril(torch.ones(max_seq, max_seq, dtype=torch.bool, device=w.device))

    def forward(self, idx, input_pos=None, targets=None):
        if input_pos is None:
            cis, mask = self.freqs_cis[: idx.shape[1]], None
        else:
            cis, mask = self.freqs_cis[input_pos], self.causal_mask[None, None, input_pos]
        x = self.tok_embeddings(idx)
        for layer in self.layers:
            x = layer(x, cis, mask, input_pos)
        logits = self.output(self.norm(x))
        if targets is None:
            return logits
        return logits, torch.nn.functional.cross_entropy(logits.float().view(-1, logits.size(-1)),
                                                         targets.reshape(-1))


def build_plain(family: str, layers: int, device: str, dtype=None) -> PlainTransformer:
    torch.manual_seed(0)
    model = PlainTransformer(dict(FAMILIES[family][1]), layers)
    if dtype is None:
        dtype = torch.bfloat16 if device == "cuda" else torch.float32
    return model.to(device=device, dtype=dtype).eval()


def block_layer_info(blocks: list, forward, extra: dict | None = None) -> dict:
    """layer_info for stacks outside transformers' decoder-only models: hooks on `blocks` count the calls in one
    forward (`forward()`), and the blocks are grouped by the (submodule name, class) pairs inside them."""
    calls = []
    handles = [m.register_forward_hook(lambda *a: calls.append(1)) for m in blocks]
    with torch.no_grad():
        forward()
    for h in handles:
        h.remove()
    sigs = [tuple(sorted((n, type(s).__name__) for n, s in m.named_modules() if n)) for m in blocks]
    groups: dict[tuple, list[int]] = {}
    for i, s in enumerate(sigs):
        groups.setdefault(s, []).append(i)
    common = set.intersection(*(set(s) for s in groups)) if groups else set()
    detail = [{"count": len(idx), "layers": idx, "class": type(blocks[idx[0]]).__name__,
               "own_submodules": sorted({f"{n}:{c}" for n, c in sig} - {f"{n}:{c}" for n, c in common})[:12]}
              for sig, idx in groups.items()]
    info = {"layers": len(calls), "layer_kinds": sorted(len(v) for v in groups.values()), "layer_kind_detail": detail,
            "config_info": {}, "decoder_layer_modules": len(blocks)}
    info.update(extra or {})
    return info


def plain_layer_info(model: PlainTransformer, device: str) -> dict:
    c = model.c
    info = {k: c[k] for k in ("experts", "top_k") if k in c}
    return block_layer_info(list(model.layers), lambda: model(torch.randint(0, VOCAB, (1, 4), device=device)),
                            {"model_class": type(model).__name__, "config_info": info})


def plain_pick(logits: torch.Tensor, sample: bool, temperature: float = 0.8, top_k: int = 200) -> torch.Tensor:
    """gpt-fast's sample(): greedy argmax, or top-k sampling by the exponential trick (no host sync)."""
    logits = logits[:, -1]
    if not sample:
        return torch.argmax(logits, dim=-1, keepdim=True).to(torch.int)
    logits = logits / max(temperature, 1e-5)
    v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
    logits = torch.where(logits < v.select(-1, -1).unsqueeze(-1), -float("Inf"), logits)
    probs = torch.nn.functional.softmax(logits, dim=-1)
    q = torch.empty_like(probs).exponential_(1)
    return torch.argmax(probs / q, dim=-1, keepdim=True).to(torch.int)


def plain_decode_one(model, x, input_pos, sample: bool):
    return plain_pick(model(x, input_pos), sample)


def loop_plain_hand(ctx: Ctx, spec: Spec) -> None:
    """gpt-fast's generate() in eager mode on a plain-PyTorch model: setup_caches(batch, max_seq), a prefill of the
    prompt at input_pos = arange(16), then decodes of one token at a device-side input_pos (+= 1 in place), each
    under sdpa_kernel(MATH) as gpt-fast's decode_n_tokens; greedy argmax or gpt-fast's top-k sampling (opts sample);
    no host sync but the MoE's torch.where. The KV length is counted on the host (the caches are plain buffers)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    model = build_plain(spec.family, spec.layers, ctx.device)
    info = plain_layer_info(model, ctx.device)
    sample = spec.opts.get("sample", False)
    max_seq = PROMPT + spec.steps[0] + 8
    model.setup_caches(spec.batch, max_seq)
    log = ForwardLog(model)
    kv = [0]
    log.cached_override = lambda: kv[0]
    ids0 = prompt(spec.batch, ctx.device)

    def run(n):
        kv[0] = 0
        with torch.no_grad():
            tok = plain_pick(model(ids0, torch.arange(0, PROMPT, device=ctx.device)), sample)
            kv[0] = PROMPT
            input_pos = torch.tensor([PROMPT], device=ctx.device, dtype=torch.int)
            for _ in range(n - 1):
                with sdpa_kernel([SDPBackend.MATH]):
                    tok = plain_decode_one(model, tok.view(spec.batch, -1), input_pos, sample).clone()
                kv[0] += 1
                input_pos += 1

    torch.manual_seed(3)
    run(4)  # warm-up
    sync(ctx.device)

    def capture(n):
        prof = recorded(ctx, spec, log, lambda: run(n))
        t = base_truth(spec, info, f"plain PyTorch (no transformers), gpt-fast's generate in eager mode at batch "
                                   f"{spec.batch}: a prefill of {PROMPT} tokens, then {n - 1} decodes, every forward "
                                   f"over the preallocated {max_seq}-position KV-cache tensors (masked); "
                                   + ("gpt-fast's top-k sampling (exponential trick, on the device)" if sample
                                      else "greedy argmax on the device") + "; no markers",
                       "profile() around one generation; a warm-up generation ran before; hooks on the model and its "
                       "blocks; KV length counted on the host")
        t["max_seq_length"] = max_seq
        return prof, log, t, None

    fit(ctx, spec, capture)


def loop_plain_reduce_overhead(ctx: Ctx, spec: Spec) -> None:
    """gpt-fast's --compile: decode_one_token = torch.compile(decode_one_token, mode="reduce-overhead",
    fullgraph=True) (forward + sampling, replayed by Inductor's CUDA graph trees), the prefill eager; the decode's
    input_pos a device tensor advanced in place. No module hooks (they would be traced): the loop logs each call's
    span, the prefill's and every compiled decode's (forward + sampling). Compilation and graph recording ran in two
    warm-up generations outside the trace."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    model = build_plain(spec.family, spec.layers, ctx.device)
    info = plain_layer_info(model, ctx.device)  # eager, before compiling
    sample = spec.opts.get("sample", False)
    max_seq = PROMPT + spec.steps[0] + 8
    model.setup_caches(spec.batch, max_seq)
    log = ForwardLog()
    torch._dynamo.config.cache_size_limit = 64
    decode_one = torch.compile(plain_decode_one, mode="reduce-overhead", fullgraph=True)
    ids0 = prompt(spec.batch, ctx.device)

    def run(n):
        with torch.no_grad():
            t0, r0, e0 = time.time_ns(), log.rec, log.epoch
            tok = plain_pick(model(ids0, torch.arange(0, PROMPT, device=ctx.device)), sample)
            log.add(spec.batch, PROMPT, 0, "prefill", t0, time.time_ns(), r0, e0, compiled=False)
            input_pos = torch.tensor([PROMPT], device=ctx.device, dtype=torch.int)
            for i in range(n - 1):
                t0, r0, e0 = time.time_ns(), log.rec, log.epoch
                with sdpa_kernel([SDPBackend.MATH]):
                    torch.compiler.cudagraph_mark_step_begin()
                    tok = decode_one(model, tok.view(spec.batch, -1), input_pos, sample).clone()
                log.add(spec.batch, 1, PROMPT + i, "decode", t0, time.time_ns(), r0, e0, compiled=True)
                input_pos += 1

    torch.manual_seed(3)
    warm_up(ctx, spec, run, "generations")

    def capture(n):
        prof = recorded(ctx, spec, log, lambda: run(n))
        t = base_truth(spec, info, f"plain PyTorch, gpt-fast's generate with --compile at batch {spec.batch}: an "
                                   f"eager prefill of {PROMPT} tokens, then {n - 1} decodes through decode_one_token "
                                   "compiled with mode='reduce-overhead', fullgraph=True (forward + "
                                   + ("top-k sampling" if sample else "argmax") + " in one CUDA graph tree replay "
                                   f"a decode), over {max_seq}-position KV-cache buffers; no markers",
                       "two warm-up generations compiled and recorded the graphs first (not in the trace); profile() "
                       "around one generation; each_forward spans are the loop's calls (the prefill forward + "
                       "sampling; one compiled decode_one_token), logged by the loop, not by hooks")
        t["cuda_graph_replays_expected"] = n - 1 if ctx.device == "cuda" else 0
        t["max_seq_length"] = max_seq
        return prof, log, t, None

    fit_replayed(ctx, spec, capture)


def loop_plain_train(ctx: Ctx, spec: Spec) -> None:
    """nanoGPT-style training of the plain-PyTorch model: fp32 weights, torch.compile(model) (Inductor, default mode;
    the loss inside the compiled forward), forward under torch.autocast(bfloat16), loss.backward(),
    clip_grad_norm_(1.0), AdamW (fused on CUDA), zero_grad; schedule(wait=1, warmup=1, active=n) and prof.step() per
    iteration. The iterations are logged by the loop (no hooks in compiled code)."""
    batch, seq = 4, 128
    model = build_plain(spec.family, spec.layers, ctx.device, dtype=torch.float32).train()
    info = plain_layer_info(model, ctx.device)  # eager, before compiling
    torch._dynamo.config.cache_size_limit = 64
    compiled = torch.compile(model)
    cuda = ctx.device == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=cuda)
    log = ForwardLog(training=True)
    data = torch.randint(1, VOCAB, (batch, seq + 1), device=ctx.device)
    x, y = data[:, :-1].contiguous(), data[:, 1:].contiguous()

    def iteration(it):
        t0, r0, e0 = time.time_ns(), log.rec, log.epoch
        with torch.autocast(device_type=ctx.device, dtype=torch.bfloat16):
            _, loss = compiled(x, targets=y)
        fwd_end = time.time_ns()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        log.add(batch, seq, 0, "training", t0, time.time_ns(), r0, e0, iteration=it, forward_end_ns_abs=fwd_end,
                micro_batches=1)

    t0 = time.time()
    for i in range(2):
        iteration(-2 + i)  # compilation (forward and backward graphs), optimizer state
    sync(ctx.device)
    print(f"{spec.name}: warm-up iterations (compilation) {time.time() - t0:.1f} s", flush=True)

    def capture(n):
        log.clear()
        wait, warmup = 1, 1
        with profile(activities=activities(ctx.device), record_shapes=spec.rs,
                     schedule=schedule(wait=wait, warmup=warmup, active=n, repeat=1)) as prof:
            log.set_rec(prof.current_action in RECORDING)
            for it in range(wait + warmup + n):
                iteration(it)
                prof.step()
                log.set_rec(prof.current_action in RECORDING)
            sync(ctx.device)
        t = base_truth(spec, info, f"plain PyTorch training, nanoGPT style: torch.compile(model) (forward + "
                                   f"cross-entropy in the compiled graph; its backward compiled too), bf16 autocast "
                                   f"over fp32 weights, clip_grad_norm_, AdamW{' (fused)' if cuda else ''}; batch "
                                   f"{batch} x {seq} tokens; {n} iterations in the window",
                       f"schedule(wait=1, warmup=1, active={n}) + prof.step() per iteration: one ProfilerStep an "
                       "iteration; two unprofiled iterations compiled first", workload="training")
        t["iterations_note"] = "steps.training counts whole iterations (one optimizer step each); each_forward spans " \
                               "whole iterations"
        return prof, log, t, None

    fit(ctx, spec, capture)


class Seq2SeqLog(ForwardLog):
    """Forwards of an encoder-decoder in generate(): the model's hooks see the decoder forwards (generate runs the
    encoder once, through get_encoder(), before the first); hooks on the encoder time it. The encoder's run is folded
    into the next decoder forward: that step (the prefill) spans from the encoder's start to the decoder's end."""

    def __init__(self, model):
        super().__init__(model)
        self.pending = None
        self.encoder_runs = 0
        enc = model.get_encoder()
        enc.register_forward_pre_hook(self.enc_pre, prepend=True)
        enc.register_forward_hook(self.enc_post, always_call=True)

    def enc_pre(self, module, args):
        self.pending = [time.time_ns(), self.rec, self.epoch, 0]

    def enc_post(self, module, args, output):
        self.pending[3] = time.time_ns()
        self.encoder_runs += 1

    def pre(self, module, args, kwargs):
        t0 = time.time_ns()
        ids = kwargs["decoder_input_ids"]
        past = kwargs.get("past_key_values")
        cached = 0 if past is None else int(past.get_seq_length())
        tokens = int(ids.shape[1])
        phase = "prefill" if cached == 0 else ("decode" if tokens == 1 else "extend")
        extra = {"decoder_cpu_start_ns_abs": t0, "encoder_folded_in": self.pending is not None}
        rec0, ep0 = self.rec, self.epoch
        if self.pending is not None:
            e0, erec, eep, e1 = self.pending
            extra.update(encoder_cpu_start_ns_abs=e0, encoder_cpu_end_ns_abs=e1)
            t0, rec0, ep0 = e0, erec, eep
            self.pending = None
        self.forwards.append(Fwd(int(ids.shape[0]), tokens, cached, phase, t0, rec0, ep0, extra=extra))


def build_seq2seq(family: str, layers: int, device: str):
    import transformers
    from transformers import AutoModelForSeq2SeqLM, AutoModelForSpeechSeq2Seq

    cname, kw, _ = FAMILIES[family]
    if family in ("t5", "switch_transformers", "umt5"):  # the T5 line: the encoder as deep as the decoder (HOLDOUT9)
        config = getattr(transformers, cname)(**dict(kw, num_layers=layers, num_decoder_layers=layers))
    else:
        config = getattr(transformers, cname)(**dict(kw, decoder_layers=layers))
    torch.manual_seed(0)
    auto = AutoModelForSpeechSeq2Seq if family == "whisper" else AutoModelForSeq2SeqLM
    model = auto.from_config(config, attn_implementation="eager" if family in EAGER_ATTENTION else "sdpa")
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    return model.to(device=device, dtype=dtype).eval()


def loop_seq2seq_generate(ctx: Ctx, spec: Spec) -> None:
    """Greedy generate() of an encoder-decoder (BART on a 16-token prompt; Whisper on 30 s of random log-mel
    features): generate runs the encoder once, then one decoder forward per new token, the first on the decoder's
    start token with an empty self-attention cache (it also fills the cross-attention cache from the encoder's
    states), the others one token each. A step is a decoder forward; the encoder's forward is folded into the first
    one: the prefill step spans the encoder and that decoder forward (the truth's `encoder` says when each ran)."""
    model = build_seq2seq(spec.family, spec.layers, ctx.device)
    dec, enc = model.get_decoder(), model.get_encoder()
    dtype = next(model.parameters()).dtype
    if spec.family == "whisper":
        feats = torch.randn(spec.batch, model.config.num_mel_bins, 2 * model.config.max_source_positions,
                            device=ctx.device, dtype=dtype)
        inputs = {"input_features": feats}
        source = f"{feats.shape[-1]} log-mel frames ({model.config.max_source_positions} encoder positions)"
    else:
        ids = prompt(spec.batch, ctx.device)
        inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        source = f"a {PROMPT}-token prompt"
    start = model.config.decoder_start_token_id
    enc_calls = []
    enc_blocks, dec_blocks = (list(getattr(m, "layers", None) or m.block) for m in (enc, dec))  # T5: `block`
    handles = [m.register_forward_hook(lambda *a: enc_calls.append(1)) for m in enc_blocks]
    info = block_layer_info(dec_blocks, lambda: model(**inputs, decoder_input_ids=torch.full(
        (spec.batch, 1), start, device=ctx.device)), {"model_class": type(model).__name__})
    for h in handles:
        h.remove()
    info["encoder_layers"] = len(enc_calls)
    cfg = model.config
    info["config_info"] = {"encoder_layers": getattr(cfg, "encoder_layers", None) or cfg.num_layers,
                           "decoder_layers": getattr(cfg, "decoder_layers", None) or cfg.num_decoder_layers}
    if spec.family in ("switch_transformers", "nllb_moe"):
        info["config_info"].update(num_experts=cfg.num_experts, decoder_sparse_step=cfg.decoder_sparse_step)
    log = Seq2SeqLog(model)
    kw = dict(do_sample=False, pad_token_id=model.config.pad_token_id)
    with torch.no_grad():
        model.generate(**inputs, **dict(kw, max_new_tokens=3, min_new_tokens=3))  # warm-up
    sync(ctx.device)

    def capture(n):
        log.encoder_runs = 0
        prof = recorded(ctx, spec, log, lambda: model.generate(**inputs, **dict(kw, max_new_tokens=n,
                                                                                min_new_tokens=n)))
        assert log.encoder_runs == 1, log.encoder_runs
        t = base_truth(spec, info, f"encoder-decoder greedy generate(max_new_tokens={n}) at batch {spec.batch} on "
                                   f"{source}: the encoder ({info['encoder_layers']} layers) once, then {n} decoder "
                                   f"forwards ({info['layers']} layers each, self-attention on an "
                                   "EncoderDecoderCache, cross-attention over the encoder's states); no step markers",
                       "profile() around one generate(); a warm-up generate ran before; hooks on the model (decoder "
                       "forwards), on its encoder, and on the decoder layers")
        t["step_rule"] = ("a step is one decoder forward (the model's forward in generate's loop). The encoder runs "
                          "once, before the first decoder forward, and is folded into it: the prefill step (the "
                          "start token on an empty self-attention cache, the cross-attention K/V of the encoder's "
                          "states computed and cached) spans from the encoder's start to that decoder forward's end; "
                          "each_forward[0] has encoder_cpu_start_ns / encoder_cpu_end_ns and decoder_cpu_start_ns. "
                          "layers and layer_kinds are the decoder's; the encoder's layer count is encoder_layers")
        return prof, log, t, None

    fit(ctx, spec, capture)


def loop_sample_multi(ctx: Ctx, spec: Spec) -> None:
    """generate(do_sample, num_return_sequences=opts returns, default 3) at batch b: generate expands the prompt rows
    to b x returns before the prefill, so every forward runs that many sequences."""
    k = spec.opts.get("returns", 3)
    model = build(spec.family, spec.layers, ctx.device)
    info = layer_info(model, ctx.device)
    log = ForwardLog(model)
    ids = prompt(spec.batch, ctx.device)
    torch.manual_seed(1)

    def run(n):
        return model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), num_return_sequences=k,
                              **gen_kwargs(n, sample=True))

    with torch.no_grad():
        run(3)
    sync(ctx.device)

    def capture(n):
        prof = recorded(ctx, spec, log, lambda: run(n))
        t = base_truth(spec, info, f"sampling model.generate(do_sample, top_k=50, top_p=0.9, temperature=0.8, "
                                   f"num_return_sequences={k}, max_new_tokens={n}) at batch {spec.batch}: the "
                                   f"{spec.batch} prompts expanded to {spec.batch * k} rows before the prefill; "
                                   "no step markers", "profile() around one generate(); a warm-up generate ran before")
        t["num_return_sequences"] = k
        return prof, log, t, None

    fit(ctx, spec, capture)


def memcpy_counts(path: str) -> dict:
    doc = load_doc(path)
    c = Counter(e.get("name") for e in doc["traceEvents"] if e.get("cat") == "gpu_memcpy")
    return dict(c)


def loop_offloaded_generate(ctx: Ctx, spec: Spec) -> None:
    """generate(cache_implementation="offloaded"): a DynamicCache(offloading=True) keeps each layer's keys and values
    on the CPU; every layer's update waits for the prefetch stream, prefetches the next layer's KV to the GPU on it,
    appends, and copies the layer back to the CPU (non_blocking). CPU smoke: no CUDA, a plain DynamicCache."""
    offload = ctx.device == "cuda"
    extra = {"cache_implementation": "offloaded"} if offload else {}
    _one_generate(ctx, spec, extra,
                  lambda n: f"greedy model.generate(max_new_tokens={n}, cache_implementation='offloaded') at batch "
                            f"{spec.batch}, prompt {PROMPT} tokens: DynamicCache(offloading=True), every layer's KV "
                            "copied to the CPU after its update and prefetched back on a side stream before the next "
                            "layer's; no step markers" + ("" if offload else " (CPU smoke: no offloading)"))
    path = os.path.join(ctx.out_dir, f"{spec.name}.truth.json")
    truth = json.load(open(path))
    truth["offloading"] = offload
    truth["gpu_memcpy_in_trace"] = memcpy_counts(os.path.join(ctx.out_dir, f"{spec.name}.json.gz"))
    write_truth(ctx.out_dir, spec.name, truth)
    print(f"{spec.name}: memcpy {truth['gpu_memcpy_in_trace']}", flush=True)


# vision-language models (the tenth holdout) ----------------------------------------------------------------------
VLM_CLASSES = {"qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration", "qwen3_vl": "Qwen3VLForConditionalGeneration",
               "gemma3_vlm": "Gemma3ForConditionalGeneration", "mllama": "MllamaForConditionalGeneration",
               "llava": "LlavaForConditionalGeneration"}
VLM_CLASSES.update({"qwen2_vl": "Qwen2VLForConditionalGeneration", "paligemma": "PaliGemmaForConditionalGeneration",
                    "lfm2_vl": "Lfm2VlForConditionalGeneration", "internvl": "InternVLForConditionalGeneration"})


def vlm_config(family: str, layers: int):
    import transformers

    cname, kw, _ = FAMILIES[family]
    text = dict(kw["text"], num_hidden_layers=layers)
    if family == "mllama":  # a cross-attention layer every 3rd from layer 1 (the released 11B: 3, 8, 13, ..)
        text["cross_attention_layers"] = [i for i in range(layers) if i % 3 == 1]
    if family == "lfm2_vl":  # as the lfm2 family: conv layers and attention layers in turn
        text["layer_types"] = ["conv" if i % 2 == 0 else "full_attention" for i in range(layers)]
    return getattr(transformers, cname)(text_config=text, vision_config=dict(kw["vision"]), **kw["top"])


def build_vlm(family: str, layers: int, device: str):
    """A VLM from a tiny config (random weights, no downloads): bf16 on CUDA, SDPA in the text and vision stacks."""
    import transformers

    torch.backends.cuda.enable_cudnn_sdp(False)
    config = vlm_config(family, layers)
    torch.manual_seed(0)
    model = getattr(transformers, VLM_CLASSES[family])._from_config(config, attn_implementation="sdpa")
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    return model.to(device=device, dtype=dtype).eval()


def vlm_parts(model) -> tuple[list, list]:
    """(the text decoder's layers, the vision tower's layers: every ModuleList of blocks inside it, in order;
    InternViT's is named `layer`)."""
    inner = model.model
    text = list(inner.language_model.layers)
    tower = next(getattr(inner, n) for n in ("visual", "vision_tower", "vision_model") if hasattr(inner, n))
    vision = []
    for name, m in tower.named_modules():
        if isinstance(m, torch.nn.ModuleList) and name.rsplit(".", 1)[-1] in ("layers", "blocks", "layer"):
            vision += list(m)
    return text, vision


def vlm_inputs(model, family: str, batch: int, device: str) -> tuple[torch.Tensor, dict, dict]:
    """A prompt of text tokens around one random image per row, as the family's processor would lay it out (the
    image's placeholder tokens in input_ids, the pixel inputs made with torch): (input_ids, the pixel kwargs for the
    prefill, a description)."""
    cfg = model.config
    dtype = next(model.parameters()).dtype
    torch.manual_seed(2)

    def text(n):
        return torch.randint(5, 4000, (batch, n), device=device)  # clear of the image ids (4001..4004)

    def row(*ids):
        return torch.tensor([list(ids)] * batch, device=device)

    if family in ("qwen2_5_vl", "qwen3_vl", "qwen2_vl"):
        vc = cfg.vision_config
        t, h, w = 1, 8, 8  # patches: an image of 8 x patch_size pixels a side, one temporal patch
        pv = torch.randn(batch * t * h * w, 3 * vc.temporal_patch_size * vc.patch_size ** 2, device=device,
                         dtype=dtype)
        grid = torch.tensor([[t, h, w]] * batch, device=device)
        n_img = t * h * w // vc.spatial_merge_size ** 2
        image = row(cfg.vision_start_token_id, *[cfg.image_token_id] * n_img, cfg.vision_end_token_id)
        pixel = {"pixel_values": pv, "image_grid_thw": grid}
        about = {"image_pixels": [h * vc.patch_size, w * vc.patch_size], "vision_patches": t * h * w,
                 "image_tokens": n_img}
    elif family == "gemma3_vlm":
        size = cfg.vision_config.image_size
        pixel = {"pixel_values": torch.randn(batch, 3, size, size, device=device, dtype=dtype)}
        n_img = cfg.mm_tokens_per_image
        image = row(cfg.boi_token_index, *[cfg.image_token_index] * n_img, cfg.eoi_token_index)
        about = {"image_pixels": [size, size], "vision_patches": (size // cfg.vision_config.patch_size) ** 2,
                 "image_tokens": n_img}
    elif family == "llava":
        vc = cfg.vision_config
        n_img = (vc.image_size // vc.patch_size) ** 2
        pixel = {"pixel_values": torch.randn(batch, 3, vc.image_size, vc.image_size, device=device, dtype=dtype)}
        image = row(*[cfg.image_token_index] * n_img)
        about = {"image_pixels": [vc.image_size, vc.image_size], "vision_patches": n_img, "image_tokens": n_img}
    elif family == "mllama":
        vc = cfg.vision_config
        tiles = vc.max_num_tiles  # aspect ratio id 2: [1, 2], two tiles side by side
        pixel = {"pixel_values": torch.randn(batch, 1, tiles, 3, vc.image_size, vc.image_size, device=device,
                                             dtype=dtype),
                 "aspect_ratio_ids": torch.full((batch, 1), 2, device=device),
                 "aspect_ratio_mask": torch.ones(batch, 1, tiles, dtype=torch.long, device=device)}
        image = row(cfg.image_token_index)
        n_img = 1
        about = {"image_pixels": [vc.image_size, tiles * vc.image_size], "tiles": tiles,
                 "vision_patches": tiles * (vc.image_size // vc.patch_size) ** 2, "image_tokens": 1,
                 "note": "one <|image|> token; the text attends to the image through the cross-attention layers"}
    elif family == "paligemma":
        vc = cfg.vision_config
        n_img = (vc.image_size // vc.patch_size) ** 2
        pixel = {"pixel_values": torch.randn(batch, 3, vc.image_size, vc.image_size, device=device, dtype=dtype)}
        image = row(*[cfg.image_token_index] * n_img)
        about = {"image_pixels": [vc.image_size, vc.image_size], "vision_patches": n_img, "image_tokens": n_img,
                 "note": "the processor's layout: the image tokens first, then the text prompt; all of it the prefix"}
    elif family == "lfm2_vl":
        vc = cfg.vision_config
        h = w = int(vc.num_patches ** 0.5)  # an image of h x w patches, as many as the tower's positions
        pixel = {"pixel_values": torch.randn(batch, h * w, 3 * vc.patch_size ** 2, device=device, dtype=dtype),
                 "pixel_attention_mask": torch.ones(batch, h * w, dtype=torch.bool, device=device),
                 "spatial_shapes": torch.tensor([[h, w]] * batch, device=device)}
        n_img = (h // cfg.downsample_factor) * (w // cfg.downsample_factor)
        image = row(*[cfg.image_token_id] * n_img)
        about = {"image_pixels": [h * vc.patch_size, w * vc.patch_size], "vision_patches": h * w,
                 "image_tokens": n_img}
    elif family == "internvl":
        vc = cfg.vision_config
        size = vc.image_size[0]
        pixel = {"pixel_values": torch.randn(batch, 3, size, size, device=device, dtype=dtype)}
        n_img = cfg.image_seq_length
        image = row(*[cfg.image_token_id] * n_img)
        about = {"image_pixels": [size, size], "vision_patches": (size // vc.patch_size[0]) ** 2,
                 "image_tokens": n_img}
    else:
        raise ValueError(family)
    if family == "paligemma":  # image first, then the text: one prefix, every token of it token_type_ids 0
        ids = torch.cat([image, text(PROMPT)], dim=1)
        pixel["token_type_ids"] = torch.zeros_like(ids)
    else:
        ids = torch.cat([text(4), image, text(PROMPT - 4)], dim=1)
    if family in ("qwen2_5_vl", "qwen3_vl", "qwen2_vl"):  # as the processor returns it: 1 at the image's tokens
        pixel["mm_token_type_ids"] = (ids == cfg.image_token_id).int()
    if family == "gemma3_vlm":  # as the processor returns it: the image's tokens attend to each other both ways
        pixel["token_type_ids"] = (ids == cfg.image_token_index).long()
    if family == "mllama":  # every text position may attend to both tiles of the image
        pixel["cross_attention_mask"] = torch.ones(batch, ids.shape[1], 1, pixel["pixel_values"].shape[2],
                                                   dtype=torch.long, device=device)
    about.update(prompt_tokens=int(ids.shape[1]), text_tokens=int(ids.shape[1]) - n_img,
                 pixel_inputs={k: list(v.shape) for k, v in pixel.items()})
    return ids, pixel, about


class VlmLog(ForwardLog):
    """ForwardLog of a VLM, with the calls of the text decoder's layers and of the vision tower's layers counted
    inside each forward (each_forward's text_layer_calls, vision_layer_calls)."""

    def __init__(self, model):
        super().__init__(model)
        text, vision = vlm_parts(model)
        for m in text:
            m.register_forward_hook(lambda *a: self.bump("text_layer_calls"))
        for m in vision:
            m.register_forward_hook(lambda *a: self.bump("vision_layer_calls"))

    def bump(self, key: str) -> None:
        if self.forwards:
            x = self.forwards[-1].extra
            x[key] = x.get(key, 0) + 1


def vlm_layer_info(model, family: str, ids: torch.Tensor, pixel: dict) -> dict:
    """layer_info of a VLM: the text decoder's layers (hooks on the language model's decoder layers only) counted in
    one eager prefill with the image and grouped by their submodules; the vision tower's layers counted apart."""
    text, vision = vlm_parts(model)
    vcalls = []
    handles = [m.register_forward_hook(lambda *a: vcalls.append(1)) for m in vision]
    cfg = model.config.get_text_config()
    info = block_layer_info(text, lambda: model(input_ids=ids, attention_mask=torch.ones_like(ids), **pixel),
                            {"model_class": type(model).__name__, "config_info": {
                                k: getattr(cfg, k) for k in ("layer_types", "sliding_window", "cross_attention_layers")
                                if getattr(cfg, k, None) is not None}})
    for h in handles:
        h.remove()
    info["vision_layers"] = len(vcalls)
    info["vision_tower"] = {"layers": len(vcalls), "layer_modules": len(vision),
                            "layer_classes": sorted({type(m).__name__ for m in vision})}
    return info


def vlm_truth(t: dict, log: ForwardLog, info: dict, about: dict) -> dict:
    """The VLM notes of a truth, and the check that the vision tower ran in the first forward only."""
    t["image"] = about
    into = ("its features become the cross-attention layers' keys and values (cached for the decodes)"
            if t["family"] == "mllama" else "its features go into the image positions")
    t["step_rule"] = (f"the first forward (the prompt with the image) is the prefill: the vision tower "
                      f"({info['vision_layers']} layers) runs over the image's patches, {into}, then the text "
                      f"stack ({info['layers']} layers); the decodes run the text stack "
                      "only. layers and layer_kinds are the text decoder's; the vision tower's depth is "
                      "vision_layers (each_forward: text_layer_calls, vision_layer_calls)")
    got = [f.extra.get("vision_layer_calls", 0) for f in log.forwards]
    assert got[0] == info["vision_layers"] and not any(got[1:]), got
    assert all(f.extra.get("text_layer_calls") == info["layers"] for f in log.forwards), \
        [f.extra.get("text_layer_calls") for f in log.forwards]
    return t


def _vlm_generate(ctx: Ctx, spec: Spec, what: str, sample: bool = False, static: bool = False) -> None:
    """A warm-up generate, then profile() around one generate() with the image's pixel inputs (generate passes them
    to the first forward only); `static`: over a StaticCache of opts cache_len (default 128), its KV length counted on
    the host as loop_static_generate does."""
    model = build_vlm(spec.family, spec.layers, ctx.device)
    ids, pixel, about = vlm_inputs(model, spec.family, spec.batch, ctx.device)
    info = vlm_layer_info(model, spec.family, ids, pixel)
    log = VlmLog(model)
    cache_len = spec.opts.get("cache_len", 128)
    extra = dict(cache_implementation="static", max_cache_len=cache_len) if static else {}
    start = [0]
    if static:
        log.cached_override = lambda: sum(f.tokens for f in log.forwards[start[0]:])
    got = {}

    def run(n):
        start[0] = len(log.forwards)
        got["cache"] = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **pixel, **extra,
                                      return_dict_in_generate=True, **gen_kwargs(n, sample=sample)).past_key_values

    def check():  # after the window: the cache's own length is a device read
        kv = got.pop("cache")
        want = sum(f.tokens for f in log.forwards[start[0]:])
        assert type(kv).__name__ == "StaticCache" and int(kv.get_seq_length()) == want, (type(kv), want)
        return {"class": type(kv).__name__, "max_length": cache_len, "kv_length_after": want}

    torch.manual_seed(1)
    with torch.no_grad():
        run(3)  # warm-up
    sync(ctx.device)
    got.pop("cache")

    def capture(n):
        prof = recorded(ctx, spec, log, lambda: run(n))
        t = base_truth(spec, info, what.format(n=n, batch=spec.batch, prompt=about["prompt_tokens"],
                                               cache_len=cache_len),
                       "profile() around one generate(); a warm-up generate ran before; hooks on the model, on the "
                       "text decoder's layers and on the vision tower's layers")
        if static:
            t["static_cache"] = check()
        got.pop("cache", None)
        return prof, log, vlm_truth(t, log, info, about), None

    fit(ctx, spec, capture)


def loop_vlm_generate(ctx: Ctx, spec: Spec) -> None:
    """Greedy generate() of a VLM on a prompt with one image a row: the prefill runs the vision tower and the text
    stack, then one text-only decode per new token."""
    _vlm_generate(ctx, spec, "vision-language greedy model.generate(max_new_tokens={n}) at batch {batch}: a prompt "
                             "of {prompt} tokens holding one image's placeholder tokens, the pixel inputs passed to "
                             "generate (the prefill runs the vision tower, then the text stack); DynamicCache; no "
                             "step markers")


def loop_vlm_sample(ctx: Ctx, spec: Spec) -> None:
    """Sampling generate() of a VLM at batch > 1, a different image in each row."""
    _vlm_generate(ctx, spec, "vision-language sampling model.generate(do_sample, top_k=50, top_p=0.9, "
                             "temperature=0.8, max_new_tokens={n}) at batch {batch}, a different random image in each "
                             "row: prompts of {prompt} tokens with the image's placeholder tokens; the prefill runs "
                             "the vision tower over both images, then the text stack; no step markers", sample=True)


def loop_vlm_static_generate(ctx: Ctx, spec: Spec) -> None:
    """generate(cache_implementation="static") of a VLM, eager (no compile, no CUDA graph): the prefill with the
    image, then decodes attending over the whole preallocated cache."""
    _vlm_generate(ctx, spec, "vision-language greedy model.generate(max_new_tokens={n}, cache_implementation="
                             "'static', max_cache_len={cache_len}) at batch {batch}, eager (disable_compile): a prompt "
                             "of {prompt} tokens with one image (the prefill runs the vision tower, then the text "
                             "stack), then decodes over the whole preallocated {cache_len} positions (masked); no step "
                             "markers", static=True)


def loop_vlm_hand(ctx: Ctx, spec: Spec) -> None:
    """Hand-written VLM loop: model(input_ids=prompt, pixel inputs, past_key_values=DynamicCache) once (the
    prefill, with the vision tower), then model(input_ids=next token, past_key_values=cache) per decode; argmax on
    the device, no host sync. (Not for Mllama: its decodes need the cross-attention mask extended by the loop.)"""
    from transformers import DynamicCache

    model = build_vlm(spec.family, spec.layers, ctx.device)
    ids0, pixel, about = vlm_inputs(model, spec.family, spec.batch, ctx.device)
    info = vlm_layer_info(model, spec.family, ids0, pixel)
    log = VlmLog(model)

    def run(n):
        cache = DynamicCache(config=model.config.get_text_config())
        with torch.no_grad():
            logits = model(input_ids=ids0, **pixel, past_key_values=cache, use_cache=True).logits
            for _ in range(n - 1):
                logits = model(input_ids=logits[:, -1:].argmax(-1), past_key_values=cache, use_cache=True).logits

    run(3)  # warm-up
    sync(ctx.device)

    def capture(n):
        prof = recorded(ctx, spec, log, lambda: run(n))
        t = base_truth(spec, info, f"hand-written vision-language loop at batch {spec.batch}: model(input_ids=a "
                                   f"{about['prompt_tokens']}-token prompt with the image's placeholder tokens, "
                                   "pixel_values, past_key_values=DynamicCache) once (the prefill: the vision tower, "
                                   f"then the text stack), then {n - 1} decodes model(input_ids=the argmax token, "
                                   "past_key_values) on the text stack only; no host sync",
                       "profile() around the loop; a warm-up loop ran before; no markers; hooks on the model, on the "
                       "text decoder's layers and on the vision tower's layers")
        return prof, log, vlm_truth(t, log, info, about), None

    fit(ctx, spec, capture)


LOOPS = {"eager_generate": loop_eager_generate, "sample_padded": loop_sample_padded,
         "compiled_generate": loop_compiled_generate, "compiled_hand": loop_compiled_hand,
         "cudagraph": loop_cudagraph, "hand": loop_hand, "deep_nomarkers": loop_deep,
         "profstep_hand": loop_profstep_hand, "hand_extend": loop_hand_extend,
         "profstep_generate_hook": loop_profstep_generate_hook,
         "profstep_wraps_generate": loop_profstep_wraps_generate, "train": loop_train, "midstep": loop_midstep,
         "record": loop_record, "beam_generate": loop_beam_generate, "nocache_generate": loop_nocache_generate,
         "nocache_hand": loop_nocache_hand, "train_checkpointed": loop_train_checkpointed,
         "static_generate": loop_static_generate, "prompt_lookup_generate": loop_prompt_lookup_generate,
         "assisted_generate": loop_assisted_generate, "reduce_overhead_hand": loop_reduce_overhead_hand,
         "continuous_batching": loop_continuous_batching}
LOOPS.update({"plain_hand": loop_plain_hand, "plain_reduce_overhead": loop_plain_reduce_overhead,
              "plain_train": loop_plain_train, "seq2seq_generate": loop_seq2seq_generate,
              "sample_multi": loop_sample_multi, "offloaded_generate": loop_offloaded_generate})
LOOPS.update({"vlm_generate": loop_vlm_generate, "vlm_sample": loop_vlm_sample,
              "vlm_static_generate": loop_vlm_static_generate, "vlm_hand": loop_vlm_hand})


def S(name, family, loop, **kw) -> Spec:
    return Spec(name=name, family=family, loop=loop, **kw)


COMPILE_COST = 70.0
SPECS = [
    # llama: dense GQA
    S("llama_eager_generate", "llama", "eager_generate", layers=8, steps=[12, 9, 7]),
    S("llama_sample_padded", "llama", "sample_padded", layers=6, batch=4, rs=False, steps=[10, 8, 6]),
    S("llama_compiled_generate", "llama", "compiled_generate", layers=8, batch=2, steps=[10, 8], cost=COMPILE_COST),
    S("llama_cudagraph", "llama", "cudagraph", layers=8, batch=2, rs=False, steps=[8, 6]),
    S("llama_train_profstep", "llama", "train", layers=4, steps=[3, 2], opts={"markers": "profstep"}, cost=8),
    S("llama_deep_nomarkers", "llama", "deep_nomarkers", layers=32, steps=[6, 5, 4], rs=False),
    S("llama_record", "llama", "record", layers=6, batch=2, steps=[6], rs=False, cost=25),
    # qwen3 / qwen2: dense
    S("qwen3_hand_item", "qwen3", "hand", layers=6, steps=[10, 8, 6], opts={"item": True}),
    S("qwen3_compiled_hand", "qwen3", "compiled_hand", layers=6, rs=False, steps=[10, 8], cost=COMPILE_COST),
    S("qwen3_cudagraph", "qwen3", "cudagraph", layers=6, batch=1, steps=[8, 6]),
    S("qwen3_midstep", "qwen3", "midstep", layers=6, steps=[6, 5, 4]),
    S("qwen2_eager_generate", "qwen2", "eager_generate", layers=6, batch=2, rs=False, steps=[10, 8, 6]),
    S("qwen2_profstep_hand", "qwen2", "profstep_hand", layers=6, steps=[6, 5, 4], opts={"item": True}),
    # mistral
    S("mistral_profstep_generate_hook", "mistral", "profstep_generate_hook", layers=6, rs=False, steps=[6, 5, 4]),
    S("mistral_sample_padded", "mistral", "sample_padded", layers=4, batch=3, steps=[10, 8, 6]),
    S("mistral_cudagraph", "mistral", "cudagraph", layers=6, batch=4, rs=False, steps=[8, 6]),
    # phi3
    S("phi3_hand", "phi3", "hand", layers=6, rs=False, batch=2, steps=[10, 8, 6]),
    S("phi3_profstep_wraps_generate", "phi3", "profstep_wraps_generate", layers=4, steps=[8, 6, 5]),
    S("phi3_midstep", "phi3", "midstep", layers=6, rs=False, steps=[6, 5, 4], opts={"item": True}),
    # gpt2
    S("gpt2_eager_generate", "gpt2", "eager_generate", layers=6, steps=[12, 9, 7]),
    S("gpt2_train_profstep", "gpt2", "train", layers=4, rs=False, steps=[3, 2], opts={"markers": "profstep"}, cost=8),
    S("gpt2_sample_padded", "gpt2", "sample_padded", layers=6, batch=4, rs=False, steps=[10, 8, 6]),
    # gpt_neox
    S("gpt_neox_hand_item", "gpt_neox", "hand", layers=6, steps=[10, 8, 6], opts={"item": True}),
    S("gpt_neox_deep_nomarkers", "gpt_neox", "deep_nomarkers", layers=40, rs=False, steps=[6, 5, 4]),
    S("gpt_neox_profstep_hand", "gpt_neox", "profstep_hand", layers=6, rs=False, steps=[6, 5, 4]),
    # mixtral: eager MoE
    S("mixtral_eager_generate", "mixtral", "eager_generate", layers=4, batch=4, steps=[10, 8, 6]),
    S("mixtral_hand_item", "mixtral", "hand", layers=4, batch=2, rs=False, steps=[10, 8, 6], opts={"item": True}),
    S("mixtral_train_nomarkers", "mixtral", "train", layers=4, rs=False, steps=[2], opts={"markers": "none"}, cost=8),
    S("mixtral_midstep", "mixtral", "midstep", layers=4, batch=4, steps=[5, 4, 3]),
    S("mixtral_record", "mixtral", "record", layers=4, batch=4, steps=[5], rs=False, cost=25),
    # qwen3_moe / qwen2_moe / olmoe
    S("qwen3_moe_sample_padded", "qwen3_moe", "sample_padded", layers=4, batch=4, rs=False, steps=[10, 8, 6]),
    S("qwen3_moe_profstep_hand", "qwen3_moe", "profstep_hand", layers=4, batch=4, steps=[6, 5, 4]),
    S("qwen3_moe_train_nomarkers", "qwen3_moe", "train", layers=4, steps=[2], opts={"markers": "none"}, cost=8),
    S("qwen2_moe_eager_generate", "qwen2_moe", "eager_generate", layers=4, batch=3, rs=False, steps=[10, 8, 6]),
    S("qwen2_moe_profstep_generate_hook", "qwen2_moe", "profstep_generate_hook", layers=4, batch=2,
      steps=[6, 5, 4]),
    S("olmoe_hand", "olmoe", "hand", layers=4, batch=4, steps=[10, 8, 6]),
    S("olmoe_profstep_wraps_generate", "olmoe", "profstep_wraps_generate", layers=4, batch=2, rs=False,
      steps=[8, 6, 5]),
    # deepseek_v3: MLA, 1 dense layer then MoE
    S("deepseek_v3_eager_generate", "deepseek_v3", "eager_generate", layers=6, rs=False, steps=[8, 7, 6]),
    S("deepseek_v3_compiled_generate", "deepseek_v3", "compiled_generate", layers=8, steps=[12, 10, 8],
      opts={"experts": "batched_mm"}, cost=COMPILE_COST + 20),
    S("deepseek_v3_sample_padded", "deepseek_v3", "sample_padded", layers=4, batch=4, rs=False, steps=[10, 8, 6]),
    S("deepseek_v3_train_profstep", "deepseek_v3", "train", layers=4, rs=False, steps=[3, 2],
      opts={"markers": "profstep"}, cost=10),
    S("deepseek_v3_deep_nomarkers", "deepseek_v3", "deep_nomarkers", layers=12, rs=False, steps=[6, 5, 4]),
    # gemma2 / gemma3: sliding + full attention
    S("gemma2_eager_generate", "gemma2", "eager_generate", layers=6, steps=[12, 9, 7]),
    S("gemma2_hand_item", "gemma2", "hand", layers=6, rs=False, steps=[10, 8, 6], opts={"item": True}),
    S("gemma3_sample_padded", "gemma3", "sample_padded", layers=6, batch=3, steps=[10, 8, 6]),
    S("gemma3_profstep_hand", "gemma3", "profstep_hand", layers=6, rs=False, steps=[6, 5, 4]),
    # gpt_oss: sliding/full + eager MoE
    S("gpt_oss_eager_generate", "gpt_oss", "eager_generate", layers=4, batch=2, steps=[10, 8, 6]),
    S("gpt_oss_midstep", "gpt_oss", "midstep", layers=4, batch=2, rs=False, steps=[5, 4, 3]),
    # hybrids: unlike layers
    S("lfm2_eager_generate", "lfm2", "eager_generate", layers=6, steps=[12, 9, 7]),
    S("lfm2_hand", "lfm2", "hand", layers=6, rs=False, batch=2, steps=[10, 8, 6]),
    S("qwen3_next_eager_generate", "qwen3_next", "eager_generate", layers=4, rs=False, steps=[8, 6, 5], cost=8),
    S("jamba_eager_generate", "jamba", "eager_generate", layers=4, batch=2, rs=False, steps=[6, 5, 4], cost=6),
    # first made as holdout traces (read wrong there, then right: they guard what they taught)
    S("jamba8_eager_generate", "jamba", "eager_generate", layers=8, batch=2, rs=False, steps=[6], cost=8),
    S("glm4_moe6_eager_generate", "glm4_moe", "eager_generate", layers=6, batch=2, steps=[8, 6]),
    # more families; prefill + extend + decode
    S("llama_hand_extend", "llama", "hand_extend", layers=4, rs=False, steps=[8, 6]),
    S("phimoe_hand_extend", "phimoe", "hand_extend", layers=4, batch=2, rs=False, steps=[6, 5, 4]),
    S("glm4_moe_profstep_hand", "glm4_moe", "profstep_hand", layers=4, batch=2, steps=[5, 4, 3]),
    S("starcoder2_sample_padded", "starcoder2", "sample_padded", layers=4, batch=3, rs=False, steps=[8, 6, 5]),
    S("granite_midstep", "granite", "midstep", layers=4, steps=[5, 4, 3]),
    S("olmo2_train_nomarkers", "olmo2", "train", layers=2, rs=False, steps=[2], opts={"markers": "none"}),
]
# A holdout (`--holdout`): the corpus's kinds of stack at depths and in loops the corpus does not have (deeper hybrids
# with several one-of-a-kind layers, two full-attention layers in a Gemma 3 stack, more dense layers before the MoE
# ones), made to check the layer reading on traces it was not developed on; never committed as fixtures.
HOLDOUT = [
    S("jamba12_hand", "jamba", "hand", layers=12, batch=2, rs=False, steps=[6, 5], cost=10),
    S("lfm2_10_sample_padded", "lfm2", "sample_padded", layers=10, batch=3, steps=[8, 6]),
    S("lfm2_8_train_nomarkers", "lfm2", "train", layers=8, steps=[2], opts={"markers": "none"}, cost=8),
    S("qwen3_next8_hand", "qwen3_next", "hand", layers=8, rs=False, steps=[6, 5], cost=10),
    S("gemma3_12_eager_generate", "gemma3", "eager_generate", layers=12, steps=[8, 6]),
    S("deepseek_v3_8_hand", "deepseek_v3", "hand", layers=8, rs=False, steps=[8, 6]),
    S("glm4_moe8_sample_padded", "glm4_moe", "sample_padded", layers=8, batch=3, rs=False, steps=[8, 6]),
    S("mixtral6_train_nomarkers", "mixtral", "train", layers=6, rs=False, steps=[2], opts={"markers": "none"},
      cost=10),
    S("qwen3_moe6_eager_generate", "qwen3_moe", "eager_generate", layers=6, batch=2, steps=[8, 6]),
    S("olmo2_6_eager_generate", "olmo2", "eager_generate", layers=6, steps=[10, 8]),
    S("phimoe4_sample_padded", "phimoe", "sample_padded", layers=4, batch=3, rs=False, steps=[8, 6]),
    S("granite16_deep_nomarkers", "granite", "deep_nomarkers", layers=16, rs=False, steps=[5, 4]),
    S("gpt_oss6_hand", "gpt_oss", "hand", layers=6, batch=2, rs=False, steps=[6, 5]),
]
# A second holdout (`--holdout2`): families none of the above has (Mamba-2 hybrids of three designs, an
# attention-free stack, Griffin, MLA with two dense layers, grouped-GEMM MoE, mixture of attention heads, parallel
# attention + MLP, post-norm and NoPE stacks) and two loops the corpus lacks (beam search, gradient accumulation);
# never committed as fixtures.
HOLDOUT2 = [
    S("granitemoe6_eager_generate", "granitemoe", "eager_generate", layers=6, batch=2, steps=[8, 6]),
    S("granitemoehybrid8_hand", "granitemoehybrid", "hand", layers=8, batch=2, rs=False, steps=[6, 5], cost=8),
    S("bamba8_eager_generate", "bamba", "eager_generate", layers=8, batch=2, rs=False, steps=[6, 5], cost=8),
    S("falcon_h1_6_sample_padded", "falcon_h1", "sample_padded", layers=6, batch=3, rs=False, steps=[6, 5], cost=8),
    S("deepseek_v2_6_hand", "deepseek_v2", "hand", layers=6, batch=2, rs=False, steps=[8, 6]),
    S("cohere2_8_eager_generate", "cohere2", "eager_generate", layers=8, steps=[10, 8]),
    S("smollm3_8_cudagraph", "smollm3", "cudagraph", layers=8, steps=[10, 8]),
    S("ernie4_5_moe5_profstep_hand", "ernie4_5_moe", "profstep_hand", layers=5, batch=2, steps=[6, 5]),
    S("minimax8_eager_generate", "minimax", "eager_generate", layers=8, batch=2, rs=False, steps=[6, 5], cost=8),
    S("exaone4_8_hand", "exaone4", "hand", layers=8, rs=False, steps=[10, 8]),
    S("nemotron_h10_eager_generate", "nemotron_h", "eager_generate", layers=10, batch=2, rs=False, steps=[6, 5],
      cost=8),
    S("zamba2_6_hand", "zamba2", "hand", layers=6, batch=2, rs=False, steps=[6, 5], cost=8),
    S("mamba2_6_eager_generate", "mamba2", "eager_generate", layers=6, batch=2, rs=False, steps=[8, 6], cost=8),
    S("recurrent_gemma6_eager_generate", "recurrent_gemma", "eager_generate", layers=6, steps=[8, 6]),
    S("jetmoe4_sample_padded", "jetmoe", "sample_padded", layers=4, batch=3, rs=False, steps=[8, 6]),
    S("qwen3_5_moe8_hand", "qwen3_5_moe", "hand", layers=8, rs=False, steps=[6, 5], cost=10),
    S("olmo3_8_beam", "olmo3", "beam_generate", layers=8, batch=2, steps=[8, 6]),
    S("dots1_4_beam", "dots1", "beam_generate", layers=4, batch=1, rs=False, steps=[8, 6]),
    S("hunyuan_moe4_eager_generate", "hunyuan_moe", "eager_generate", layers=4, batch=2, steps=[8, 6]),
    S("lfm2_moe6_compiled_generate", "lfm2_moe", "compiled_generate", layers=6, steps=[10, 8],
      opts={"experts": "grouped_mm"}, cost=COMPILE_COST + 10),
    S("llama4_train_accum_nomarkers", "llama", "train", layers=4, steps=[3, 2], opts={"markers": "none", "micro": 2},
      cost=8),
    S("qwen3_moe4_train_accum_profstep", "qwen3_moe", "train", layers=4, rs=False, steps=[2],
      opts={"markers": "profstep", "micro": 3}, cost=10),
]
# A third holdout (`--holdout3`): older and other dense designs (parallel attention + MLP, ALiBi, multi-query,
# learned and sinusoidal positions, ReLU / squared-ReLU / GeGLU MLPs, post-norms) in the corpus's loops; never
# committed as fixtures.
HOLDOUT3 = [
    S("phi6_eager_generate", "phi", "eager_generate", layers=6, batch=2, steps=[10, 8]),
    S("stablelm6_sample_padded", "stablelm", "sample_padded", layers=6, batch=3, rs=False, steps=[10, 8]),
    S("falcon6_hand", "falcon", "hand", layers=6, rs=False, steps=[10, 8]),
    S("bloom6_eager_generate", "bloom", "eager_generate", layers=6, steps=[10, 8]),
    S("opt6_profstep_hand", "opt", "profstep_hand", layers=6, steps=[6, 5]),
    S("gptj6_eager_generate", "gptj", "eager_generate", layers=6, rs=False, steps=[10, 8]),
    S("gpt_bigcode6_hand", "gpt_bigcode", "hand", layers=6, batch=2, steps=[10, 8]),
    S("gemma8_cudagraph", "gemma", "cudagraph", layers=8, steps=[10, 8]),
    S("glm4_6_beam", "glm4", "beam_generate", layers=6, batch=2, rs=False, steps=[8, 6]),
    S("olmo6_train_nomarkers", "olmo", "train", layers=6, rs=False, steps=[2], opts={"markers": "none"}),
    S("mpt6_eager_generate", "mpt", "eager_generate", layers=6, rs=False, steps=[10, 8]),
    S("codegen6_sample_padded", "codegen", "sample_padded", layers=6, batch=3, steps=[8, 6]),
    S("nemotron6_hand", "nemotron", "hand", layers=6, rs=False, steps=[10, 8]),
    S("persimmon6_eager_generate", "persimmon", "eager_generate", layers=6, steps=[10, 8]),
    S("xglm6_midstep", "xglm", "midstep", layers=6, rs=False, steps=[5, 4]),
    S("phi12_compiled_generate", "phi", "compiled_generate", layers=12, steps=[10, 8], cost=COMPILE_COST + 10),
]
# A fourth holdout (`--holdout4`): the second holdout's stacks that read wrong at first (and were fixed on its
# traces), at other depths and in other loops, to check that the fixes hold beyond the traces that led to them.
HOLDOUT4 = [
    S("bamba12_sample_padded", "bamba", "sample_padded", layers=12, batch=3, rs=False, steps=[6, 5], cost=10),
    S("bamba6_profstep_hand", "bamba", "profstep_hand", layers=6, batch=2, steps=[5, 4], cost=8),
    S("recurrent_gemma9_hand", "recurrent_gemma", "hand", layers=9, batch=2, rs=False, steps=[8, 6]),
    S("zamba2_9_eager_generate", "zamba2", "eager_generate", layers=9, batch=2, rs=False, steps=[6, 5], cost=10),
    S("granitemoehybrid12_sample_padded", "granitemoehybrid", "sample_padded", layers=12, batch=3, rs=False,
      steps=[6, 5], cost=10),
    S("dots1_6_eager_generate", "dots1", "eager_generate", layers=6, batch=2, steps=[8, 6]),
    S("smollm3_12_hand", "smollm3", "hand", layers=12, rs=False, steps=[10, 8]),
    S("opt8_eager_generate", "opt", "eager_generate", layers=8, batch=2, steps=[10, 8]),
    S("phi8_profstep_hand", "phi", "profstep_hand", layers=8, steps=[6, 5]),
    S("minimax8_train_nomarkers", "minimax", "train", layers=8, rs=False, steps=[2], opts={"markers": "none"},
      cost=10),
]
# A fifth holdout (`--holdout5`): the fixes of the third and fourth holdouts on ground they were not made on. Loops
# without a KV cache (use_cache=False: every forward a prefill of the sequence so far, as MPT's) in four other
# families (dense, parallel attention + MLP, eager MoE, a Mamba-2 hybrid) and a hand loop with a sliding window;
# compiled two-mixer stacks (a dense LFM2, a deeper LFM2-MoE) and a compiled parallel-attention stack at depths not
# used before; a Bamba with its attention layer first in a ProfilerStep-per-forward generate; and families no set
# had (Gemma 4 text, Arcee AFMoE, Falcon-Mamba, Command R).
HOLDOUT5 = [
    S("qwen2_6_nocache_generate", "qwen2", "nocache_generate", layers=6, batch=2, steps=[10, 8]),
    S("gpt_neox6_nocache_generate", "gpt_neox", "nocache_generate", layers=6, rs=False, steps=[10, 8]),
    S("olmoe4_nocache_generate", "olmoe", "nocache_generate", layers=4, batch=2, rs=False, steps=[8, 6]),
    S("bamba8_nocache_generate", "bamba", "nocache_generate", layers=8, batch=2, steps=[6, 5], cost=10),
    S("mistral_sw6_nocache_hand", "mistral_sw", "nocache_hand", layers=6, rs=False, steps=[10, 8]),
    S("lfm2_8_compiled_generate", "lfm2", "compiled_generate", layers=8, steps=[10, 8], cost=COMPILE_COST + 10),
    S("lfm2_moe10_compiled_generate", "lfm2_moe", "compiled_generate", layers=10, rs=False, steps=[10, 8],
      opts={"experts": "grouped_mm"}, cost=COMPILE_COST + 20),
    S("cohere10_compiled_hand", "cohere", "compiled_hand", layers=10, steps=[10, 8], cost=COMPILE_COST + 10),
    S("bamba_attn0_7_profstep_generate_hook", "bamba_attn0", "profstep_generate_hook", layers=7, batch=2,
      steps=[5, 4], cost=8),
    S("gemma4_8_eager_generate", "gemma4", "eager_generate", layers=8, steps=[10, 8]),
    S("afmoe6_sample_padded", "afmoe", "sample_padded", layers=6, batch=3, rs=False, steps=[8, 6]),
    S("falcon_mamba6_eager_generate", "falcon_mamba", "eager_generate", layers=6, batch=2, rs=False, steps=[8, 6],
      cost=8),
]
# A sixth holdout (`--holdout6`): the weak kinds on new ground. Hybrids of linear attention with softmax attention
# that no set had (Kimi Linear's KDA + MLA with dense and MoE layers, OLMo Hybrid, a compiled Qwen3.5), with the window
# opening and closing mid-forward, a chunked prefill (extend) on recurrent states, and beam search reordering them;
# eager MoE whose kernel count changes every step in loops MoE was never in (zero-computation experts, DeepSeek sparse
# attention with padded sampling, sliding attention with sinks in beam search, one ProfilerStep around a whole
# generate, an extend over a sliding window); dense + MoE layers in CUDA graph replays (grouped GEMMs); training
# without markers for a GDN + MoE hybrid with gradient accumulation and for a Mamba-2 hybrid; a 6-layer Jamba under
# `decodegap record`; and two cut files of these traces (HOLDOUT6_CUTS, made unless --no-cuts).
HOLDOUT6 = [
    S("kimi_linear8_midstep", "kimi_linear", "midstep", layers=8, batch=2, steps=[3, 2], cost=10),
    S("olmo_hybrid8_hand_extend", "olmo_hybrid", "hand_extend", layers=8, rs=False, steps=[8, 6], cost=8),
    S("qwen3_5_8_compiled_generate", "qwen3_5", "compiled_generate", layers=8, steps=[10, 8],
      cost=COMPILE_COST + 20),
    S("glm_moe_dsa6_sample_padded", "glm_moe_dsa", "sample_padded", layers=6, batch=3, rs=False, steps=[5, 4]),
    S("longcat_flash4_eager_generate", "longcat_flash", "eager_generate", layers=4, batch=2, steps=[5, 4]),
    S("mimo_v2_flash7_beam", "mimo_v2_flash", "beam_generate", layers=7, rs=False, steps=[5, 4], cost=8),
    S("qwen3_next4_train_accum_nomarkers", "qwen3_next", "train", layers=4, rs=False, steps=[2],
      opts={"markers": "none", "micro": 2}, cost=12),
    S("zamba2_6_train_nomarkers", "zamba2", "train", layers=6, steps=[2], opts={"markers": "none"}, cost=10),
    S("jamba6_record", "jamba", "record", layers=6, batch=2, steps=[5], rs=False, cost=25),
    S("hunyuan_moe6_profstep_wraps_generate", "hunyuan_moe", "profstep_wraps_generate", layers=6, batch=3,
      steps=[5, 4]),
    S("dots1_6_cudagraph", "dots1", "cudagraph", layers=6, batch=2, rs=False, steps=[10, 8]),
    S("qwen3_5_moe6_beam", "qwen3_5_moe", "beam_generate", layers=6, steps=[4, 3], cost=8),
    S("gpt_oss6_hand_extend", "gpt_oss", "hand_extend", layers=6, batch=2, steps=[5, 4]),
]
# A seventh holdout (`--holdout7`): loops the reader was never developed on. Training under gradient checkpointing
# (each layer's forward kernels twice an iteration, the second time inside the backward, but one model call) for a
# dense, an eager-MoE and a Mamba-2 hybrid stack; generate over a StaticCache preallocated to 128 positions, without
# compilation or CUDA graphs (eager decodes attending over the whole length, masked: KV shapes that never grow), for
# dense, eager MoE and a gated-delta-net + MoE hybrid; prompt-lookup speculative decoding (a prefill of prompt +
# candidates, then forwards of 1 to 5 new tokens: extends and decodes mixed, the cache cropped after rejections) for
# dense, eager MoE and LFM2 (conv states rolled back); and an eager MoE with the window opening and closing
# mid-forward, a Mamba-2 hybrid in beam search and a 7-layer LFM2 with a ProfilerStep per forward inside generate.
# Every family / loop pair is new; a training trace over the size limit at 2 iterations is made with 1.
HOLDOUT7 = [
    S("qwen3_6_train_checkpointed", "qwen3", "train_checkpointed", layers=6, steps=[2, 1], cost=10),
    S("olmoe3_train_checkpointed", "olmoe", "train_checkpointed", layers=3, rs=False, steps=[2, 1], cost=12),
    S("bamba4_train_checkpointed", "bamba", "train_checkpointed", layers=4, rs=False, steps=[2, 1], cost=12),
    S("llama6_static_generate", "llama", "static_generate", layers=6, batch=2, steps=[10, 8]),
    S("qwen3_moe4_static_generate", "qwen3_moe", "static_generate", layers=4, batch=2, rs=False, steps=[8, 6]),
    S("qwen3_next4_static_generate", "qwen3_next", "static_generate", layers=4, rs=False, steps=[6, 5], cost=8),
    S("llama8_prompt_lookup", "llama", "prompt_lookup_generate", layers=8, steps=[16, 12, 10]),
    S("mixtral4_prompt_lookup", "mixtral", "prompt_lookup_generate", layers=4, rs=False, steps=[16, 12, 8]),
    S("lfm2_6_prompt_lookup", "lfm2", "prompt_lookup_generate", layers=6, steps=[16, 12]),
    S("olmoe6_midstep", "olmoe", "midstep", layers=6, batch=2, rs=False, steps=[5, 4, 3]),
    S("bamba7_beam", "bamba", "beam_generate", layers=7, rs=False, steps=[6, 5], cost=10),
    S("lfm2_7_profstep_generate_hook", "lfm2", "profstep_generate_hook", layers=7, batch=2, steps=[5, 4]),
]
# An eighth holdout (`--holdout8`): ground no set covered. Three loops the reader never saw: transformers' continuous
# batching (a forward packs its requests into one row; requests join and leave, prompts are chunked: prefill, decode
# and mixed forwards) for a dense and an eager-MoE stack; torch.compile(mode="reduce-overhead") over a StaticCache (an
# eager prefill, then decodes replayed by Inductor's CUDA graph trees); assisted generation with a 2-layer draft model
# (the draft's forwards between the target's, not steps). Flex attention (compiled kernels, a block mask a forward) in
# a plain generate. And families no set had: a Llama 4 text stack (dense and MoE layers in turn, NoPE layers, chunked
# attention) over a chunked prefill, DBRX's fine-grained eager MoE, a Zamba 1 hybrid (Mamba-1 + one shared attention
# block) with left padding, an xLSTM trained without markers, ZAYA1's convolutional attention + top-1 MoE with a
# ProfilerStep per forward, Laguna's per-layer head counts with a host sync per step, Command A MoE's parallel attention
# + MoE with the window opening and closing mid-forward, and differential attention in CUDA graph replays. Every
# family / loop pair is new.
HOLDOUT8 = [
    S("qwen3_4_continuous_batching", "qwen3", "continuous_batching", layers=4, steps=[10, 8], cost=8),
    S("flex_olmo4_continuous_batching", "flex_olmo", "continuous_batching", layers=4, rs=False, steps=[10, 8],
      cost=10),
    S("seed_oss6_reduce_overhead_hand", "seed_oss", "reduce_overhead_hand", layers=6, batch=2, steps=[10, 8],
      cost=COMPILE_COST),
    S("ernie4_5_6_assisted_generate", "ernie4_5", "assisted_generate", layers=6, steps=[12, 10], cost=6),
    S("llama_flex6_eager_generate", "llama_flex", "eager_generate", layers=6, batch=2, steps=[10, 8],
      opts={"warmup_tokens": 10}, cost=COMPILE_COST),
    S("llama4_8_hand_extend", "llama4", "hand_extend", layers=8, steps=[8, 6]),
    S("dbrx6_eager_generate", "dbrx", "eager_generate", layers=6, batch=2, rs=False, steps=[8, 6]),
    S("zamba9_sample_padded", "zamba", "sample_padded", layers=9, batch=3, rs=False, steps=[6, 5], cost=10),
    S("xlstm3_train_nomarkers", "xlstm", "train", layers=3, rs=False, steps=[2, 1], opts={"markers": "none"},
      cost=10),
    S("zaya6_profstep_hand", "zaya", "profstep_hand", layers=6, batch=2, steps=[6, 5]),
    S("laguna6_hand_item", "laguna", "hand", layers=6, rs=False, steps=[8, 6], opts={"item": True}),
    S("cohere2_moe8_midstep", "cohere2_moe", "midstep", layers=8, batch=2, steps=[5, 4], cost=6),
    S("diffllama6_cudagraph", "diffllama", "cudagraph", layers=6, batch=2, rs=False, steps=[10, 8]),
]
# A ninth holdout (`--holdout9`): kinds of program no set had. Plain PyTorch without transformers: a gpt-fast-style
# dense transformer (its own attention over preallocated KV-cache tensors, RMSNorm, rotary, SwiGLU) decoded by
# gpt-fast's eager loop, the same with decode_one_token under torch.compile(mode="reduce-overhead", fullgraph=True)
# (forward + sampling in one CUDA graph tree replay), a hand-written MoE block (router top-2 of 8, an eager loop over
# the experts' torch.where selections) with gpt-fast's sampling, and nanoGPT-style compiled training under bf16 autocast
# (Inductor's forward and backward graphs, fused AdamW). Encoder-decoders in generate: BART and a distil-whisper-shaped
# speech model (an encoder run once, folded into the first decoder forward, the prefill; then decoder forwards with
# cross-attention). Two generate variants: sampling with num_return_sequences=3 (rows expanded before the prefill) and
# cache_implementation="offloaded" (each layer's KV copied to the CPU and prefetched back). And families no set had, in
# loops they were never paired with: MiniMax-M2 in prompt lookup, GraniteMoE-shared with a ProfilerStep per forward,
# GLM-4.7-Flash's MLA + MoE over a static cache, Doge's dynamic-mask attention in beam search, BitNet with the window
# opening and closing mid-forward, and EXAONE MoE (sliding/full, dense/MoE) with a host sync per step. Dropped: Doge's
# cross-domain MoE (is_moe: its decoder layer takes the MoE's tuple for a tensor in transformers 5.17); DoLa,
# contrastive search and group beam search (moved out of transformers 5's core to Hub repositories: generate would
# download code); gradient accumulation (HOLDOUT2 and HOLDOUT6 have it); T5 with a decoder deeper than its encoder (its
# cache is sized by the encoder's depth: an IndexError in transformers 5.17). Every family / loop pair is new.
HOLDOUT9 = [
    S("gptfast6_plain_hand", "gptfast", "plain_hand", layers=6, batch=2, steps=[12, 10, 8]),
    S("gptfast8_plain_reduce_overhead", "gptfast", "plain_reduce_overhead", layers=8, steps=[12, 10],
      opts={"sample": True}, cost=COMPILE_COST),
    S("gptfast_moe4_plain_hand", "gptfast_moe", "plain_hand", layers=4, batch=2, rs=False, steps=[10, 8, 6],
      opts={"sample": True}),
    S("gptfast4_plain_train_compiled", "gptfast", "plain_train", layers=4, steps=[3, 2], cost=COMPILE_COST + 20),
    S("bart6_seq2seq_generate", "bart", "seq2seq_generate", layers=6, batch=2, steps=[10, 8]),
    S("whisper2_seq2seq_generate", "whisper", "seq2seq_generate", layers=2, batch=2, rs=False, steps=[12, 10]),
    S("hunyuan_dense6_sample_multi", "hunyuan_dense", "sample_multi", layers=6, batch=2, steps=[10, 8]),
    S("arcee6_offloaded_generate", "arcee", "offloaded_generate", layers=6, steps=[10, 8]),
    S("minimax_m2_4_prompt_lookup", "minimax_m2", "prompt_lookup_generate", layers=4, rs=False, steps=[16, 12, 8]),
    S("granitemoeshared6_profstep_generate_hook", "granitemoeshared", "profstep_generate_hook", layers=6, batch=2,
      steps=[6, 5]),
    S("glm4_moe_lite6_static_generate", "glm4_moe_lite", "static_generate", layers=6, batch=2, rs=False,
      steps=[8, 6]),
    S("doge6_beam", "doge", "beam_generate", layers=6, steps=[8, 6]),
    S("bitnet6_midstep", "bitnet", "midstep", layers=6, batch=2, steps=[5, 4]),
    S("exaone_moe8_hand_item", "exaone_moe", "hand", layers=8, rs=False, steps=[8, 6], opts={"item": True}),
]
# A tenth holdout (`--holdout10`): kinds no set had. Vision-language generation: the prefill runs a vision tower over
# an image's patches (a windowed ViT with a patch merger, Qwen2.5-VL; a SigLIP tower pooled to 16 soft tokens, Gemma 3;
# a CLIP ViT with an MLP projector, LLaVA; a tiled encoder whose features the text reads through cross-attention
# layers, Llama 3.2 Vision; DeepStack features added into the first text layers, Qwen3-VL), then the text stack; the
# decodes run the text stack only. They come in greedy generate, sampling at batch 2 (an image a row), a hand loop
# (pixel_values in the prefill's call only) and generate over a static cache; `layers` is the text decoder's depth,
# `vision_layers` the tower's. Encoder-decoders of the T5 line (T5 v1.1; Switch Transformers, whose every 2nd block
# is a top-1 MoE), with the encoder as deep as the decoder. And decoder-only families no set had, in loops they were
# never paired with: Apertus's xIELU MLP in CUDA graph replays, nanochat's ReLU² MLP under torch.compile,
# VaultGemma with a ProfilerStep per forward, Helium with the window opening and closing mid-forward, Mamba-1 sampling
# with num_return_sequences, Code World Model's 1 full : 3 sliding layers over a static cache, and Ministral 3's
# position-scaled queries in beam search. Left out: Youtu (its generate fails with a shape error on a tiny config in
# transformers 5.17); Chameleon (no AutoModelForCausalLM mapping in 5.17, and its image path needs a VQ-VAE tokenizer
# and a vocabulary map built by hand), SmolVLM / Idefics3 (image splitting is its processor's work; one more CLIP-like
# tower adds little to LLaVA's), RWKV and BLT (a custom WKV kernel; a byte patcher model): not tried. Mllama is not
# in the hand loop (its decodes need the cross-attention mask extended by the loop). Every family / loop pair is new.
HOLDOUT10 = [
    S("qwen2_5_vl6_vlm_generate", "qwen2_5_vl", "vlm_generate", layers=6, steps=[10, 8, 6], cost=8),
    S("gemma3_vlm6_vlm_sample", "gemma3_vlm", "vlm_sample", layers=6, batch=2, rs=False, steps=[10, 8, 6], cost=8),
    S("llava6_vlm_hand", "llava", "vlm_hand", layers=6, steps=[10, 8], cost=6),
    S("mllama6_vlm_generate", "mllama", "vlm_generate", layers=6, batch=2, rs=False, steps=[8, 6, 5], cost=8),
    S("qwen3_vl6_vlm_static_generate", "qwen3_vl", "vlm_static_generate", layers=6, steps=[10, 8, 6], cost=8),
    S("switch_transformers4_seq2seq_generate", "switch_transformers", "seq2seq_generate", layers=4, batch=2,
      steps=[10, 8, 6]),
    S("t5_6_seq2seq_generate", "t5", "seq2seq_generate", layers=6, rs=False, steps=[12, 10, 8]),
    S("apertus6_cudagraph", "apertus", "cudagraph", layers=6, batch=2, rs=False, steps=[10, 8]),
    S("nanochat8_compiled_generate", "nanochat", "compiled_generate", layers=8, steps=[10, 8], cost=COMPILE_COST),
    S("vaultgemma6_profstep_hand", "vaultgemma", "profstep_hand", layers=6, batch=2, steps=[6, 5]),
    S("helium6_midstep", "helium", "midstep", layers=6, rs=False, steps=[5, 4]),
    S("mamba6_sample_multi", "mamba", "sample_multi", layers=6, rs=False, steps=[8, 6], cost=8),
    S("cwm8_static_generate", "cwm", "static_generate", layers=8, steps=[10, 8, 6]),
    S("ministral3_6_beam", "ministral3", "beam_generate", layers=6, rs=False, steps=[8, 6, 5]),
]
# An eleventh holdout (`--holdout11`): families no set had, each in a loop its kind of stack was not read in before.
# Unlike layers of a new sort: Gemma 3n's text stack (AltUp, LAuReL, per-layer inputs, activation sparsity in the first
# 2 layers), whose last 3 of 8 layers reuse an earlier layer's KV cache and have no K/V projections of their own (two
# kinds of layer: 5 + 3), in sampling with left padding and with the window opening and closing mid-forward. Eager MoE
# with a shared expert in every layer (Solar Open) in greedy generate. A dense LayerNorm + ReLU² stack (Jais 2) trained
# without markers and in CUDA graph replays; Ministral's interleaved full / sliding layers under torch.compile; GLM-4's
# half rotary in continuous batching; BioGPT's learned positions in beam search. Encoder-decoders of two new layouts:
# NLLB-MoE (every 2nd layer a top-2 MoE over 8 experts: dense and sparse decoder layers, 2 + 2) and UMT5 (a relative
# position bias in every block, so one kind of decoder layer where T5 has two). And VLMs in loops their kinds were not
# paired with: Qwen2-VL (M-RoPE, a full-attention ViT) sampling at batch 2, PaliGemma's prefix-LM (the image and prompt
# attend both ways in the prefill) over a static cache, LFM2-VL (a SigLIP2 NaFlex tower; the text stack conv and
# attention layers in turn: 3 + 3) in greedy generate, and InternVL (InternViT, pixel shuffle) in a hand loop at batch
# 2. Left out: Gemma 3n's full multimodal model (its MobileNetV5 vision tower is a timm model and its audio tower a
# Conformer: the text stack is what a decode loop runs, so Gemma3nForCausalLM); mBART, Marian and Pegasus (BART's
# layout with other norms and positions: BART is in HOLDOUT9, and NLLB-MoE and UMT5 add more); Aya Vision (a SigLIP
# tower + Cohere 2 text, both read before); SmolVLM / Idefics3 (image splitting is its processor's work). None of the
# new families needs a custom CUDA kernel (LFM2's causal_conv1d falls back to its PyTorch path) or a download. Every
# family / loop pair is new.
HOLDOUT11 = [
    S("gemma3n8_sample_padded", "gemma3n", "sample_padded", layers=8, batch=3, steps=[8, 6, 5], cost=8),
    S("gemma3n8_midstep", "gemma3n", "midstep", layers=8, rs=False, steps=[5, 4], cost=6),
    S("solar_open6_eager_generate", "solar_open", "eager_generate", layers=6, batch=2, steps=[8, 6, 5]),
    S("jais2_4_train_nomarkers", "jais2", "train", layers=4, rs=False, steps=[2, 1], opts={"markers": "none"},
      cost=8),
    S("jais2_6_cudagraph", "jais2", "cudagraph", layers=6, batch=2, steps=[10, 8]),
    S("ministral8_compiled_generate", "ministral", "compiled_generate", layers=8, rs=False, steps=[10, 8],
      cost=COMPILE_COST),
    S("glm6_continuous_batching", "glm", "continuous_batching", layers=6, steps=[10, 8], cost=8),
    S("biogpt6_beam", "biogpt", "beam_generate", layers=6, rs=False, steps=[8, 6, 5]),
    S("nllb_moe4_seq2seq_generate", "nllb_moe", "seq2seq_generate", layers=4, batch=2, steps=[10, 8, 6], cost=6),
    S("umt5_6_seq2seq_generate", "umt5", "seq2seq_generate", layers=6, rs=False, steps=[12, 10, 8]),
    S("qwen2_vl6_vlm_sample", "qwen2_vl", "vlm_sample", layers=6, batch=2, rs=False, steps=[10, 8, 6], cost=8),
    S("paligemma6_vlm_static_generate", "paligemma", "vlm_static_generate", layers=6, steps=[10, 8, 6], cost=8),
    S("lfm2_vl6_vlm_generate", "lfm2_vl", "vlm_generate", layers=6, steps=[10, 8, 6], cost=8),
    S("internvl6_vlm_hand", "internvl", "vlm_hand", layers=6, batch=2, steps=[10, 8], cost=6),
]
CUTS = [  # (name, source trace, how many forwards keep all their kernels; None: almost no kernels)
    ("cut_keeps_few_steps", "llama_eager_generate", 3),
    ("cut_almost_no_kernels", "gemma2_eager_generate", None),
]
HOLDOUT6_CUTS = [  # cuts of an eager-MoE and a hybrid trace (the corpus's are of dense ones)
    ("cut_longcat_flash_keeps_few_steps", "longcat_flash4_eager_generate", 3),
    ("cut_olmo_hybrid_keeps_prefill_extend", "olmo_hybrid8_hand_extend", 2),
]


def smoke_spec(spec: Spec) -> Spec:
    s = Spec(**{**spec.__dict__, "opts": dict(spec.opts)})
    s.layers = max(2, min(spec.layers, 4 if spec.loop != "deep_nomarkers" else 6))
    if spec.family == "zamba":  # two layers with the shared block at least (transformers ties them)
        s.layers = min(spec.layers, 6)
    # prompt lookup: enough new tokens that candidates are found and verified (fewer forwards than tokens)
    knob = {"train": 2, "train_checkpointed": 2, "prompt_lookup_generate": 12, "continuous_batching": 6}.get(spec.loop,
                                                                                                             4)
    s.steps = [min(spec.steps[0], knob)]
    s.batch = min(spec.batch, 3)
    return s


# cut files -----------------------------------------------------------------------------------------------------
def make_cut(out_dir: str, name: str, source: str, keep_forwards: int | None) -> None:
    """Truncate the source trace's JSON text (as written: CPU events first, GPU events after) at a byte offset.
    The truth lists the forwards whose every runtime launch in its CPU span still has its GPU activity."""
    src_gz = os.path.join(out_dir, f"{source}.json.gz")
    with gzip.open(src_gz, "rb") as f:
        text = f.read()
    truth_src = json.load(open(os.path.join(out_dir, f"{source}.truth.json")))
    doc = json.loads(text)
    events = doc["traceEvents"]
    whole = [f for f in truth_src["each_forward"] if f["window"] == "whole"]
    # line offsets: trim_trace writes one event per line, in the source order
    lines, pos = text.split(b"\n"), 0
    ev_line_end = []
    for ln in lines:
        pos += len(ln) + 1
        s = ln.strip()
        if s.startswith(b"{") and (s.endswith(b"},") or s.endswith(b"}")) and b'"ph"' in s:
            ev_line_end.append(pos)
    assert len(ev_line_end) == len(events), (len(ev_line_end), len(events))
    gpu_at = {}  # correlation -> index of its last GPU activity in file order (a graph replay runs many under one)
    for i, e in enumerate(events):
        if e.get("cat") in GPU_CATS and "correlation" in e.get("args", {}):
            gpu_at[e["args"]["correlation"]] = i
    launches = [(e["ts"], e["args"]["correlation"]) for e in events
                if e.get("cat") in LAUNCH_CATS and "correlation" in e.get("args", {})
                and e["args"]["correlation"] in gpu_at]
    need = []  # per whole forward: the event index after which all its GPU activities are in the file
    for f in whole:
        s_us, e_us = f["cpu_start_ns"] / 1000, f["cpu_end_ns"] / 1000
        mine = [gpu_at[c] for t, c in launches if s_us <= t <= e_us]
        need.append(max(mine) if mine else -1)
    gpu_idx = sorted(gpu_at.values())
    if not gpu_idx:
        print(f"{name}: {source} has no GPU activities (a CPU smoke run): no cut made", flush=True)
        return
    if keep_forwards is None:  # keep about 1% of the GPU activities
        cut_event = gpu_idx[max(1, len(gpu_idx) // 100)]
    else:
        done = sorted(need)
        k = min(keep_forwards, len(done)) - 1
        nxt = done[k + 1] if k + 1 < len(done) else len(events) - 1
        cut_event = (done[k] + nxt) // 2  # past the k-th complete forward, inside the next one's kernels
    cut_at = ev_line_end[cut_event] - 40  # mid-line: the last event is cut in the middle, as a real cut would be
    complete = [i for i, f in enumerate(whole) if need[i] < cut_event]
    # every launch inside the forward's span has its GPU activity within the cut text
    salv = [whole[i] for i in complete]
    out = os.path.join(out_dir, f"{name}.json.gz")
    with gzip.open(out, "wb", compresslevel=9) as f:
        f.write(text[:cut_at])
    n_gpu_total = sum(e.get("cat") in GPU_CATS for e in events)
    kept_kernels = sum(1 for i, e in enumerate(events) if e.get("cat") in GPU_CATS and i < cut_event)
    truth = {
        "name": name, "family": truth_src["family"], "loop": "cut", "workload": truth_src["workload"],
        "record_shapes": truth_src["record_shapes"],
        "steps": dict(Counter(f["phase"] for f in salv)), "partial_at_edges": 0,
        "layers": truth_src["layers"], "layer_kinds": truth_src["layer_kinds"], "batch": truth_src["batch"],
        "what": f"the JSON text of {source}.json.gz (trimmed, Kineto's layout: every CPU event first, the runtime "
                "launches and GPU activities after them in time order) cut at a byte offset inside an event",
        "how": "scripts/make_accuracy_corpus.py make_cut: text[:cut_at_byte], gzipped",
        "cut_at_byte": cut_at, "whole_bytes": len(text), "source": f"{source}.json.gz",
        "whole_truth": {k: truth_src[k] for k in ("steps", "partial_at_edges", "layers", "layer_kinds", "loop",
                                                   "each_forward")},
        "whole_steps_with_all_kernels": {"count": len(salv), "forward_indices": complete,
                                         "phases": dict(Counter(f["phase"] for f in salv))},
        "expect_user_error": len(salv) == 0,
        "kernels_in_file": kept_kernels, "kernels_launched": n_gpu_total,
        "kernels_rule": "GPU activities (kernel, gpu_memcpy, gpu_memset) wholly written before the cut; launched = "
                        "all in the whole trace (each has a runtime launch with the same correlation)",
        "steps_rule": "steps = the phases of the whole forwards whose every runtime launch (cuda_runtime / "
                      "cuda_driver with a correlation, inside the forward's CPU span) has its GPU activity in the "
                      "cut text; with none, decodegap should refuse the file (UserError, exit 2)",
        "trace": f"{name}.json.gz", "trace_gz_bytes": os.path.getsize(out),
        "made_by": "scripts/make_accuracy_corpus.py",
    }
    truth.update({k: truth_src[k] for k in ("torch", "transformers", "gpu", "layer_kind_detail", "config_info")
                  if k in truth_src})  # the kinds the config tells apart (layer types) too
    write_truth(out_dir, name, truth)
    print(f"{name}: cut at byte {cut_at} of {len(text)}; {kept_kernels} of {n_gpu_total} GPU activities; whole "
          f"forwards with every kernel: {len(salv)} of {len(whole)}", flush=True)


def cut_all(src_dir: str, out_dir: str, keeps: tuple[int, ...] = (3, 0)) -> int:
    """Cuts of every trace of `src_dir` (a holdout's folder) into `out_dir`: `cut<k>_<name>` keeps k whole forwards
    (traces with k + 2 or more), `cut0_<name>` almost no kernels. Returns how many failed."""
    failed = 0
    for truth_path in sorted(glob.glob(os.path.join(src_dir, "*.truth.json"))):
        source = json.load(open(truth_path))
        if source.get("loop") == "cut":
            continue
        whole = [f for f in source.get("each_forward", []) if f["window"] == "whole"]
        for keep in [k or None for k in keeps if not k or len(whole) >= k + 2]:
            name = f"cut{keep or 0}_{source['name']}"
            try:
                make_cut(src_dir, name, source["name"], keep)
            except Exception:
                traceback.print_exc()
                failed += 1
                continue
            for ext in (".json.gz", ".truth.json"):
                shutil.move(os.path.join(src_dir, name + ext), os.path.join(out_dir, name + ext))
    return failed


# driver --------------------------------------------------------------------------------------------------------
def run_specs(out_dir: str, device: str, names: list[str]) -> list[str]:
    by_name = {s.name: s for s in SPECS + HOLDOUT + HOLDOUT2 + HOLDOUT3 + HOLDOUT4 + HOLDOUT5 + HOLDOUT6
               + HOLDOUT7 + HOLDOUT8 + HOLDOUT9 + HOLDOUT10 + HOLDOUT11}
    failed = []
    ctx = Ctx(out_dir, device)
    deadline = float(os.environ.get("CORPUS_DEADLINE", "inf"))
    for name in names:
        if time.time() > deadline:
            failed.append(f"{name}: skipped: past the run's deadline")
            continue
        spec = by_name[name]
        if SMOKE:
            spec = smoke_spec(spec)
        t0 = time.time()
        try:
            LOOPS[spec.loop](ctx, spec)
        except Exception as exc:  # one failure must not cost the rest of the GPU run
            traceback.print_exc()
            failed.append(f"{name}: {type(exc).__name__}: {str(exc)[:300]}")
        print(f"{name}: {time.time() - t0:.1f} s", flush=True)
        if device == "cuda":
            torch.cuda.empty_cache()
    return failed


def corpus_bytes(out_dir: str) -> int:
    return sum(os.path.getsize(os.path.join(out_dir, f)) for f in os.listdir(out_dir)
               if f.endswith((".json.gz", ".truth.json")))


def shrink_to_budget(out_dir: str, device: str, budget: int) -> list[str]:
    """While the corpus is over `budget`, capture the largest trace again at its next smaller size knob (never the
    compiled or recorded ones: too slow to redo). Returns what failed."""
    by_name = {s.name: s for s in SPECS + HOLDOUT + HOLDOUT2 + HOLDOUT3 + HOLDOUT4 + HOLDOUT5 + HOLDOUT6
               + HOLDOUT7 + HOLDOUT8 + HOLDOUT9 + HOLDOUT10 + HOLDOUT11}
    failed, tried = [], set()
    while corpus_bytes(out_dir) > budget and time.time() < float(os.environ.get("CORPUS_DEADLINE", "inf")):
        sizes = []
        for s in SPECS:
            tp = os.path.join(out_dir, f"{s.name}.truth.json")
            if s.loop.startswith("compiled") or s.loop == "record" or s.name in tried or not os.path.exists(tp):
                continue
            t = json.load(open(tp))
            smaller = [k for k in s.steps if k < t.get("size_knob", 0)]
            if smaller:
                sizes.append((t["trace_gz_bytes"], s.name, smaller, t.get("size_knob")))
        if not sizes:
            print(f"budget: {corpus_bytes(out_dir) / 1e6:.1f} MB and nothing left to shrink", flush=True)
            break
        size, name, smaller, knob = max(sizes)
        tried.add(name)
        spec = by_name[name]
        spec.steps = smaller
        spec.opts["budget_note"] = (f"captured again at a smaller size knob (was {knob}, {size / 1e3:.0f} kB) to keep "
                                    f"the corpus under {budget / 1e6:.1f} MB")
        print(f"budget: corpus {corpus_bytes(out_dir) / 1e6:.1f} MB > {budget / 1e6:.1f}: {name} again at {smaller}",
              flush=True)
        failed += run_specs(out_dir, device, [name])
    return failed


def clock_probe(out_dir: str, device: str) -> dict:
    """time.time_ns() around single ops vs their Kineto ts: ts * 1000 + baseTimeNanoseconds lies between."""
    x = torch.ones(4096, device=device)
    marks = []
    with profile(activities=activities(device)) as prof:
        for _ in range(20):
            a = time.time_ns()
            torch.add(x, 1)
            marks.append((a, time.time_ns()))
            time.sleep(0.001)
        sync(device)
    raw = os.path.join(tempfile.mkdtemp(), "clock.json")
    prof.export_chrome_trace(raw)
    doc = json.load(open(raw))
    base = doc["baseTimeNanoseconds"]
    adds = sorted(e["ts"] for e in doc["traceEvents"] if e.get("name") == "aten::add" and e.get("cat") == "cpu_op")
    after = [(ts * 1000 - (a - base)) / 1000 for (a, _), ts in zip(marks, adds, strict=False)]
    before = [((b - base) - ts * 1000) / 1000 for (_, b), ts in zip(marks, adds, strict=False)]
    res = {"what": "20 torch.add calls, each between two time.time_ns() reads; the op's Kineto ts*1000 + "
                   "baseTimeNanoseconds compared with them (us; both positive = the clocks agree within the call)",
           "op_ts_after_first_read_us": {"min": min(after), "max": max(after)},
           "op_ts_before_second_read_us": {"min": min(before), "max": max(before)}, "ops": len(adds)}
    res.update(versions())
    with open(os.path.join(out_dir, "clock_probe.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(f"clock probe: {res}", flush=True)
    return res


def table_rows(folder: str) -> str:
    """One markdown row per trace of a corpus folder, from its truth files."""
    rows = ["| trace | kB | family | loop | record_shapes | truth: steps (whole forwards) / partial / layers / kinds / "
            "batch / kernels per forward | how it was made |", "|---|---|---|---|---|---|---|"]
    for name in sorted(f[: -len(".truth.json")] for f in os.listdir(folder) if f.endswith(".truth.json")):
        t = json.load(open(os.path.join(folder, f"{name}.truth.json")))
        steps = ", ".join(f"{v} {k}" for k, v in t["steps"].items()) or "none (expect UserError)"
        k = t.get("kernels_per_whole_forward") or []
        kern = (f"{min(k)}" if min(k) == max(k) else f"{min(k)}-{max(k)}") if k else "-"
        if t["loop"] == "cut":
            kern = f"{t['kernels_in_file']} of {t['kernels_launched']} GPU activities kept"
        truth = (f"{steps} / {t['partial_at_edges']} / {t['layers']} / {'+'.join(map(str, t['layer_kinds']))} / "
                 f"{','.join(map(str, t['batch']))} / {kern}")
        fit = " (smaller: size fit)" if ("size_fit" in t or "size_fit_budget" in t) else ""
        rows.append(f"| `{name}` | {t['trace_gz_bytes'] // 1000} | {t['family']} | {t['loop']} | "
                    f"{'yes' if t['record_shapes'] else 'no'} | {truth}{fit} | {t['what']} |")
    return "\n".join(rows)


def spread(names: list[str], jobs: int) -> list[list[str]]:
    by_name = {s.name: s for s in SPECS + HOLDOUT + HOLDOUT2 + HOLDOUT3 + HOLDOUT4 + HOLDOUT5 + HOLDOUT6
               + HOLDOUT7 + HOLDOUT8 + HOLDOUT9 + HOLDOUT10 + HOLDOUT11}
    groups: list[list] = [[0.0, []] for _ in range(jobs)]
    for n in sorted(names, key=lambda n: -by_name[n].cost):
        g = min(groups, key=lambda g: g[0])
        g[0] += by_name[n].cost
        g[1].append(n)
    return [g[1] for g in groups if g[1]]


def main() -> None:
    global SMOKE
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", nargs="?")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--only", nargs="*")
    parser.add_argument("--jobs", type=int, default=1, help="processes sharing the GPU")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (the CPU check)")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--table", metavar="DIR", help="print the README table rows of a corpus folder")
    parser.add_argument("--no-cuts", action="store_true")
    parser.add_argument("--holdout", action="store_true", help="make the HOLDOUT traces instead (no cuts)")
    parser.add_argument("--holdout2", action="store_true", help="make the HOLDOUT2 traces instead (no cuts)")
    parser.add_argument("--holdout3", action="store_true", help="make the HOLDOUT3 traces instead (no cuts)")
    parser.add_argument("--holdout4", action="store_true", help="make the HOLDOUT4 traces instead (no cuts)")
    parser.add_argument("--holdout5", action="store_true", help="make the HOLDOUT5 traces instead (no cuts)")
    parser.add_argument("--holdout6", action="store_true",
                        help="make the HOLDOUT6 traces instead (and HOLDOUT6_CUTS unless --no-cuts)")
    parser.add_argument("--holdout7", action="store_true", help="make the HOLDOUT7 traces instead (no cuts)")
    parser.add_argument("--holdout8", action="store_true", help="make the HOLDOUT8 traces instead (no cuts)")
    parser.add_argument("--holdout9", action="store_true", help="make the HOLDOUT9 traces instead (no cuts)")
    parser.add_argument("--holdout10", action="store_true", help="make the HOLDOUT10 traces instead (no cuts)")
    parser.add_argument("--holdout11", action="store_true", help="make the HOLDOUT11 traces instead (no cuts)")
    parser.add_argument("--cuts-of", metavar="DIR", help="instead, cut every trace of DIR (with its truth) two ways "
                        "into OUT_DIR: after 3 whole forwards (where it has 5) and with almost no kernels")
    parser.add_argument("--cut-keep", default="3,0", help="with --cuts-of: the whole forwards each cut keeps, comma "
                        "separated (0: almost no kernels; k: where the trace has k + 2 whole forwards)")
    parser.add_argument("--seconds", type=float, help="start no new trace after this many seconds")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    SMOKE = args.smoke
    if args.seconds:
        os.environ["CORPUS_DEADLINE"] = str(time.time() + args.seconds)  # the workers inherit it
    if args.table:
        print(table_rows(args.table))
        return
    if args.list:
        for s in SPECS:
            print(f"{s.name:36s} {s.family:12s} {s.loop:24s} layers {s.layers:2d} batch {s.batch} rs {s.rs} {s.opts}")
        return
    os.makedirs(args.out_dir, exist_ok=True)
    if args.cuts_of:
        sys.exit(cut_all(args.cuts_of, args.out_dir, tuple(int(k) for k in args.cut_keep.split(","))))
    chosen = (HOLDOUT11 if args.holdout11 else HOLDOUT10 if args.holdout10 else HOLDOUT9 if args.holdout9
              else HOLDOUT8 if args.holdout8 else HOLDOUT7 if args.holdout7
              else HOLDOUT6 if args.holdout6 else HOLDOUT5 if args.holdout5 else HOLDOUT4 if args.holdout4
              else HOLDOUT3 if args.holdout3
              else HOLDOUT2 if args.holdout2 else HOLDOUT if args.holdout else SPECS)
    names = args.only or [s.name for s in chosen]
    unknown = set(names) - {s.name for s in SPECS + HOLDOUT + HOLDOUT2 + HOLDOUT3 + HOLDOUT4 + HOLDOUT5 + HOLDOUT6
                            + HOLDOUT7 + HOLDOUT8 + HOLDOUT9 + HOLDOUT10 + HOLDOUT11}
    if unknown:
        sys.exit(f"unknown: {sorted(unknown)}")
    t0 = time.time()
    if args.worker or args.jobs <= 1:
        failed = run_specs(args.out_dir, args.device, names)
    else:
        procs = []
        for i, group in enumerate(spread(names, args.jobs)):
            cmd = [sys.executable, os.path.abspath(__file__), args.out_dir, "--device", args.device, "--worker",
                   "--only", *group] + (["--smoke"] if args.smoke else [])
            logf = open(os.path.join(args.out_dir, f"worker{i}.log"), "w")
            procs.append((subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT), logf, group))
        failed = []
        for i, (p, logf, group) in enumerate(procs):
            p.wait()
            logf.close()
            text = open(logf.name).read()
            print(f"===== worker {i} rc {p.returncode}: {' '.join(group)}\n{text}", flush=True)
            failed += [ln[7:] for ln in text.splitlines() if ln.startswith("FAILED ")]
            with open(os.path.join(args.out_dir, "make.log"), "a") as f:
                f.write(f"===== worker {i} rc {p.returncode}\n{text}")
            if p.returncode not in (0, 1):
                failed.append(f"worker {i} died (rc {p.returncode})")
            os.remove(logf.name)
    if not args.worker and not args.only and chosen is SPECS:
        failed += shrink_to_budget(args.out_dir, args.device, TOTAL_LIMIT - 1_500_000)  # room for cuts + README
    if not args.worker:
        try:
            clock_probe(args.out_dir, args.device)
        except Exception:
            traceback.print_exc()
    if not args.worker and not args.no_cuts:
        for name, source, keep in (HOLDOUT6_CUTS if args.holdout6 else CUTS):
            if os.path.exists(os.path.join(args.out_dir, f"{source}.truth.json")):
                try:
                    make_cut(args.out_dir, name, source, keep)
                except Exception as exc:
                    traceback.print_exc()
                    failed.append(f"{name}: {type(exc).__name__}: {exc}")
    for line in failed:
        print("FAILED", line, flush=True)
    if not args.worker:
        total = sum(os.path.getsize(os.path.join(args.out_dir, f)) for f in os.listdir(args.out_dir))
        n = sum(f.endswith(".json.gz") for f in os.listdir(args.out_dir))
        print(f"corpus: {n} traces, {total / 1e6:.1f} MB in {args.out_dir} (limit {TOTAL_LIMIT / 1e6:.0f} MB); "
              f"{time.time() - t0:.0f} s; {len(failed)} failed", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
