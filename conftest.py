"""Root conftest: torch is imported here, once, so pytester's in-process runs can share it."""

from __future__ import annotations

import torch  # noqa: F401  (imported for its side effect: one torch per process)

pytest_plugins = ["pytester"]
