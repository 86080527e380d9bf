"""Bug classes ``tests/hf_bugs.py`` does not plant, for the zoo of ``tests/hf_zoo_more.py``, and
the bit-exact truth of where each one lives.

A plant patches ONE module instance of a freshly built model (an attribute, a weight, a buffer,
or its ``forward``; two plants swap a function of the modeling file or of ``torch`` only while
that one instance's forward runs) and returns the module it patched. Layer-local bugs live in
decoder layer 1; the embedding, the logit scale and the head are planted where they live.

Where a bug is is measured, not assumed (``truth``): forward hooks on every module of a clean
and of a buggy model, same inputs; the innermost module whose inputs are bit-identical and whose
output is not. A bug that leaves every module's output bit-identical does not change what that
architecture computes: ``Bug.skip`` leaves it out, with the reason, and a test checks that every
kept case has a truth.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from hf_bugs import wrap_forward
from hf_zoo import HEAD_DIM, INIT_STD
from hf_zoo_more import ARCHS, Arch, build, model_inputs

#: the layer every layer-local bug is planted in (layer 0 stays clean)
LAYER = 1
#: the wrong epsilon of a norm (the models use 1e-5 or 1e-6)
WRONG_EPS = 0.1


def _part(model: torch.nn.Module, arch: Arch, sub: str | None) -> tuple[torch.nn.Module, str]:
    assert sub is not None
    path = f"{arch.layer(LAYER)}.{sub}"
    return model.get_submodule(path), path


@contextlib.contextmanager
def _swapped(owner: Any, name: str, value: Any) -> Iterator[None]:
    before = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, before)


def _while_running(module: torch.nn.Module, owner: Any, name: str, value: Any) -> None:
    """``owner.name`` is ``value`` while this instance's forward runs (a function of the
    modeling file or of torch, seen by this module alone)."""

    def make(forward: Callable[..., Any]) -> Callable[..., Any]:
        def patched(*args: Any, **kwargs: Any) -> Any:
            with _swapped(owner, name, value):
                return forward(*args, **kwargs)

        return patched

    wrap_forward(module, make)


# -- bugs ------------------------------------------------------------------------------------------


def norm_eps(model: torch.nn.Module, arch: Arch) -> str:
    """Layer 1's input norm adds 0.1 instead of its config's epsilon (a value not loaded)."""
    norm, path = _part(model, arch, arch.norm)
    name = next(n for n in ("variance_epsilon", "eps", "epsilon") if hasattr(norm, n))
    setattr(norm, name, WRONG_EPS)
    return path


def _other_activation(act: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """The activation a converted checkpoint gets wrong: tanh-GELU for exact GELU and the
    reverse, GELU for SiLU, ReLU for squared ReLU."""
    kind = type(act).__name__
    approximate = getattr(act, "approximate", None)
    if "Tanh" in kind or kind in ("NewGELUActivation", "BloomGelu") or approximate == "tanh":
        return lambda x: torch.nn.functional.gelu(x)
    if "GELU" in kind:
        return lambda x: torch.nn.functional.gelu(x, approximate="tanh")
    if "SiLU" in kind:
        return lambda x: torch.nn.functional.gelu(x)
    if "ReLUSquared" in kind:
        return torch.relu
    raise AssertionError(f"no wrong activation for {kind}")


def wrong_activation(model: torch.nn.Module, arch: Arch) -> str:
    act, path = _part(model, arch, arch.act)
    act.forward = _other_activation(act)  # type: ignore[method-assign]
    return path


def _tiled_kv(hidden: torch.Tensor, n_rep: int) -> torch.Tensor:
    """Key/value heads tiled (0, 1, 0, 1) instead of repeated (0, 0, 1, 1): query head h reads
    key/value head h % kv_heads instead of h // n_rep."""
    return hidden.repeat(1, n_rep, 1, 1)


def gqa_head_mapping(model: torch.nn.Module, arch: Arch) -> str:
    attn, path = _part(model, arch, arch.attn)
    _while_running(attn, sys.modules[type(attn).__module__], "repeat_kv", _tiled_kv)
    return path


