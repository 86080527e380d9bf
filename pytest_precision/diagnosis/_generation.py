"""Greedy generation on either side, and a run saved to a folder to diagnose on another machine.

Two paths. **Cached** (HF models, the default): ``model.generate`` itself, a prefill then one
decode forward per token reading the KV cache (``_decode.py``); the step that produced token
``s`` is captured by replaying the generation from the prefill inside the capture, so the dump
of step ``s`` holds that decode forward and the cache it read. **Full forward** (any module
returning logits, or ``cache=False``): every step is one forward of the prompt and the tokens so
far, which a brute-force scan reproduces and which can be rerun alone; it cannot see a bug that
lives only in the cache. A saved run holds the generation, which path made it, the config, the
weights' fingerprint, the environment and a tensor dump of each step's forward
(``dump/step<s>/``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .._atomic import atomic_write
from .._errors import PrecisionInputError
from ..dump._capture import capture
from ..output._weights import fingerprint_weights
from ..runtime._environment import precision_environment
from ._decode import cached_generate, supports_cache

#: The file that marks a folder as a saved run.
RUN_FILE = "run.json"
_LOGPROBS = "logprobs.safetensors"
_DUMP = "dump"
_SCHEMA = 1


@dataclass(frozen=True)
class Generation:
    """Greedy tokens per row (``(batch, steps)``) and their float64 log-softmax distributions
    (``(batch, steps, vocab)``), after ``prompt`` (``(batch, length)``); ``cached``: made on the
    model's cached path (``generate``), else by full forwards."""

    prompt: torch.Tensor
    attention_mask: torch.Tensor | None
    tokens: torch.Tensor
    logprobs: torch.Tensor
    cached: bool = False

    def head(self, steps: int) -> Generation:
        """The first ``steps`` tokens and their distributions."""
        return Generation(
            self.prompt,
            self.attention_mask,
            self.tokens[:, :steps],
            self.logprobs[:, :steps],
            self.cached,
        )

    def prefix(self, step: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The input of the forward that produces token ``step``: the prompt and the tokens
        before it (and the mask, extended with ones)."""
        ids = torch.cat([self.prompt, self.tokens[:, :step]], dim=1)
        return ids, _extend(self.attention_mask, step)


def _extend(mask: torch.Tensor | None, by: int) -> torch.Tensor | None:
    if mask is None:
        return None
    return torch.cat([mask, mask.new_ones(mask.shape[0], by)], dim=1)


def as_batch(input_ids: Any, attention_mask: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``input_ids`` (a sequence, a batch, a tensor) as a ``(batch, length)`` long tensor."""
    try:
        ids = torch.as_tensor(input_ids)
    except (TypeError, ValueError) as exc:
        raise PrecisionInputError(f"input_ids must be token ids, got {type(input_ids)}") from exc
    if ids.dim() == 1:
        ids = ids[None]
    if ids.dim() != 2 or ids.numel() == 0 or ids.dtype.is_floating_point or ids.is_complex():
        raise PrecisionInputError(
            f"input_ids must be a non-empty (batch, length) tensor of integer ids, got shape "
            f"{tuple(ids.shape)} and dtype {ids.dtype}"
        )
    ids = ids.long().cpu()
    if attention_mask is None:
        return ids, None
    mask = torch.as_tensor(attention_mask).long().cpu()
    if mask.dim() == 1:
        mask = mask[None]
    if mask.shape != ids.shape:
        raise PrecisionInputError(
            f"attention_mask has shape {tuple(mask.shape)}, input_ids {tuple(ids.shape)}"
        )
    return ids, mask


def device_of(model: torch.nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def forward_logits(
    model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """The ``(batch, length, vocab)`` logits of one full forward (HF models: no cache; with a
    mask, position ids that skip left padding, as ``generate`` computes them)."""
    device = device_of(model)
    kwargs: dict[str, Any] = {}
    hf = hasattr(model, "config") and hasattr(model, "generate")
    if mask is not None:
        kwargs["attention_mask"] = mask.to(device)
        if hf:
            kwargs["position_ids"] = (mask.cumsum(-1) - 1).clamp(min=0).to(device)
    if hf:
        kwargs["use_cache"] = False
    out = model(ids.to(device), **kwargs)
    logits = getattr(out, "logits", None)
    if logits is None:
        logits = out[0] if isinstance(out, (tuple, list)) else out
    if not isinstance(logits, torch.Tensor) or logits.dim() != 3 or logits.shape[:2] != ids.shape:
        raise PrecisionInputError(
            f"{type(model).__name__} must return (batch, length, vocab) logits (a tensor, a "
            "tuple starting with one, or an output with .logits) for (batch, length) input_ids"
        )
    return logits


def path_for(models: Iterable[torch.nn.Module], cache: bool | None) -> bool:
    """Whether to generate on the cached path: ``cache``, or by default when every model has
    HF ``generate``; asking for it on a model without one is refused."""
    models = list(models)
    if cache is None:
        return all(supports_cache(m) for m in models)
    if cache:
        for model in models:
            if not supports_cache(model):
                raise PrecisionInputError(
                    f"cache=True needs a decoder-only model with HF generate(); "
                    f"{type(model).__name__} has none (use cache=False)"
                )
    return bool(cache)


def _logprobs(logits: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits.double(), -1).cpu()


@torch.no_grad()
def generate(
    model: torch.nn.Module,
    prompt: torch.Tensor,
    mask: torch.Tensor | None,
    max_new_tokens: int,
    *,
    cache: bool = False,
) -> Generation:
    """``max_new_tokens`` greedy tokens per row (no stop at an end-of-sequence token, so both
    sides always have the same number of steps): by ``model.generate`` with its cache
    (``cache=True``), else the argmax of one full forward per step."""
    if cache:
        tokens, logits = cached_generate(model, prompt, mask, max_new_tokens)
        return Generation(prompt, mask, tokens, _logprobs(logits), True)
    steps = [step for step, _ in _full_forwards(model, prompt, mask, max_new_tokens, None)]
    batch = prompt.shape[0]
    return Generation(
        prompt,
        mask,
        torch.stack([s.argmax(-1).cpu() for s in steps], 1)
        if steps
        else torch.zeros(batch, 0, dtype=torch.long),
        torch.stack([_logprobs(s) for s in steps], 1)
        if steps
        else torch.zeros(batch, 0, 0, dtype=torch.float64),
    )


def _full_forwards(
    model: torch.nn.Module,
    prompt: torch.Tensor,
    mask: torch.Tensor | None,
    steps: int,
    follow: torch.Tensor | None,
) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
    """Each step's last logits and the token taken (``follow``'s, else the argmax)."""
    ids = prompt
    for step in range(steps):
        last = forward_logits(model, ids, _extend(mask, step))[:, -1]
        token = last.argmax(-1).cpu() if follow is None else follow[:, step]
        yield last, token
        ids = torch.cat([ids, token[:, None]], dim=1)


@torch.no_grad()
def follow_logprobs(model: torch.nn.Module, generation: Generation) -> torch.Tensor:
    """``model`` run on ``generation``'s own tokens, on the path that made it: the float64
    log-softmax of each step's logits, ``(batch, steps, vocab)``."""
    steps = generation.tokens.shape[1]
    if generation.cached:
        _, logits = cached_generate(
            model, generation.prompt, generation.attention_mask, steps, follow=generation.tokens
        )
        return _logprobs(logits)
    forwards = _full_forwards(
        model, generation.prompt, generation.attention_mask, steps, generation.tokens
    )
    return torch.stack([_logprobs(last) for last, _ in forwards], 1)


@torch.no_grad()
def capture_step(
    model: torch.nn.Module,
    generation: Generation,
    step: int,
    path: Path,
    *,
    mode: str,
    include: Iterable[str] | None = None,
    exclude: Iterable[str] = (),
) -> Path:
    """Capture (mix level) the forward that produces token ``step``, as decode step ``step``,
    its calls filtered by the glob patterns ``include`` / ``exclude`` (see ``capture``).
    On the cached path the generation is replayed from the prefill (following its tokens) and
    only forward ``step`` is recorded: it reads the cache the earlier steps wrote."""
    included = None if include is None else list(include)
    excluded = list(exclude) or None
    if generation.cached:
        with capture(
            model,
            path,
            level="mix",
            mode=mode,  # type: ignore[arg-type]
            include=included,
            exclude=excluded,
            steps=[step],
        ) as cap:
            cached_generate(
                model,
                generation.prompt,
                generation.attention_mask,
                step + 1,
                follow=generation.tokens,
                on_forward=cap.step,
            )
        return path
    ids, mask = generation.prefix(step)
    with capture(model, path, level="mix", mode=mode, include=included, exclude=excluded) as cap:  # type: ignore[arg-type]
        cap.step(step)
        forward_logits(model, ids, mask)
    return path


def config_of(model: Any) -> dict[str, Any] | None:
    config = getattr(model, "config", None)
    if config is None:
        return None
    to_dict = getattr(config, "to_dict", None)
    return dict(to_dict()) if callable(to_dict) else dict(vars(config))


# --- saved runs ---------------------------------------------------------------------------------


def save_run(
    model: torch.nn.Module,
    input_ids: Any,
    out: str | os.PathLike[str],
    *,
    attention_mask: Any = None,
    max_new_tokens: int = 16,
    cache: bool | None = None,
) -> Path:
    """Generate greedily and save everything :func:`diagnose` needs from this side into the new
    folder ``out``: tokens, logprobs, config, weight fingerprint, environment, and a tensor dump
    of each step's forward. Use the folder as ``diagnose``'s golden on another machine.

    ``cache``: generate on the model's cached path (``generate``, each step's dump holding its
    decode forward); default: when the model has HF ``generate``. ``diagnose`` against this run
    follows the same path."""
    if not isinstance(model, torch.nn.Module):
        raise PrecisionInputError(f"save_run needs a torch.nn.Module, got {type(model).__name__}")
    folder = Path(out)
    if folder.exists() and any(folder.iterdir()):
        raise PrecisionInputError(f"{folder}: exists and is not empty; choose a new folder")
    prompt, mask = as_batch(input_ids, attention_mask)
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise PrecisionInputError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
    generation = generate(model, prompt, mask, max_new_tokens, cache=path_for([model], cache))
    folder.mkdir(parents=True, exist_ok=True)
    for step in range(max_new_tokens):  # one dump per step: diagnose reads only the one it needs
        capture_step(model, generation, step, folder / _DUMP / f"step{step}", mode="tensor")
    from safetensors.torch import save

    atomic_write(folder / _LOGPROBS, save({"logprobs": generation.logprobs.contiguous()}))
    record = {
        "schema": _SCHEMA,
        "model": type(model).__name__,
        "prompt": generation.prompt.tolist(),
        "attention_mask": None if mask is None else mask.tolist(),
        "tokens": generation.tokens.tolist(),
        "cache": generation.cached,
        "config": config_of(model),
        "fingerprint": fingerprint_weights(model),
        "environment": precision_environment(),
    }
    atomic_write(folder / RUN_FILE, json.dumps(record, indent=1, default=str).encode())
    return folder


def is_saved_run(value: Any) -> bool:
    return isinstance(value, (str, os.PathLike)) and (Path(value) / RUN_FILE).is_file()


class SavedRun:
    """A folder written by :func:`save_run`, read without running any pickle code."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        file = self.path / RUN_FILE
        if not file.is_file():
            raise PrecisionInputError(
                f"{self.path}: not a saved run (no {RUN_FILE}); write one with save_run()"
            )
        try:
            record = json.loads(file.read_text())
            self.prompt = torch.tensor(record["prompt"], dtype=torch.long)
            mask = record["attention_mask"]
            self.attention_mask = None if mask is None else torch.tensor(mask, dtype=torch.long)
            tokens = torch.tensor(record["tokens"], dtype=torch.long)
            cached = record.get("cache", False)  # runs saved before the cached path had none
            if not isinstance(cached, bool):
                raise TypeError(f"cache must be true or false, got {cached!r}")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise PrecisionInputError(f"{file}: unreadable saved run ({exc})") from exc
        from safetensors.torch import load_file

        if not (self.path / _LOGPROBS).is_file():
            raise PrecisionInputError(f"{self.path}: incomplete saved run (no {_LOGPROBS})")
        try:
            logprobs = load_file(str(self.path / _LOGPROBS))["logprobs"]
        except Exception as exc:  # damaged, or without the tensor: safetensors' error types
            raise PrecisionInputError(
                f"{self.path / _LOGPROBS}: unreadable saved run ({exc})"
            ) from None
        self.generation = Generation(self.prompt, self.attention_mask, tokens, logprobs, cached)
        self.config: dict[str, Any] | None = record.get("config")
        self.fingerprint: dict[str, Any] = record.get("fingerprint") or {}
        self.environment: dict[str, Any] = record.get("environment") or {}

    def step_dump(self, step: int) -> Path:
        """The dump of decode step ``step``'s forward."""
        path = self.path / _DUMP / f"step{step}"
        if not path.is_dir():
            raise PrecisionInputError(f"{self.path}: the saved run has no dump of step {step}")
        return path
