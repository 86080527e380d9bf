"""Tiny random-init HF models shared by the output-level tests (built once per module)."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="module")
def tiny_llama() -> Any:
    """``hf_zoo.wandering_llama``: greedy generation that wanders (no download)."""
    pytest.importorskip("transformers")
    from hf_zoo import wandering_llama

    return wandering_llama()