#: torch's softmax, called by the bf16 one while it stands in for it
_SOFTMAX = torch.nn.functional.softmax


def _bf16_softmax(
    x: torch.Tensor, dim: int | None = None, _stacklevel: int = 3, dtype: Any = None
) -> torch.Tensor:
    out = _SOFTMAX(x.to(torch.bfloat16), dim=dim)
    return out.to(dtype or x.dtype)


def softmax_in_bf16(model: torch.nn.Module, arch: Arch) -> str:
    """Layer 1's attention probabilities computed in bf16 inside the fp32 model."""
    attn, path = _part(model, arch, arch.attn)
    _while_running(attn, torch.nn.functional, "softmax", _bf16_softmax)
    return path


def residual_in_bf16(model: torch.nn.Module, arch: Arch) -> str:
    """Layer 1 hands the residual stream on rounded to bf16 (a low-precision residual buffer)."""
    layer = model.get_submodule(arch.layer(LAYER))

    def make(forward: Callable[..., Any]) -> Callable[..., Any]:
        def patched(*args: Any, **kwargs: Any) -> Any:
            out = forward(*args, **kwargs)
            first = out[0] if isinstance(out, tuple) else out
            rounded = first.to(torch.bfloat16).to(first.dtype)
            return (rounded, *out[1:]) if isinstance(out, tuple) else rounded

        return patched

    wrap_forward(layer, make)
    return arch.layer(LAYER)


def embedding_scale(model: torch.nn.Module, arch: Arch) -> str:
    """The embedding's scale not applied: Gemma's sqrt(hidden) buffer, Granite's multiplier."""
    if arch.name == "gemma3":
        with torch.no_grad():
            model.get_submodule(arch.embed).embed_scale.fill_(1.0)
        return arch.embed
    owner = arch.embed.rsplit(".", 1)[0]
    model.get_submodule(owner).embedding_multiplier = 1.0
    return owner


def logit_scale(model: torch.nn.Module, arch: Arch) -> str:
    """The final logit scale not applied (Cohere multiplies, Granite divides)."""
    if arch.name == "cohere":
        model.logit_scale = 1.0
    else:
        model.config.logits_scaling = 1.0
    return ""


def lm_head_tied(model: torch.nn.Module, arch: Arch) -> str:
    """The untied head loaded as the input embedding (tied by mistake)."""
    head = model.get_output_embeddings()
    head.weight = model.get_input_embeddings().weight
    return "lm_head"


def lm_head_stale(model: torch.nn.Module, arch: Arch) -> str:
    """The head's weight from an earlier checkpoint: every entry off by a few percent."""
    weight = model.get_output_embeddings().weight
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        weight.add_(torch.randn(weight.shape, generator=generator) * INIT_STD * 0.05)
    return "lm_head"


