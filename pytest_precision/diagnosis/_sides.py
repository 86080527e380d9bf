"""The two sides of a diagnosis (a live model or a saved run), and the path they generate on."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from .._errors import PrecisionInputError
from ..output._weights import fingerprint_weights
from ._generation import (
    Generation,
    SavedRun,
    capture_step,
    config_of,
    generate,
    is_saved_run,
    path_for,
)
from ._noise import model_dtype


class Side:
    """One side of the diagnosis: a live model, or a run saved on another machine."""

    def __init__(self, label: str, value: Any) -> None:
        self.label = label
        self.model: torch.nn.Module | None = None
        self.saved: SavedRun | None = None
        if isinstance(value, torch.nn.Module):
            self.model = value.eval()
        elif is_saved_run(value) or isinstance(value, SavedRun):
            self.saved = value if isinstance(value, SavedRun) else SavedRun(value)
        else:
            raise PrecisionInputError(
                f"{label} must be a torch.nn.Module or a folder written by save_run(), got "
                f"{value!r}"
            )

    def generation(
        self, prompt: torch.Tensor, mask: torch.Tensor | None, n: int, cache: bool
    ) -> Generation:
        if self.model is not None:
            return generate(self.model, prompt, mask, n, cache=cache)
        assert self.saved is not None
        g = self.saved.generation
        same_mask = (g.attention_mask is None) == (mask is None) and (
            mask is None or torch.equal(g.attention_mask, mask)  # type: ignore[arg-type]
        )
        if not torch.equal(g.prompt, prompt) or not same_mask:
            raise PrecisionInputError(
                f"{self.saved.path}: the saved run was generated from other input_ids or "
                "another attention_mask; diagnose the same prompt"
            )
        if g.tokens.shape[1] < n:
            raise PrecisionInputError(
                f"{self.saved.path}: the saved run has {g.tokens.shape[1]} tokens per row, "
                f"max_new_tokens asks for {n}"
            )
        return g.head(n)

    @property
    def config(self) -> dict[str, Any] | None:
        return config_of(self.model) if self.model is not None else self.saved.config  # type: ignore[union-attr]

    @property
    def dtype(self) -> torch.dtype:
        return model_dtype(self.model, self.config)

    def fingerprint(self, skip: frozenset[str] = frozenset()) -> dict[str, Any]:
        """The weights' fingerprint, without the parameters named in ``skip`` (live models)."""
        if self.model is None:
            return self.saved.fingerprint  # type: ignore[union-attr]
        named = dict(self.model.named_parameters())
        return fingerprint_weights({n: p for n, p in named.items() if n not in skip})

    def dump(
        self,
        generation: Generation,
        step: int,
        path: Path,
        mode: str,
        include: Iterable[str] | None = None,
        exclude: Iterable[str] = (),
    ) -> Path:
        """A live model's capture of ``step`` (``capture_step``); a saved run's dump of it."""
        if self.model is not None:
            return capture_step(
                self.model, generation, step, path, mode=mode, include=include, exclude=exclude
            )
        assert self.saved is not None
        return self.saved.step_dump(step)


def fingerprints(g: Side, t: Side) -> tuple[dict[str, Any], dict[str, Any]]:
    """Both sides' weight fingerprints, for the checklist. Between two live models a parameter
    bitwise equal on both sides (the usual case: a bug touches few weights) has the same
    fingerprint on both, so it is left out of both: one comparing read of each instead of six
    float64 passes over it on each side."""
    if g.model is None or t.model is None:
        return g.fingerprint(), t.fingerprint()
    t_params = dict(t.model.named_parameters())
    same = frozenset(
        name for name, p in g.model.named_parameters() if _identical(p, t_params.get(name))
    )
    return g.fingerprint(same), t.fingerprint(same)


def _identical(a: torch.Tensor, b: torch.Tensor | None) -> bool:
    return (
        b is not None
        and a.shape == b.shape
        and a.dtype == b.dtype
        and a.device == b.device
        and a.device.type != "meta"
        and torch.equal(a.detach(), b.detach())
    )


def generation_path(g: Side, t: Side, cache: bool | None) -> bool:
    """The generation path both sides take: a saved run's own, else :func:`path_for`."""
    saved = {s.saved.path: s.saved.generation.cached for s in (g, t) if s.saved is not None}
    paths = set(saved.values())
    if len(paths) > 1:
        raise PrecisionInputError(
            "one saved run was generated with the KV cache and the other without; save both "
            "with the same cache= setting"
        )
    if paths:
        (made,) = paths
        if cache is not None and cache != made:
            where = ", ".join(str(p) for p in saved)
            raise PrecisionInputError(
                f"{where}: saved with cache={made}, diagnose asked for cache={cache}; the two "
                "sides must generate on the same path"
            )
        if made:  # a live side must be able to follow
            path_for([s.model for s in (g, t) if s.model is not None], True)
        return made
    return path_for([s.model for s in (g, t) if s.model is not None], cache)


def path_line(cached: bool, n: int) -> str:
    if cached:
        return (
            f"{n} greedy tokens per row on the cached path (model.generate: a prefill, then "
            "one decode forward per token reading the KV cache)"
        )
    return (
        f"{n} greedy tokens per row by full forwards (one forward of the prefix per step, no "
        "KV cache: a bug only in the cached path is not seen)"
    )
