"""Tiny Hugging Face transformers decoders for the localization matrix (issue #10).

Every model is built from a small config with random initialisation under a fixed seed (no
download), in eager attention, in float32 unless asked otherwise: hidden 64, 2 layers, 4 heads
and 2 key/value heads of dimension 16, vocabulary 128; the MoE models have 4 experts, 2 per
token. One forward of the 2 x 8 batch below takes a few milliseconds, one capture well under a
second.

``INPUTS`` is a batch of two rows: row 0 is 8 real tokens, row 1 is left-padded (3 pad tokens,
then 5 real ones) with an ``attention_mask`` and the ``position_ids`` that ``generate`` derives
from it, so that a bug in the padding mask changes what the model computes.

Used by ``tests/hf_bugs.py`` and ``tests/test_localize_hf.py``. ``wandering_llama`` is the
one tiny model of the output, diagnosis and docs tests: a wider vocabulary and init, so that
greedy generation wanders.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

SEED = 1234
VOCAB = 128
HIDDEN = 64
LAYERS = 2
HEADS = 4
KV_HEADS = 2
HEAD_DIM = 16
INTERMEDIATE = 128
#: larger than HF's 0.02: with hidden 64, weights of std 0.1 keep activations near unit scale, so
#: attention is not uniform and a mask, RoPE or scale bug changes what the model computes
INIT_STD = 0.1
BATCH, SEQ, PAD = 2, 8, 3


def _common() -> dict[str, object]:
    return {
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "max_position_embeddings": 64,
        "initializer_range": INIT_STD,
        "tie_word_embeddings": False,
        "attention_dropout": 0.0,
        "use_cache": False,
        "pad_token_id": 0,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }


def _moe() -> dict[str, object]:
    return {"num_experts_per_tok": 2, "router_aux_loss_coef": 0.0, "output_router_logits": False}


def _llama() -> object:
    from transformers import LlamaConfig

    return LlamaConfig(**_common())


def _qwen2() -> object:
    from transformers import Qwen2Config

    return Qwen2Config(**_common())  # q/k/v projections with a bias


def _qwen3() -> object:
    from transformers import Qwen3Config

    return Qwen3Config(**_common())  # q_norm / k_norm on each head


def _mistral() -> object:
    from transformers import MistralConfig

    return MistralConfig(**_common(), sliding_window=None)


def _gpt2() -> object:
    from transformers import GPT2Config

    return GPT2Config(
        vocab_size=VOCAB,
        n_embd=HIDDEN,
        n_layer=LAYERS,
        n_head=HEADS,
        n_inner=INTERMEDIATE,
        n_positions=64,
        initializer_range=INIT_STD,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        use_cache=False,
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )


def _phi3() -> object:
    from transformers import Phi3Config

    common = _common()
    common.pop("head_dim")  # Phi-3 derives it: 64 / 4 = 16
    return Phi3Config(**common, resid_pdrop=0.0, embd_pdrop=0.0, sliding_window=None)


def _gemma() -> object:
    from transformers import GemmaConfig

    return GemmaConfig(**_common(), hidden_activation="gelu_pytorch_tanh")


def _gemma2() -> object:
    from transformers import Gemma2Config

    # layer 0 slides over 4 tokens, layer 1 is global; logits soft-capped, as in Gemma 2
    return Gemma2Config(
        **_common(),
        hidden_activation="gelu_pytorch_tanh",
        query_pre_attn_scalar=HEAD_DIM,
        sliding_window=4,
        attn_logit_softcapping=50.0,
        final_logit_softcapping=30.0,
    )


def _mixtral() -> object:
    from transformers import MixtralConfig

    return MixtralConfig(**_common(), **_moe(), num_local_experts=4, sliding_window=None)


def _qwen2_moe() -> object:
    from transformers import Qwen2MoeConfig

    return Qwen2MoeConfig(
        **_common(),
        **_moe(),
        num_experts=4,
        moe_intermediate_size=64,
        shared_expert_intermediate_size=128,
        decoder_sparse_step=1,
        mlp_only_layers=[],
    )


def _qwen3_moe() -> object:
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
        **_common(),
        **_moe(),
        num_experts=4,
        moe_intermediate_size=64,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        norm_topk_prob=True,
    )


@dataclass(frozen=True)
class Arch:
    """One architecture of the zoo and where its parts live (module paths from the root)."""

    name: str
    config: Callable[[], object]
    #: the decoder layers' container: ``model.layers`` (``transformer.h`` for GPT-2)
    layers: str = "model.layers"
    #: the shared rotary embedding (``None``: learned absolute positions)
    rotary: str | None = "model.rotary_emb"
    #: the attention, the input norm and the attention's output projection, inside a layer
    attn: str = "self_attn"
    norm: str = "input_layernorm"
    out_proj: str = "self_attn.o_proj"
    #: the MLP's down projection inside a layer (a 3D expert parameter in the MoE blocks)
    down: str = "mlp.down_proj"
    moe: bool = False
    #: q and k come out of one fused projection (``qkv_proj``) instead of q_proj / k_proj
    fused_qkv: bool = False

    def layer(self, i: int) -> str:
        return f"{self.layers}.{i}"


ARCHS: dict[str, Arch] = {
    a.name: a
    for a in (
        Arch("llama", _llama),
        Arch("qwen2", _qwen2),
        Arch("qwen3", _qwen3),
        Arch("mistral", _mistral),
        Arch(
            "gpt2",
            _gpt2,
            layers="transformer.h",
            rotary=None,
            attn="attn",
            norm="ln_1",
            out_proj="attn.c_proj",
            down="mlp.c_proj",
        ),
        Arch("phi3", _phi3, down="mlp.down_proj", fused_qkv=True),
        Arch("gemma", _gemma),
        Arch("gemma2", _gemma2),
        Arch("mixtral", _mixtral, down="mlp.experts", moe=True),
        Arch("qwen2_moe", _qwen2_moe, down="mlp.experts", moe=True),
        Arch("qwen3_moe", _qwen3_moe, down="mlp.experts", moe=True),
    )
}


def build(arch: str, dtype: torch.dtype = torch.float32, layers: int = LAYERS) -> torch.nn.Module:
    """The tiny model of ``arch``: seeded random weights, eager attention, eval mode
    (``layers`` decoder layers; the msprobe fixtures use one, to stay small)."""
    from transformers import AutoModelForCausalLM

    config = ARCHS[arch].config()
    if layers != LAYERS:
        name = "n_layer" if arch == "gpt2" else "num_hidden_layers"
        setattr(config, name, layers)
        if hasattr(config, "layer_types") and config.layer_types is not None:
            config.layer_types = config.layer_types[:layers]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    model = model.to(dtype).eval()
    model.requires_grad_(False)
    return model


def inputs() -> dict[str, torch.Tensor]:
    """``input_ids``, ``attention_mask`` and ``position_ids`` of the 2 x 8 batch; row 1 is
    left-padded with 3 pad tokens (positions start at 0 on its first real token, as in
    ``generate``)."""
    generator = torch.Generator().manual_seed(SEED)
    ids = torch.randint(3, VOCAB, (BATCH, SEQ), generator=generator)
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    ids[1, :PAD] = 0
    mask[1, :PAD] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": ids, "attention_mask": mask, "position_ids": positions}


def forward(model: torch.nn.Module) -> torch.Tensor:
    """One forward of ``INPUTS``; the logits."""
    with torch.no_grad():
        return model(**inputs(), use_cache=False).logits


def submodule(model: torch.nn.Module, path: str) -> torch.nn.Module:
    return model.get_submodule(path)


def wandering_llama(seed: int = 0) -> torch.nn.Module:
    """A 2-layer Llama with a 256-token vocabulary, random init under ``seed``, eval mode. The
    init range (std 0.5) is wide so greedy generation wanders instead of looping, as a trained
    model's would: the output-level checks need text, not one repeated token."""
    import transformers

    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=128,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        initializer_range=0.5,
    )
    return transformers.LlamaForCausalLM(config).eval()
