"""Helpers shared by the dump tests: bitwise checks, pickle payloads, the tiny Llama captured,
stomps (writes behind torch's back)."""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from examples.tiny_llama import TinyLlamaConfig

REPO = Path(__file__).resolve().parent.parent
MSPROBE_FIXTURES = REPO / "fixtures" / "msprobe"
#: The tiny Llama the capture tests record: two layers keep their dumps small.
CONFIG = TinyLlamaConfig(num_layers=2)


def assert_bitwise_equal(actual: torch.Tensor | None, expected: torch.Tensor) -> None:
    """Same dtype, same shape, same bytes (NaN payloads and signed zeros included)."""
    assert actual is not None
    assert actual.dtype == expected.dtype
    assert actual.shape == expected.shape
    assert torch.equal(_bytes(actual), _bytes(expected))


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


class CreatesFileWhenUnpickled:
    """A pickle payload: unpickling it calls ``open(marker, "w")``, creating ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return open, (str(self.marker), "w")


def write_pickle_payload(file: Path, marker: Path) -> None:
    """Write ``file`` as a ``.pt`` whose unpickling would create ``marker``, proving it would."""
    probe, probe_file = marker.with_name("probe-marker"), file.with_name("probe.pt")
    torch.save(CreatesFileWhenUnpickled(probe), probe_file)
    torch.load(probe_file, weights_only=False).close()  # the unsafe way runs the payload
    assert probe.exists(), "the payload must be live, or a refusal test proves nothing"
    probe.unlink()
    probe_file.unlink()
    torch.save(CreatesFileWhenUnpickled(marker), file)


def stomp(t: torch.Tensor, value: float = 100.0, count: int = 3) -> None:
    """Overwrite the first ``count`` float32 elements of ``t``'s memory behind torch's back, as
    a kernel writing out of bounds does: no torch call a capture could record (torch functions
    disabled), no version counter bump."""
    assert t.dtype == torch.float32
    assert t.is_contiguous()
    assert t.numel() >= count
    data = (ctypes.c_float * count)(*[value] * count)
    with torch._C.DisableTorchFunction():
        version = t._version
        ctypes.memmove(t.data_ptr(), data, ctypes.sizeof(data))
        assert t._version == version
