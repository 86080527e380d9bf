"""A second zoo of tiny Hugging Face decoders: families ``tests/hf_zoo.py`` does not have, so
that the judge is tested on architectures nobody tuned it to.

Same recipe as ``hf_zoo``: a small config (hidden 64, 2 layers, 4 heads of dimension 16,
vocabulary 128), random weights of std 0.1 under a fixed seed, eager attention, fp32, eval mode,
and the same 2 x 8 batch (row 1 left-padded, with its ``attention_mask``). What each one adds:

- parallel attention + MLP: GPT-J (interleaved partial rotary), GPT-NeoX (``rotary_pct``),
  Falcon (grouped keys), Phi (partial rotary, one norm), Cohere (LayerNorm without bias, a logit
  scale);
- ALiBi instead of positions: Bloom (with an embedding LayerNorm), MPT (no position ids);
- partial rotary in a sequential block: StableLM, GLM (interleaved halves), Nemotron (ReLU^2, a
  ``1 + weight`` LayerNorm);
- scales around the stack: Granite (embedding, residual, attention and logit multipliers);
- post-norms with q/k norms: OLMo-2; GELU-tanh with biases: StarCoder2;
- sliding window: Gemma 3 (layer 0 slides over 4 tokens, a scaled embedding);
- latent attention with routed + shared experts and no top-k renormalisation: DeepSeek-V2;
- MoE without renormalisation: OLMoE; MoE with a softmax over the top-k logits: Granite-MoE;
- a Mamba hybrid: Jamba (layer 0 attention, layer 1 Mamba with a MoE, CPU slow path).

Grouped-query attention (2 key/value heads) wherever the config allows it; GPT-J, GPT-NeoX,
Bloom, MPT, Phi and DeepSeek-V2 have one key/value head per query head.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from hf_zoo import INIT_STD, SEED, VOCAB, _common, inputs

#: the settings every family spells the same way in its own names
_IDS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
_OFF = {"use_cache": False, "tie_word_embeddings": False, "initializer_range": INIT_STD}


def _no_head_dim(kv_heads: int | None = None) -> dict[str, object]:
    common = _common()
    common.pop("head_dim")  # derived: 64 / 4 = 16
    if kv_heads is not None:
        common["num_key_value_heads"] = kv_heads
    return common


def _gptj() -> object:
    from transformers import GPTJConfig

    return GPTJConfig(
        vocab_size=VOCAB,
        n_embd=64,
        n_layer=2,
        n_head=4,
        rotary_dim=8,
        n_inner=128,
        n_positions=64,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        **_OFF,
        **_IDS,
    )


def _gpt_neox() -> object:
    from transformers import GPTNeoXConfig

    return GPTNeoXConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        rotary_pct=0.25,
        max_position_embeddings=64,
        use_parallel_residual=True,
        attention_dropout=0.0,
        hidden_dropout=0.0,
        **_OFF,
        **_IDS,
    )


def _falcon() -> object:
    from transformers import FalconConfig

    return FalconConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_kv_heads=2,
        new_decoder_architecture=True,
        parallel_attn=True,
        bias=False,
        alibi=False,
        max_position_embeddings=64,
        attention_dropout=0.0,
        hidden_dropout=0.0,
        **_OFF,
        **_IDS,
    )


def _bloom() -> object:
    from transformers import BloomConfig

    return BloomConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        n_layer=2,
        n_head=4,
        attention_dropout=0.0,
        hidden_dropout=0.0,
        **_OFF,
        **_IDS,
    )


def _mpt() -> object:
    from transformers import MptConfig

    return MptConfig(
        vocab_size=VOCAB,
        d_model=64,
        n_layers=2,
        n_heads=4,
        expansion_ratio=2,
        max_seq_len=64,
        **_OFF,
        **_IDS,
    )


def _phi() -> object:
    from transformers import PhiConfig

    return PhiConfig(
        **_no_head_dim(kv_heads=4),
        partial_rotary_factor=0.5,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        hidden_act="gelu_new",
    )


def _stablelm() -> object:
    from transformers import StableLmConfig

    return StableLmConfig(**_no_head_dim(), partial_rotary_factor=0.25, hidden_dropout=0.0)


def _cohere() -> object:
    from transformers import CohereConfig

    return CohereConfig(**_common(), logit_scale=0.5)


def _olmo2() -> object:
    from transformers import Olmo2Config

    return Olmo2Config(**_common())


def _starcoder2() -> object:
    from transformers import Starcoder2Config

    return Starcoder2Config(
        **_common(), sliding_window=None, residual_dropout=0.0, embedding_dropout=0.0
    )


def _granite() -> object:
    from transformers import GraniteConfig

    return GraniteConfig(
        **_common(),
        embedding_multiplier=4.0,
        logits_scaling=2.0,
        residual_multiplier=0.5,
        attention_multiplier=0.2,
    )


def _glm() -> object:
    from transformers import GlmConfig

    return GlmConfig(**_common(), partial_rotary_factor=0.5)


def _nemotron() -> object:
    from transformers import NemotronConfig

    return NemotronConfig(**_no_head_dim(), partial_rotary_factor=0.5)


def _gemma3() -> object:
    from transformers import Gemma3TextConfig

    return Gemma3TextConfig(
        **_common(),
        hidden_activation="gelu_pytorch_tanh",
        query_pre_attn_scalar=16,
        sliding_window=4,
        layer_types=["sliding_attention", "full_attention"],
    )


def _deepseek_v2() -> object:
    from transformers import DeepseekV2Config

    return DeepseekV2Config(
        **_no_head_dim(kv_heads=4),
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_shared_experts=1,
        moe_intermediate_size=32,
        first_k_dense_replace=1,  # layer 0 dense, layer 1 MoE
        q_lora_rank=32,
        kv_lora_rank=32,
        qk_rope_head_dim=8,
        qk_nope_head_dim=16,
        v_head_dim=16,
        topk_method="greedy",
        n_group=1,
        topk_group=1,
    )


def _olmoe() -> object:
    from transformers import OlmoeConfig

    return OlmoeConfig(
        **_common(),
        num_experts=4,
        num_experts_per_tok=2,
        norm_topk_prob=False,
        router_aux_loss_coef=0.0,
        output_router_logits=False,
    )


def _granitemoe() -> object:
    from transformers import GraniteMoeConfig

    return GraniteMoeConfig(
        **_no_head_dim(),
        num_local_experts=4,
        num_experts_per_tok=2,
        router_aux_loss_coef=0.0,
        output_router_logits=False,
    )


def _jamba() -> object:
    from transformers import JambaConfig

    return JambaConfig(
        **_no_head_dim(),
        num_experts=4,
        num_experts_per_tok=2,
        expert_layer_period=2,
        expert_layer_offset=1,  # layer 1's feed-forward is the MoE
        attn_layer_period=2,
        attn_layer_offset=0,  # layer 0 attends, layer 1 is a Mamba mixer
        mamba_d_state=8,
        mamba_d_conv=4,
        mamba_expand=2,
        mamba_dt_rank=8,
        router_aux_loss_coef=0.0,
        output_router_logits=False,
    )


@dataclass(frozen=True)
class Arch:
    """One architecture and where its parts live (module paths from the root; inside a decoder
    layer for ``attn``, ``norm``, ``act`` and ``router``). ``None``: the model has no such part.
    """

    name: str
    config: Callable[[], object]
    layers: str = "model.layers"
    embed: str = "model.embed_tokens"
    rotary: str | None = "model.rotary_emb"
    attn: str | None = "self_attn"
    norm: str = "input_layernorm"
    #: the activation module the layer's forward calls
    act: str | None = "mlp.act_fn"
    #: the MoE router of layer 1
    router: str | None = None
    #: the Mamba mixer of layer 1
    mixer: str | None = None
    #: several query heads share a key/value head through the modeling file's ``repeat_kv``
    grouped: bool = True
    #: the forward takes ``position_ids`` (the ALiBi models derive positions from the mask)
    positions: bool = True
    #: rotary on a fraction of each head only
    partial_rotary: bool = False
    #: ALiBi biases passed to every layer's attention under this keyword
    alibi: str | None = None

    def layer(self, i: int) -> str:
        return f"{self.layers}.{i}"


ARCHS: dict[str, Arch] = {
    a.name: a
    for a in (
        Arch(
            "gptj",
            _gptj,
            layers="transformer.h",
            embed="transformer.wte",
            rotary="transformer.rotary_emb",
            attn="attn",
            norm="ln_1",
            act="mlp.act",
            grouped=False,
            partial_rotary=True,
        ),
        Arch(
            "gpt_neox",
            _gpt_neox,
            layers="gpt_neox.layers",
            embed="gpt_neox.embed_in",
            rotary="gpt_neox.rotary_emb",
            attn="attention",
            act="mlp.act",
            grouped=False,
            partial_rotary=True,
        ),
        Arch(
            "falcon",
            _falcon,
            layers="transformer.h",
            embed="transformer.word_embeddings",
            rotary="transformer.rotary_emb",
            attn="self_attention",
            norm="ln_attn",
            act="mlp.act",
        ),
        Arch(
            "bloom",
            _bloom,
            layers="transformer.h",
            embed="transformer.word_embeddings",
            rotary=None,
            attn="self_attention",
            act="mlp.gelu_impl",
            grouped=False,
            positions=False,
            alibi="alibi",
        ),
        Arch(
            "mpt",
            _mpt,
            layers="transformer.blocks",
            embed="transformer.wte",
            rotary=None,
            attn="attn",
            norm="norm_1",
            act="ffn.act",
            grouped=False,
            positions=False,
            alibi="position_bias",
        ),
        Arch("phi", _phi, act="mlp.activation_fn", grouped=False, partial_rotary=True),
        Arch("stablelm", _stablelm, partial_rotary=True),
        Arch("cohere", _cohere),
        Arch("olmo2", _olmo2, norm="post_attention_layernorm"),
        Arch("starcoder2", _starcoder2, act="mlp.act"),
        Arch("granite", _granite),
        Arch("glm", _glm, act="mlp.activation_fn", partial_rotary=True),
        Arch("nemotron", _nemotron, partial_rotary=True),
        Arch("gemma3", _gemma3),
        Arch("deepseek_v2", _deepseek_v2, act=None, router="mlp.gate", grouped=False),
        Arch("olmoe", _olmoe, act=None, router="mlp.gate"),
        Arch("granitemoe", _granitemoe, act=None, router="block_sparse_moe.router"),
        Arch(
            "jamba",
            _jamba,
            rotary=None,
            attn=None,
            act=None,  # the Mamba mixer passes the name "silu" to its conv kernel
            router="feed_forward.router",
            mixer="mamba",
            grouped=False,
        ),
    )
}


def build(
    arch: str, dtype: torch.dtype = torch.float32, attention: str = "eager"
) -> torch.nn.Module:
    """The tiny model of ``arch``: seeded random weights, eval mode, ``attention`` as HF's
    ``attn_implementation`` (eager unless asked)."""
    from transformers import AutoModelForCausalLM

    config = ARCHS[arch].config()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = AutoModelForCausalLM.from_config(config, attn_implementation=attention)
    model = model.to(dtype).eval()
    model.requires_grad_(False)
    return model


def model_inputs(arch: str, rows: slice = slice(None)) -> dict[str, torch.Tensor]:
    """``hf_zoo``'s 2 x 8 batch (or the ``rows`` of it) as ``arch``'s forward takes it: the
    ALiBi models derive positions from the mask and take no ``position_ids``."""
    batch = {name: tensor[rows] for name, tensor in inputs().items()}
    if not ARCHS[arch].positions:
        batch.pop("position_ids")
    return batch