def _cos_sin(
    position_ids: torch.Tensor, dim: int, base: float, like: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    freqs = position_ids[..., None].float() * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(like.dtype), emb.sin().to(like.dtype)


def rotary_fraction(model: torch.nn.Module, arch: Arch) -> str:
    """Layer 1's attention rotates the whole head instead of its fraction (GPT-J: half of its
    rotary dimensions), computing its own cos / sin."""
    attn, path = _part(model, arch, arch.attn)
    if arch.name == "gptj":
        rotary_dim = attn.rotary_dim
        attn.rotary_dim = rotary_dim // 2

        def make(forward: Callable[..., Any]) -> Callable[..., Any]:
            def patched(*args: Any, **kwargs: Any) -> Any:
                sin, cos = kwargs["position_embeddings"]
                quarter = rotary_dim // 4
                kwargs["position_embeddings"] = (sin[..., :quarter], cos[..., :quarter])
                return forward(*args, **kwargs)

            return patched

        wrap_forward(attn, make)
        return path
    base = float(model.config.rope_parameters["rope_theta"])
    if hasattr(attn, "rotary_ndims"):
        attn.rotary_ndims = HEAD_DIM

    def make_full(forward: Callable[..., Any]) -> Callable[..., Any]:
        def patched(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            cos, _ = kwargs["position_embeddings"]
            positions = kwargs.get("position_ids")
            if positions is None:
                positions = torch.arange(hidden_states.shape[1])[None]
            kwargs["position_embeddings"] = _cos_sin(positions, HEAD_DIM, base, cos)
            return forward(hidden_states, *args, **kwargs)

        return patched

    wrap_forward(attn, make_full)
    return path


def alibi_slopes(model: torch.nn.Module, arch: Arch) -> str:
    """Layer 1's attention gets the ALiBi slopes in reverse head order (head 0 gets the
    gentlest slope)."""
    attn, path = _part(model, arch, arch.attn)
    keyword, heads = arch.alibi, model.config.num_attention_heads
    assert keyword is not None

    def make(forward: Callable[..., Any]) -> Callable[..., Any]:
        def patched(*args: Any, **kwargs: Any) -> Any:
            bias = kwargs[keyword]
            per_head = bias.reshape(-1, heads, *bias.shape[1:])
            kwargs[keyword] = per_head.flip(1).reshape(bias.shape)
            return forward(*args, **kwargs)

        return patched

    wrap_forward(attn, make)
    return path


def _routed(
    model: torch.nn.Module,
    arch: Arch,
    change: Callable[[torch.Tensor, torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]],
) -> str:
    router, path = _part(model, arch, arch.router)
    experts = router.weight.shape[0]

    def make(forward: Callable[..., Any]) -> Callable[..., Any]:
        def patched(*args: Any, **kwargs: Any) -> Any:
            logits, weights, index = forward(*args, **kwargs)
            return (logits, *change(weights, index, experts))

        return patched

    wrap_forward(router, make)
    return path


def router_renormalised(model: torch.nn.Module, arch: Arch) -> str:
    """Layer 1's router renormalises its top-k weights to sum to one, where the model does
    not (OLMoE's ``norm_topk_prob`` flipped; a wrapper elsewhere)."""
    if arch.name == "olmoe":
        router, path = _part(model, arch, arch.router)
        router.norm_topk_prob = True
        return path
    return _routed(model, arch, lambda w, i, e: (w / w.sum(dim=-1, keepdim=True), i))


def wrong_expert(model: torch.nn.Module, arch: Arch) -> str:
    """Layer 1's router sends each token to the expert after the one it chose (an index off
    by one), with the chosen weights."""
    return _routed(model, arch, lambda w, i, e: (w, (i + 1) % e))


def ssm_decay_not_loaded(model: torch.nn.Module, arch: Arch) -> str:
    """Layer 1's Mamba mixer keeps a fresh ``A_log`` (its state decay; the checkpoint key was
    missed): a parameter of the mixer read by the selective scan, no linear's weight."""
    mixer, path = _part(model, arch, arch.mixer)
    generator = torch.Generator().manual_seed(99)
    with torch.no_grad():
        mixer.A_log.copy_(torch.rand(mixer.A_log.shape, generator=generator).log())
    return path


@dataclass(frozen=True)
class Bug:
    name: str
    plant: Callable[[torch.nn.Module, Arch], str]
    #: why the bug does not apply to an architecture (``None``: it applies)
    skip: Callable[[Arch], str | None] = lambda arch: None


def _needs(part: str, reason: str) -> Callable[[Arch], str | None]:
    return lambda arch: None if getattr(arch, part) else reason


def _renorm_skip(arch: Arch) -> str | None:
    if arch.router is None:
        return "no MoE router"
    if arch.name == "granitemoe":
        return "softmax over the top-k logits: the weights already sum to one"
    return None


BUGS: dict[str, Bug] = {
    b.name: b
    for b in (
        Bug("norm_eps", norm_eps),
        Bug(
            "activation", wrong_activation, _needs("act", "no activation module that layer 1 calls")
        ),
        Bug("gqa_mapping", gqa_head_mapping, _needs("grouped", "one key/value head per head")),
        Bug("softmax_bf16", softmax_in_bf16, _needs("attn", "no attention in layer 1")),
        Bug("residual_bf16", residual_in_bf16),
        Bug(
            "embedding_scale",
            embedding_scale,
            lambda a: None if a.name in ("gemma3", "granite") else "no embedding scale",
        ),
        Bug(
            "logit_scale",
            logit_scale,
            lambda a: None if a.name in ("cohere", "granite") else "no logit scale",
        ),
        Bug("lm_head_tied", lm_head_tied),
        Bug("lm_head_stale", lm_head_stale),
        Bug("rotary_fraction", rotary_fraction, _needs("partial_rotary", "no partial rotary")),
        Bug("alibi_slopes", alibi_slopes, _needs("alibi", "no ALiBi")),
        Bug("router_renorm", router_renormalised, _renorm_skip),
        Bug("wrong_expert", wrong_expert, _needs("router", "no MoE router")),
        Bug("ssm_decay", ssm_decay_not_loaded, _needs("mixer", "no Mamba mixer")),
    )
}


def applicable(arch: Arch) -> list[str]:
    return [name for name, bug in BUGS.items() if bug.skip(arch) is None]


# -- truth -----------------------------------------------------------------------------------------


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return []


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(
        x.shape == y.shape and x.dtype == y.dtype and torch.equal(x, y)
        for x, y in zip(a, b, strict=True)
    )


def _calls(model: torch.nn.Module, arch: str) -> list[tuple[str, list[torch.Tensor], Any]]:
    """Every module call of one forward: (path, its inputs, its outputs), in call order."""
    calls: list[tuple[str, list[torch.Tensor], Any]] = []
    handles = []
    for path, module in model.named_modules():

        def pre(m: Any, args: Any, kwargs: Any, path: str = path) -> None:
            calls.append((path, [t.clone() for t in _tensors((args, kwargs))], None))

        def post(m: Any, args: Any, kwargs: Any, out: Any, path: str = path) -> None:
            index = max(i for i, c in enumerate(calls) if c[0] == path and c[2] is None)
            calls[index] = (path, calls[index][1], [t.clone() for t in _tensors(out)])

        handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(module.register_forward_hook(post, with_kwargs=True))
    try:
        with torch.no_grad():
            model(**model_inputs(arch), use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return calls


def truth(arch: str, plant: Callable[[torch.nn.Module, Arch], str]) -> str | None:
    """The innermost module whose inputs are bit-identical in the clean and the buggy model
    and whose output is not (``None``: the bug changes nothing)."""
    clean = _calls(build(arch), arch)
    buggy_model = build(arch)
    plant(buggy_model, ARCHS[arch])
    buggy = _calls(buggy_model, arch)
    assert [c[0] for c in clean] == [c[0] for c in buggy], "the bug changed which modules run"
    guilty = [
        g[0]
        for g, b in zip(clean, buggy, strict=True)
        if _same(g[1], b[1]) and not _same(g[2], b[2])
    ]
    innermost = [p for p in guilty if not any(q != p and _inside(q, p) for q in guilty)]
    return innermost[0] if innermost else None


def _inside(module: str, outer: str) -> bool:
    return outer == "" or module == outer or module.startswith(outer + ".")


def inside(module: str | None, outer: str) -> bool:
    """``module`` is ``outer`` or inside it (the root, ``""``, holds every module)."""
    return module is not None and _inside(module, outer)


# -- noise -------------------------------------------------------------------------------------

#: noise case -> (target dtype, threads of the target); the golden is fp32 on one thread; "self"
#: builds and captures the golden a second time
NOISE: dict[str, tuple[torch.dtype, int]] = {
    "self": (torch.float32, 1),
    "threads": (torch.float32, 2),
    "bf16_vs_fp32": (torch.bfloat16, 1),
    "fp16_vs_fp32": (torch.float16, 1),
}
