"""Weights: did every parameter get its checkpoint value, and does each hold the right numbers?

The guides' first structural cause is weight loading. Frameworks log two lists that users grep
for: network parameters that got no weight, and checkpoint keys the network never used. Shape
and dtype mismatches and parameters that do not hold their checkpoint's value (still at their
initializer) follow. A fused qkv split that puts the wrong rows in q and k loads every key, so
:func:`fingerprint_weights` gives float64 statistics per parameter, one of them sensitive to
the order of the elements, for ``assert_close`` or a golden to compare.

Checkpoints are read without running code: safetensors through safetensors, ``.bin`` / ``.pt``
only through ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .._errors import PrecisionInputError
from ..dump._safe_io import load_safetensors_tensor, torch_load_reason
from ..numerics._dtypes import dtype_name
from ._common import OutputCheckFailed

_TORCH_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")
#: Elements per float64 chunk when summarizing one parameter (bounded extra memory).
_CHUNK = 1 << 22


@dataclass(frozen=True)
class WeightIssue:
    """One key with a problem: what the network has and what the checkpoint has."""

    key: str
    network: str
    checkpoint: str


@dataclass(frozen=True)
class WeightsReport:
    """What :func:`check_weights_loaded` found; every list is sorted by key.

    ``missing``: network keys with no weight in the checkpoint ("parameters not loaded in the
    network"); ``unexpected``: checkpoint keys no network key uses ("parameters not loaded in
    the weights"); ``not_loaded``: keys whose network value differs from the checkpoint's, the
    ones still at an initializer marked so in ``network``.
    """

    missing: tuple[str, ...]
    unexpected: tuple[str, ...]
    shape_mismatches: tuple[WeightIssue, ...]
    dtype_mismatches: tuple[WeightIssue, ...]
    not_loaded: tuple[WeightIssue, ...]
    loaded: int
    source: str

    @property
    def passed(self) -> bool:
        return not (
            self.missing
            or self.unexpected
            or self.shape_mismatches
            or self.dtype_mismatches
            or self.not_loaded
        )


# --- reading a checkpoint -----------------------------------------------------------------------


def _safetensors_keys(path: Path) -> Iterator[tuple[str, Path]]:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                yield key, path
    except Exception as exc:  # safetensors raises its own error type
        raise PrecisionInputError(f"{path}: not a readable safetensors file: {exc}") from None


def _load_torch(path: Path) -> dict[str, torch.Tensor]:
    """A torch checkpoint's tensors, never running pickle code from it."""
    try:
        try:
            value = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as exc:
            if "mmap" not in str(exc):
                raise
            value = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch reports refused files with many exception types
        raise PrecisionInputError(f"{path}: refused: {torch_load_reason(exc)}") from None
    if isinstance(value, Mapping) and not all(isinstance(v, torch.Tensor) for v in value.values()):
        for inner in ("state_dict", "model", "module"):  # {"model": state_dict, "optimizer": ...}
            if isinstance(value.get(inner), Mapping):
                value = value[inner]
                break
    if not isinstance(value, Mapping):
        raise PrecisionInputError(f"{path}: holds a {type(value).__name__}, not a state dict")
    bad = [str(k) for k, v in value.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise PrecisionInputError(f"{path}: entries {bad[:5]} are not tensors")
    return {str(k): v for k, v in value.items()}


class _Checkpoint:
    """The keys of a state dict, a file, or a folder of shards; tensors read on demand."""

    def __init__(self, source: Any) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self.files: dict[str, Path] = {}
        if isinstance(source, Mapping):
            self.name = "state dict"
            for key, value in source.items():
                if not isinstance(value, torch.Tensor):
                    raise PrecisionInputError(
                        f"state dict entry {key!r} is a {type(value).__name__}, not a tensor"
                    )
                self.tensors[str(key)] = value
            return
        if not isinstance(source, (str, os.PathLike)):
            raise PrecisionInputError(
                f"expected a state dict or a checkpoint path, got {type(source).__name__}"
            )
        path = Path(source)
        self.name = str(path)
        if path.is_dir():
            files = sorted(path.glob("*.safetensors")) or sorted(
                p for p in path.iterdir() if p.suffix in _TORCH_SUFFIXES
            )
            if not files:
                raise PrecisionInputError(f"{path}: no *.safetensors, *.bin or *.pt files in it")
        elif path.is_file():
            files = [path]
        else:
            raise PrecisionInputError(f"{path}: no such checkpoint file or folder")
        for file in files:
            if file.suffix == ".safetensors":
                for key, where in _safetensors_keys(file):
                    self.files[key] = where
            elif file.suffix in _TORCH_SUFFIXES:
                self.tensors.update(_load_torch(file))
            else:
                raise PrecisionInputError(
                    f"{file}: unknown checkpoint format (expected .safetensors, .bin, .pt, .pth)"
                )

    def names(self) -> list[str]:
        return [*self.tensors, *self.files]

    def get(self, key: str) -> torch.Tensor:
        if key in self.tensors:
            return self.tensors[key]
        return load_safetensors_tensor(self.files[key], key)


# --- checking a model against it ----------------------------------------------------------------


def _network_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every key of the model's state dict, tied aliases included, with its live tensor."""
    if not isinstance(model, torch.nn.Module):
        raise PrecisionInputError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    keys = set(model.state_dict(keep_vars=True))
    live: dict[str, torch.Tensor] = {}
    for name, tensor in [
        *model.named_parameters(remove_duplicate=False),
        *model.named_buffers(remove_duplicate=False),
    ]:
        if name in keys:
            live[name] = tensor
    return live


def _at_initializer(tensor: torch.Tensor) -> str | None:
    """Why a parameter looks never loaded, where that can be told from its values alone."""
    if tensor.device.type == "meta":
        return "on the meta device (never materialized)"
    if tensor.numel() > 1 and tensor.is_floating_point():
        flat = tensor.detach().reshape(-1)
        if bool((flat == flat[0]).all()):
            return f"still at its initializer (every element {float(flat[0]):g})"
        if not bool(torch.isfinite(flat).all()):
            return "still at its initializer (non-finite values: uninitialized memory)"
    return None


def _describe(t: torch.Tensor) -> str:
    return f"{tuple(t.shape)} {dtype_name(t.dtype)}"


def check_weights_loaded(
    model: torch.nn.Module,
    state_dict_or_path: Mapping[str, torch.Tensor] | str | os.PathLike[str],
    *,
    rename: Callable[[str], str | None] | Mapping[str, str] | None = None,
    check_dtype: bool = True,
    check_values: bool = True,
) -> WeightsReport:
    """Compare a loaded model with the checkpoint it was loaded from.

    ``state_dict_or_path``: a state dict, a ``.safetensors`` / ``.bin`` / ``.pt`` file, or a
    folder of shards. ``rename`` maps checkpoint keys to network keys (a mapping, or a callable
    returning None to drop a key). Tied parameters (``lm_head.weight`` sharing the embedding)
    count as loaded when any of their names is in the checkpoint. With ``check_values``, each
    matched parameter must equal its checkpoint tensor (cast to the parameter's dtype); one
    that does not is listed in ``not_loaded``, marked when it is still at its initializer.
    """
    checkpoint = _Checkpoint(state_dict_or_path)
    network = _network_tensors(model)
    mapping: dict[str, str] = {}
    for key in checkpoint.names():
        new = rename.get(key, key) if isinstance(rename, Mapping) else (rename or str)(key)
        if new is not None:
            mapping[new] = key
    aliases: dict[int, list[str]] = {}
    for name, tensor in network.items():
        aliases.setdefault(id(tensor), []).append(name)
    missing, shapes, dtypes, not_loaded, loaded = [], [], [], [], 0
    for names in aliases.values():
        present = [n for n in names if n in mapping]
        if not present:
            missing += names
            continue
        name = present[0]
        live = network[name]
        stored = checkpoint.get(mapping[name])
        loaded += 1
        if tuple(stored.shape) != tuple(live.shape):
            shapes.append(WeightIssue(name, _describe(live), _describe(stored)))
            continue
        if check_dtype and stored.dtype != live.dtype:
            dtypes.append(WeightIssue(name, _describe(live), _describe(stored)))
        if check_values:
            why = _value_problem(live, stored)
            if why is not None:
                not_loaded.append(WeightIssue(name, why, _describe(stored)))
    unexpected = [mapping[n] for n in mapping if n not in network]
    return WeightsReport(
        tuple(sorted(missing)),
        tuple(sorted(unexpected)),
        tuple(sorted(shapes, key=lambda i: i.key)),
        tuple(sorted(dtypes, key=lambda i: i.key)),
        tuple(sorted(not_loaded, key=lambda i: i.key)),
        loaded,
        checkpoint.name,
    )


def _value_problem(live: torch.Tensor, stored: torch.Tensor) -> str | None:
    why = _at_initializer(live)
    if live.device.type == "meta":
        return why
    with torch.no_grad():
        expected = stored.to(device=live.device, dtype=live.dtype)
        if torch.equal(live.detach(), expected):
            return None
        diff = (live.detach().double() - expected.double()).abs()
        differing = int((diff > 0).sum())
    return why or (
        f"differs from the checkpoint at {differing} of {live.numel()} elements "
        f"(max abs {float(diff.max()):.4g}): loaded from elsewhere or changed after loading"
    )


class WeightsNotLoaded(OutputCheckFailed):
    """:func:`assert_weights_loaded` failed; ``result`` is the :class:`WeightsReport`."""


def assert_weights_loaded(
    model: torch.nn.Module,
    state_dict_or_path: Mapping[str, torch.Tensor] | str | os.PathLike[str],
    **options: Any,
) -> WeightsReport:
    """Assert :func:`check_weights_loaded` finds nothing; the message lists every problem."""
    __tracebackhide__ = True
    result = check_weights_loaded(model, state_dict_or_path, **options)
    if not result.passed:
        raise WeightsNotLoaded(weights_message(result), result)
    return result


def weights_message(result: WeightsReport, *, limit: int = 20) -> str:
    """The two lists users grep their logs for, then the mismatches; at most ``limit`` each."""
    lines = [f"weights of {result.source}: {result.loaded} loaded"]

    def block(title: str, items: list[str]) -> None:
        if items:
            lines.append(f"{title} ({len(items)}):")
            lines.extend(f"  {item}" for item in items[:limit])
            if len(items) > limit:
                lines.append(f"  ... and {len(items) - limit} more")

    block("parameters not loaded in the network (no weight for them)", list(result.missing))
    block("parameters not loaded in the weights (never used)", list(result.unexpected))
    for title, issues in (
        ("shape mismatches (network vs checkpoint)", result.shape_mismatches),
        ("dtype mismatches (network vs checkpoint)", result.dtype_mismatches),
        ("parameters not holding their checkpoint value", result.not_loaded),
    ):
        block(title, [f"{i.key}: {i.network} vs {i.checkpoint}" for i in issues])
    return "\n".join(lines)


# --- fingerprints -------------------------------------------------------------------------------

#: The golden ratio's fraction: index weights frac(i * PHI) - 0.5 are exact in float64 for
#: any realistic tensor size, the same on every device, and change when rows move.
_PHI = 0.6180339887498949


def _stats(tensor: torch.Tensor) -> dict[str, Any]:
    flat = tensor.detach().reshape(-1)
    if flat.device.type not in ("cpu", "cuda"):  # float64 support on other devices is partial
        flat = flat.cpu()
    n = flat.numel()
    total = square = absolute = weighted = 0.0
    low, high = float("inf"), float("-inf")
    for start in range(0, n, _CHUNK):
        chunk = flat[start : start + _CHUNK].to(torch.float64)
        index = torch.arange(start, start + chunk.numel(), device=chunk.device, dtype=torch.float64)
        total += float(chunk.sum())
        square += float((chunk * chunk).sum())
        absolute += float(chunk.abs().sum())
        weighted += float((chunk * (torch.frac(index * _PHI) - 0.5)).sum())
        low, high = min(low, float(chunk.min())), max(high, float(chunk.max()))
    mean = total / n if n else 0.0
    return {
        "shape": list(tensor.shape),
        "mean": mean,
        "std": max(square / n - mean * mean, 0.0) ** 0.5 if n else 0.0,
        "abs_mean": absolute / n if n else 0.0,
        "min": low if n else 0.0,
        "max": high if n else 0.0,
        "norm": square**0.5,
        "checksum": weighted,
    }


def fingerprint_weights(
    model_or_state_dict: torch.nn.Module | Mapping[str, torch.Tensor] | str | os.PathLike[str],
    *,
    buffers: bool = False,
) -> dict[str, dict[str, Any]]:
    """Float64 statistics of every parameter, ``{name: {"shape", "mean", "std", "abs_mean",
    "min", "max", "norm", "checksum"}}``; ``checksum`` weights each element by its position, so
    rows that moved (a wrong qkv split, a transposed load) change it even where the other
    statistics do not. Compare two with ``assert_close`` or store one as a golden: a failure
    names the parameter and the statistic. ``buffers`` adds the model's persistent buffers.
    """
    if isinstance(model_or_state_dict, torch.nn.Module):
        if buffers:
            named = dict(model_or_state_dict.state_dict(keep_vars=True))
        else:
            named = dict(model_or_state_dict.named_parameters())
    else:
        checkpoint = _Checkpoint(model_or_state_dict)
        named = {key: checkpoint.get(key) for key in checkpoint.names()}
    return {
        name: _stats(tensor)
        for name, tensor in sorted(named.items())
        if tensor.device.type != "meta" and not tensor.is_complex()
    }
