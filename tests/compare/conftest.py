"""Fixtures shared by the compare tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from compare_helpers import VARIANTS, dump_llama


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Capture of the float32 tiny Llama (or a variant) per mode and level, made once."""
    made: dict[tuple[str, str, str], Path] = {}

    def get(mode: str, level: str = "mix", variant: str = "golden") -> Path:
        key = (variant, mode, level)
        if key not in made:
            path = tmp_path_factory.mktemp(f"{variant}-{mode}-{level}")
            made[key] = dump_llama(path / "dump", VARIANTS[variant](), mode, level)
        return made[key]

    return get
