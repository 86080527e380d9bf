"""Integrations with inference engines: ``capture_vllm`` records a vLLM engine's workers as a dump
(docs/vllm.md). Names load on first use (vLLM, torch).
"""

from __future__ import annotations

import typing

from .._lazy import exports

if typing.TYPE_CHECKING:
    from ._vllm import capture_vllm

#: Each public name and the module it lives in: the one list of this package's surface.
_MODULES = {
    "._vllm": ("capture_vllm",),
}

__all__, __getattr__, __dir__ = exports(globals(), _MODULES)
