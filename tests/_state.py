"""Snapshot of every piece of process state that seeding may touch, to prove it is restored."""

from __future__ import annotations

import os
import random
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from pytest_precision.runtime._determinism import DROPOUT_FUNCTIONS
from pytest_precision.runtime._devices import backends, torch_determinism_flags


def global_state() -> dict[str, Any]:
    """Name -> comparable value for each RNG state, env var, torch flag and patched function."""
    numpy_state = np.random.get_state()
    state: dict[str, Any] = {
        "random": random.getstate(),
        "numpy": (numpy_state[0], numpy_state[1].tobytes(), *numpy_state[2:]),
        "torch cpu rng": torch.get_rng_state().numpy().tobytes(),
        "cuda queued seeds": list(torch.cuda._lazy_seed_tracker.call_order),
    }
    state.update({f"flag {name}": value for name, value in torch_determinism_flags().items()})
    for backend in backends():
        state.update({f"env {name}": os.environ.get(name) for name in backend.deterministic_env})
    for name in (*DROPOUT_FUNCTIONS, "scaled_dot_product_attention"):
        state[f"F.{name}"] = getattr(F, name)
    return state


def changed(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """The names whose value differs between two snapshots."""
    return [name for name in before if before[name] != after[name]]
