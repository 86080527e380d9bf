"""Greedy generation on the model's own cached path: HF ``generate``, and a replay of it.

A model serves tokens by a prefill and then one forward per token that reads a KV cache. Bugs
that live only there (a decode token's position, keys stored at another precision, a layer's
cache slot not written) change nothing in a full forward of the prefix, so the tokens worth
diagnosing are the ones ``generate`` makes. This module drives ``model.generate`` itself (greedy,
``use_cache=True``) rather than a loop of its own: whatever the installed transformers does
between steps (the cache class, position ids, the mask) is what is measured. Two deviations from
a plain ``generate`` call, both so that the two sides always have the same number of steps: no
end-of-sequence id stops a row, and a run can be made to *follow* given tokens (a logits
processor that leaves only that token; the logits reported are the model's own, from before any
processor), which replays a generation exactly, on another copy of the model too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch

from .._errors import PrecisionInputError


def supports_cache(model: Any) -> bool:
    """Whether ``model`` generates with HF's ``generate`` (a decoder-only model with a cache):
    other modules only have the full-forward path."""
    if not isinstance(model, torch.nn.Module):
        return False
    config = getattr(model, "config", None)
    if config is None or not callable(getattr(model, "generate", None)):
        return False
    if getattr(config, "is_encoder_decoder", False):
        return False
    can = getattr(model, "can_generate", None)
    return bool(can()) if callable(can) else True


def _pad_id(model: torch.nn.Module) -> int:
    for holder in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        pad = getattr(holder, "pad_token_id", None)
        if isinstance(pad, int):
            return pad
    return 0


class _Follow:
    """A logits processor that leaves only the given token of each step (``-inf`` elsewhere),
    so greedy decoding takes exactly ``tokens`` (``(batch, steps)``)."""

    def __init__(self, tokens: torch.Tensor, prompt_length: int) -> None:
        self.tokens = tokens
        self.prompt_length = prompt_length

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        step = input_ids.shape[1] - self.prompt_length
        if step >= self.tokens.shape[1]:
            return scores
        forced = self.tokens[:, step].to(scores.device)[:, None]
        only = torch.full_like(scores, float("-inf"))
        return only.scatter(1, forced, 0.0)


def cached_generate(
    model: torch.nn.Module,
    prompt: torch.Tensor,
    mask: torch.Tensor | None,
    steps: int,
    *,
    follow: torch.Tensor | None = None,
    on_forward: Callable[[int], object] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``steps`` greedy tokens per row by ``model.generate`` with its KV cache, and each step's
    raw logits: ``(batch, steps)`` long and ``(batch, steps, vocab)`` float, on the CPU.

    ``follow``: tokens to take instead of the argmax (the first ``steps`` columns are used).
    ``on_forward(k)`` runs before the ``k``-th top-level forward (0 is the prefill): a capture
    steps there.
    """
    from transformers import LogitsProcessorList

    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    kwargs: dict[str, Any] = {}
    if mask is not None:
        kwargs["attention_mask"] = mask.to(device)
    processors = LogitsProcessorList()
    if follow is not None:
        processors.append(_Follow(follow[:, :steps].cpu(), prompt.shape[1]))
    handle = None
    if on_forward is not None:
        count = iter(range(1 << 62))

        def step_hook(module: torch.nn.Module, args: Any, hook_kwargs: Any) -> None:
            on_forward(next(count))

        # first of the root's pre-hooks: the capture's own must already see the new step
        handle = model.register_forward_pre_hook(step_hook, with_kwargs=True, prepend=True)
    try:
        generate = cast("Callable[..., Any]", model.generate)
        out = generate(
            prompt.to(device),
            **kwargs,
            do_sample=False,
            num_beams=1,
            max_new_tokens=steps,
            use_cache=True,
            eos_token_id=[],  # no end-of-sequence stop: both sides make ``steps`` tokens
            pad_token_id=_pad_id(model),
            logits_processor=processors,
            output_logits=True,
            return_dict_in_generate=True,
        )
    finally:
        if handle is not None:
            handle.remove()
    logits = getattr(out, "logits", None)
    sequences = getattr(out, "sequences", None)
    if not isinstance(sequences, torch.Tensor) or logits is None or len(logits) != steps:
        raise PrecisionInputError(
            f"{type(model).__name__}.generate did not return {steps} steps of logits; "
            "diagnose it with cache=False"
        )
    tokens = sequences[:, prompt.shape[1] :].cpu()
    return tokens, torch.stack([step.detach().cpu() for step in logits], 1)
