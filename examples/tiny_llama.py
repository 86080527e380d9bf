"""A tiny Llama-style decoder in plain torch, built from a config with fixed seeds.

It mirrors the Hugging Face module names (``model.layers.0.self_attn.q_proj``,
``model.layers.0.mlp.down_proj``, ``lm_head``) so that dumps, comparisons and localization reports
read like those of a real model. Every piece is a small module or a plain function, so a test can
inject a bug by changing one config field or replacing one method.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class TinyLlamaConfig:
    vocab_size: int = 128
    hidden_size: int = 64
    intermediate_size: int = 160
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    #: ``None`` means the usual ``1 / sqrt(head_dim)``; set it to inject a softmax-scale bug.
    attention_scale: float | None = None
    tie_word_embeddings: bool = False

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def with_(self, **changes: object) -> TinyLlamaConfig:
        """A copy with some fields changed (``config.with_(num_layers=4)``)."""
        return replace(self, **changes)  # type: ignore[arg-type]


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalize in float32 like Llama, then cast back: the usual mixed-precision recipe.
        x32 = x.to(torch.float32)
        variance = x32.pow(2).mean(-1, keepdim=True)
        x32 = x32 * torch.rsqrt(variance + self.eps)
        return self.weight * x32.to(x.dtype)


class RotaryEmbedding(nn.Module):
    """cos/sin tables, computed in float32 whatever the model dtype (no buffer to be cast)."""

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.theta = theta

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        exponents = torch.arange(0, self.head_dim, 2, dtype=torch.float32, device=x.device)
        inv_freq = 1.0 / (self.theta ** (exponents / self.head_dim))
        freqs = positions[:, None].to(torch.float32) * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + rotate_half(x) * sin


class Attention(nn.Module):
    def __init__(self, config: TinyLlamaConfig) -> None:
        super().__init__()
        self.config = config
        d, h, kv = config.head_dim, config.num_heads, config.num_kv_heads
        self.q_proj = nn.Linear(config.hidden_size, h * d, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, kv * d, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, kv * d, bias=False)
        self.o_proj = nn.Linear(h * d, config.hidden_size, bias=False)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        c = self.config
        q, k, v = self.heads(x, cos, sin)
        scale = c.attention_scale if c.attention_scale is not None else 1 / math.sqrt(c.head_dim)
        scores = torch.matmul(q, k.transpose(-1, -2)) * scale
        scores = scores.masked_fill(mask, float("-inf"))
        probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        return self.merge_heads(torch.matmul(probs, v))

    def heads(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v per head, rotated, with k and v repeated for every query head (a variant
        such as a fused-kernel attention reuses this and replaces only the attention itself)."""
        c = self.config
        batch, seq, _ = x.shape
        q = self.q_proj(x).view(batch, seq, c.num_heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, seq, c.num_kv_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, seq, c.num_kv_heads, c.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        groups = c.num_heads // c.num_kv_heads
        return q, k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)

    def merge_heads(self, out: torch.Tensor) -> torch.Tensor:
        batch, _, seq, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, -1))


class MLP(nn.Module):
    def __init__(self, config: TinyLlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.act_fn = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: TinyLlamaConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, config: TinyLlamaConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.rotary_emb = RotaryEmbedding(config.head_dim, config.rope_theta)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        seq = input_ids.shape[-1]
        x = self.embed_tokens(input_ids)
        positions = torch.arange(seq, device=input_ids.device)
        cos, sin = self.rotary_emb(x, positions)
        mask = torch.ones(seq, seq, dtype=torch.bool, device=input_ids.device).triu(1)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return self.norm(x)


class TinyLlamaForCausalLM(nn.Module):
    def __init__(self, config: TinyLlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Logits of shape ``(batch, seq, vocab)``."""
        return self.lm_head(self.model(input_ids))


def build_tiny_llama(
    config: TinyLlamaConfig | None = None,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> TinyLlamaForCausalLM:
    """The model with weights drawn from ``seed``: the same seed gives bitwise the same weights."""
    config = config or TinyLlamaConfig()
    generator = torch.Generator().manual_seed(seed)
    model = TinyLlamaForCausalLM(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.1 * torch.randn(param.shape, generator=generator))
            else:
                std = 1.0 if "embed_tokens" in name else 1.0 / math.sqrt(param.shape[-1])
                param.copy_(std * torch.randn(param.shape, generator=generator))
    return model.to(device=device, dtype=dtype).eval()


def example_input_ids(
    config: TinyLlamaConfig | None = None, *, seq: int = 16, batch: int = 1, seed: int = 1
) -> torch.Tensor:
    """Deterministic token ids for tests and examples."""
    config = config or TinyLlamaConfig()
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, config.vocab_size, (batch, seq), generator=generator)


@torch.no_grad()
def greedy_generate(
    model: TinyLlamaForCausalLM,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    *,
    on_step: Callable[[int], None] | None = None,
) -> torch.Tensor:
    """Greedy decoding without a KV cache; ``on_step(i)`` runs before decode step ``i``."""
    ids = input_ids
    for i in range(max_new_tokens):
        if on_step is not None:
            on_step(i)
        logits = model(ids)
        ids = torch.cat((ids, logits[:, -1:].argmax(-1)), dim=-1)
    return ids
