"""The accelerator the device-marked tests run on (``scripts/device_check.sh`` selects them with
``-m device``): CUDA, else an Ascend NPU through torch_npu, else none, and they skip."""

from __future__ import annotations

import importlib.util

import pytest
import torch


def accelerator() -> str | None:
    """``"cuda"`` or ``"npu"`` when one is usable here, else None."""
    if torch.cuda.is_available():
        return "cuda"
    if importlib.util.find_spec("torch_npu") is not None:
        try:
            import torch_npu  # noqa: F401  (registers torch.npu)
        except Exception:  # a broken install: no NPU to test on
            return None
        npu = getattr(torch, "npu", None)
        if npu is not None and npu.is_available():
            return "npu"
    return None


ACCELERATOR = accelerator()

#: Marks (and skips, without an accelerator) a test of a device path.
needs_device = [
    pytest.mark.device,
    pytest.mark.skipif(ACCELERATOR is None, reason="needs a CUDA or NPU device"),
]
