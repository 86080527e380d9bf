"""Helpers shared by the replay tests: real tiny-Llama captures, and a kernel bug to inject."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from examples.tiny_llama import TinyLlamaConfig, build_tiny_llama, example_input_ids
from pytest_precision import capture

CONFIG = TinyLlamaConfig(num_layers=2)
IDS = example_input_ids(CONFIG, seq=8)


class BrokenOp(TorchFunctionMode):
    """A kernel bug: the ``call``-th call (from 1) of ``func`` returns slightly skewed values.
    Entered outside a capture, the capture records the wrong output as the op's own."""

    def __init__(self, func: Callable[..., Any] = torch.nn.functional.softmax, call: int = 2):
        super().__init__()
        self.func = func
        self.call = call
        self.calls = 0

    def __torch_function__(
        self,
        func: Any,
        types: Collection[type],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        if func is self.func:
            self.calls += 1
            if self.calls == self.call:
                out = out * (1 + 0.01 * torch.arange(out.shape[-1], dtype=out.dtype))
        return out


def capture_llama(
    path: Path,
    *,
    dtype: torch.dtype = torch.float32,
    mode: str = "tensor",
    level: str = "mix",
    broken: BrokenOp | None = None,
    steps: int = 1,
) -> Path:
    """A capture of the tiny Llama's forward (``steps`` times, one decode step each)."""
    model = build_tiny_llama(CONFIG, seed=0, dtype=dtype)
    outside = broken or contextlib.nullcontext()
    options: dict[str, Any] = {"mode": mode, "level": level}
    with outside, torch.no_grad(), capture(model, path, **options) as cap:
        for step in range(steps):
            if step:
                cap.step()
            model(IDS)
    return path
