"""Fixtures shared by the dump tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from dump_helpers import MSPROBE_FIXTURES


@pytest.fixture
def rank_copy(tmp_path: Path) -> Path:
    """A writable copy of one real rank folder (mix level, tensor task, step 0)."""
    (source,) = (MSPROBE_FIXTURES / "mix_tensor_steps" / "step0").iterdir()
    target = tmp_path / "dump" / "step0" / "rank0"
    shutil.copytree(source, target)
    return target
