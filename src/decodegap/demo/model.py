"""A GLM-5-shaped decode step with random weights: MLA attention (absorbed query) over a paged latent KV pool,
MoE MLP, RMSNorm, lm_head and greedy sampling. One decode step per call of `DemoModel.step`.

The context does not grow: each step writes the new token's latent into the last active slot and attends over
exactly `context` tokens, so every step does the same work and a captured CUDA graph stays valid forever.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from decodegap.demo.config import MLA_IMPL, DemoConfig
from decodegap.kernels import mla_decode

EPS = 1e-6
KV_SCALE = 1.0  # per-tensor FP8 scale; values are kept in e4m3's comfortable range instead


def _raw(t: torch.Tensor) -> torch.Tensor:
    """Same bytes as an integer tensor: index_copy_ has no float8 kernels, but a byte copy is dtype-blind."""
    return t.view(torch.uint8) if t.element_size() == 1 else t.view(torch.int16)


def _rows(pool: torch.Tensor) -> torch.Tensor:
    return _raw(pool.view(-1, pool.shape[-1]))


class DemoModel:
    """Weights, the KV pool and static step buffers (static so that a CUDA graph can replay the step)."""

    def __init__(self, config: DemoConfig, device: str | torch.device = "cpu") -> None:
        config.check()
        self.config = c = config
        self.device = torch.device(device)
        self.kv_read = c.kv_read
        g = torch.Generator(device=self.device)
        g.manual_seed(c.seed)
        dev, bf16 = self.device, torch.bfloat16

        def w(*shape: int, fan_in: int | None = None) -> torch.Tensor:
            # 1/sqrt(fan_in) keeps activations O(1) through 78 random layers
            t = torch.randn(*shape, generator=g, device=dev, dtype=bf16)
            return t.mul_((fan_in or shape[-1]) ** -0.5)

        def ones(n: int) -> torch.Tensor:
            return torch.ones(n, device=dev, dtype=bf16)

        H, nh = c.hidden, c.heads
        self.embed = w(c.vocab, H, fan_in=1)
        self.final_norm = ones(H)
        self.lm_head = w(c.vocab, H)
        self.layers: list[dict[str, torch.Tensor]] = []
        for i in range(c.layers):
            layer = {
                "attn_norm": ones(H), "mlp_norm": ones(H),
                "wq_a": w(c.q_lora, H), "q_a_norm": ones(c.q_lora), "wq_b": w(nh * (c.qk_nope + c.rope), c.q_lora),
                "wkv_a": w(c.kv_width, H), "kv_a_norm": ones(c.kv_lora),
                "w_uk": w(nh, c.qk_nope, c.kv_lora, fan_in=c.qk_nope),  # absorbed into the query
                "w_uv": w(nh, c.kv_lora, c.v_head, fan_in=c.kv_lora),  # absorbed into the output
                "wo": w(H, nh * c.v_head),
            }
            if i < c.dense_layers:
                layer.update(w13=w(2 * c.dense_intermediate, H), w2=w(H, c.dense_intermediate))
            else:
                I = c.moe_intermediate  # noqa: E741
                layer.update(router=w(c.experts, H), e13=w(c.experts, 2 * I, H), e2=w(c.experts, H, I),
                             s13=w(2 * I, H), s2=w(H, I))
            self.layers.append(layer)

        # The KV pool: page size 1 (token slots). Unused slots hold zeros; the active ones random latents.
        kv_dtype = torch.float8_e4m3fn if c.kv_dtype == "fp8" else bf16
        slots = torch.randperm(c.pool_slots, generator=g, device=dev)[: c.batch * c.context]
        self.block_table = slots.view(c.batch, c.context).to(torch.int32)
        self.seq_lens = torch.full((c.batch,), c.context, dtype=torch.int32, device=dev)
        self.write_slots = self.block_table[:, -1].long()  # the newest token's slot, rewritten every step
        self.pools = []
        for _ in range(c.layers):
            pool = torch.zeros(c.pool_slots, 1, c.kv_width, device=dev, dtype=kv_dtype)
            active = torch.randn(c.batch * c.context, c.kv_width, generator=g, device=dev, dtype=bf16)
            _rows(pool).index_copy_(0, slots, _raw((active / KV_SCALE).to(kv_dtype)))
            self.pools.append(pool)

        # Static step buffers: the graph reads `tokens`, writes `logits` and feeds the sampled token back.
        self.tokens = torch.randint(0, c.vocab, (c.batch,), generator=g, device=dev)
        self.logits = torch.zeros(c.batch, c.vocab, device=dev, dtype=torch.float32)
        positions = torch.full((c.batch,), c.context - 1, device=dev, dtype=torch.float32)
        inv_freq = 1.0 / (10000 ** (torch.arange(0, c.rope, 2, device=dev, dtype=torch.float32) / c.rope))
        freqs = positions[:, None] * inv_freq[None, :]
        self.cos = freqs.cos().to(bf16).repeat(1, 2)  # [B, rope]
        self.sin = freqs.sin().to(bf16).repeat(1, 2)
        self._graph: torch.cuda.CUDAGraph | None = None

    # -- one decode step ---------------------------------------------------------------------------------------
    def forward(self) -> torch.Tensor:
        """Embed `tokens`, run every layer, write `logits` and the greedy next token into `tokens`."""
        c = self.config
        x = F.embedding(self.tokens, self.embed)
        for i, layer in enumerate(self.layers):
            x = x + self._attention(i, layer, F.rms_norm(x, (c.hidden,), layer["attn_norm"], EPS))
            h = F.rms_norm(x, (c.hidden,), layer["mlp_norm"], EPS)
            x = x + (self._dense(layer, h) if "w13" in layer else self._moe(layer, h))
        x = F.rms_norm(x, (c.hidden,), self.final_norm, EPS)
        self.logits.copy_(F.linear(x, self.lm_head))
        self.tokens.copy_(self.logits.argmax(dim=-1))  # greedy sampling, fed back to the next step
        return self.logits

    def _rope(self, x: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        cos, sin = (self.cos, self.sin) if x.dim() == 2 else (self.cos[:, None], self.sin[:, None])
        return x * cos + rotated * sin

    def _attention(self, i: int, layer: dict[str, torch.Tensor], h: torch.Tensor) -> torch.Tensor:
        c = self.config
        B, nh = h.shape[0], c.heads
        q = F.linear(F.rms_norm(F.linear(h, layer["wq_a"]), (c.q_lora,), layer["q_a_norm"], EPS), layer["wq_b"])
        q = q.view(B, nh, c.qk_nope + c.rope)
        q_nope, q_rope = q[..., : c.qk_nope], q[..., c.qk_nope:]
        q_latent = torch.bmm(q_nope.transpose(0, 1), layer["w_uk"]).transpose(0, 1)  # [B, nh, 512]
        q_mla = torch.cat((q_latent, self._rope(q_rope)), dim=-1)

        kv = F.linear(h, layer["wkv_a"])
        latent = F.rms_norm(kv[:, : c.kv_lora], (c.kv_lora,), layer["kv_a_norm"], EPS)
        row = torch.cat((latent, self._rope(kv[:, c.kv_lora:])), dim=-1)
        pool = self.pools[i]
        _rows(pool).index_copy_(0, self.write_slots, _raw((row / KV_SCALE).to(pool.dtype)))

        o_latent = mla_decode(q_mla, pool, self.block_table, self.seq_lens, c.sm_scale, KV_SCALE,
                              impl=MLA_IMPL[self.kv_read], validate=False)  # [B, nh, 512]; own table: no sync
        o = torch.bmm(o_latent.transpose(0, 1), layer["w_uv"]).transpose(0, 1)  # [B, nh, v_head]
        return F.linear(o.reshape(B, nh * c.v_head), layer["wo"])

    @staticmethod
    def _dense(layer: dict[str, torch.Tensor], h: torch.Tensor) -> torch.Tensor:
        gate, up = F.linear(h, layer["w13"]).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, layer["w2"])

    def _moe(self, layer: dict[str, torch.Tensor], h: torch.Tensor) -> torch.Tensor:
        """Sigmoid router, top-k, normalized weights; the chosen experts' weights are gathered and applied with
        two batched matmuls: a fixed kernel count per layer and no host sync (graph-capturable)."""
        c = self.config
        B, k = h.shape[0], c.top_k
        scores = torch.sigmoid(F.linear(h, layer["router"]).float())
        weights, idx = scores.topk(k, dim=-1)
        weights = (weights / weights.sum(dim=-1, keepdim=True)).to(h.dtype)
        flat = idx.reshape(-1)
        xk = h.repeat_interleave(k, dim=0).unsqueeze(-1)  # [B*k, H, 1]
        gate, up = torch.bmm(layer["e13"][flat], xk).squeeze(-1).chunk(2, dim=-1)
        out = torch.bmm(layer["e2"][flat], (F.silu(gate) * up).unsqueeze(-1)).view(B, k, c.hidden)
        routed = (out * weights.unsqueeze(-1)).sum(dim=1)
        return routed + self._dense({"w13": layer["s13"], "w2": layer["s2"]}, h)

    # -- stepping ------------------------------------------------------------------------------------------------
    def capture_graph(self, warmup: int = 2) -> None:
        """Capture one decode step in a CUDA graph; `step` replays it from then on."""
        if self.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm up on a side stream, as graph capture requires
            for _ in range(warmup):
                self.forward()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.forward()
        self._graph = graph

    def step(self) -> torch.Tensor:
        """One decode step: a graph replay when captured, else the eager forward."""
        if self._graph is not None:
            self._graph.replay()
            return self.logits
        with torch.no_grad():
            return self.forward()

    def parameter_bytes(self) -> int:
        tensors = [self.embed, self.lm_head, self.final_norm] + [t for layer in self.layers for t in layer.values()]
        return sum(t.numel() * t.element_size() for t in tensors)

    def pool_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.pools)
