"""``--golden-update`` reruns a passing test in float64, so its goldens store their reference.

Imported only in an update run whose test left values waiting (torch is imported then). The
rerun reuses the test's fixtures (function-scoped ones too: they are not set up again) and
starts from the random state the test started from, so its random inputs repeat; afterwards
the random state is what the test left, so the rerun is invisible to later tests.
"""

from __future__ import annotations

import random
import sys
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from ..golden._golden import Golden

#: What the test body may raise that the rerun reports instead of propagating.
_RERUN_ERRORS = (Exception, pytest.skip.Exception, pytest.fail.Exception, pytest.xfail.Exception)


def random_state() -> dict[str, Any]:
    """The state of every random generator a test may draw from (torch's, Python's, numpy's
    when imported, CUDA's when initialized)."""
    import torch

    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        state["numpy"] = numpy.random.get_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_random_state(state: dict[str, Any]) -> None:
    import torch

    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        sys.modules["numpy"].random.set_state(state["numpy"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])


def rerun_in_float64(item: pytest.Item, golden: Golden, start: dict[str, Any]) -> None:
    """Run the test body again under the float64 mode from the random state ``start``; the
    golden matches what it asserts to the first run's values (or says why it cannot)."""
    if not isinstance(item, pytest.Function):
        golden.end_float64_rerun(TypeError(f"{type(item).__name__} items are not rerun"))
        return
    after = random_state()
    run = golden.begin_float64_rerun()
    error: BaseException | None = None
    try:
        set_random_state(start)
        with run.mode:
            item.runtest()
    except _RERUN_ERRORS as exc:
        error = exc
    finally:
        set_random_state(after)
        golden.end_float64_rerun(error)
