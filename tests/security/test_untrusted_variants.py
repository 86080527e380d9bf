"""Variants of the rerun attacks of ``test_untrusted_code.py`` that the allowlist let through:
functions that compute by torch's registry but draw from the global random state, or skip
torch's index checks so that a recorded index writes outside memory (a segfault at best).
Each call is built as a reader would build it from a crafted dump; the memory errors run in a
child process, so a regression crashes that process, not the test session."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any

import pytest
import torch

from pytest_precision.dump._records import Call, Record
from pytest_precision.rerun._allowlist import refusal
from pytest_precision.rerun._ops import NotReplayable
from pytest_precision.rerun._recompute import recompute


def _call(kind: str, op: str, inputs: dict[str, Any]) -> Call:
    """A recorded ``kind.op`` call with these input slots (tensors load as recorded)."""
    name = f"{kind}.{op}.0.forward"
    records = []
    for slot, value in inputs.items():
        if isinstance(value, torch.Tensor):
            tensor = value.clone()
            records.append(
                Record(
                    name=name,
                    slot=slot,
                    kind=kind,
                    op=op,
                    dtype=str(value.dtype),
                    shape=tuple(value.shape),
                    loader=lambda tensor=tensor: tensor.clone(),
                )
            )
        else:
            records.append(Record(name=name, slot=slot, kind=kind, op=op, value=value))
    return Call(name=name, kind=kind, op=op, module=None, rank=0, step=0, records=tuple(records))


def _mha_inputs(**extra: Any) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(3, 1, 8, generator=generator)
    return {
        "input.0": x,
        "input.1": x,
        "input.2": x,
        "input.3": 8,
        "input.4": 2,
        "input.5": torch.rand(24, 8, generator=generator),
        "input.6": torch.rand(24, generator=generator),
        "input.7": None,
        "input.8": None,
        "input.9": False,
        "input.10": 0.5,
        "input.11": torch.rand(8, 8, generator=generator),
        "input.12": torch.rand(8, generator=generator),
        **extra,
    }


def _lstm_inputs(train: bool) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(0)
    with torch.random.fork_rng():  # its initialisation draws: leave the session's state be
        lstm = torch.nn.LSTM(4, 4, num_layers=2, dropout=0.5)
    inputs: dict[str, Any] = {
        "input.0": torch.rand(3, 1, 4, generator=generator),
        "input.1.0": torch.zeros(2, 1, 4),
        "input.1.1": torch.zeros(2, 1, 4),
    }
    for i, weight in enumerate(lstm._flat_weights):
        assert weight is not None
        inputs[f"input.2.{i}"] = weight.detach()
    values = (True, 2, 0.5, train, False, False)
    return inputs | {f"input.{3 + i}": v for i, v in enumerate(values)}


@pytest.mark.parametrize(
    "call",
    [
        _call("VF", "lstm", _lstm_inputs(train=True)),
        _call(
            "Functional",
            "fractional_max_pool2d",
            {"input.0": torch.ones(1, 1, 4, 4), "input.1": 2, "kwargs.output_size": 2},
        ),
        _call(
            "Functional",
            "fractional_max_pool3d",
            {"input.0": torch.ones(1, 1, 4, 4, 4), "input.1": 2, "kwargs.output_size": 2},
        ),
        _call("Functional", "multi_head_attention_forward", _mha_inputs()),
        _call(
            "Functional", "multi_head_attention_forward", _mha_inputs(**{"kwargs.training": True})
        ),
    ],
    ids=["lstm_train", "fractional_max_pool2d", "fractional_max_pool3d", "mha", "mha_training"],
)
def test_a_rerun_never_draws_from_the_global_random_state(call: Call) -> None:
    before = torch.get_rng_state()
    with pytest.raises(NotReplayable, match="is a random op"):
        recompute(call)
    assert torch.equal(torch.get_rng_state(), before)


def test_attention_and_rnns_without_dropout_still_rerun() -> None:
    quiet = _call(
        "Functional", "multi_head_attention_forward", _mha_inputs(**{"kwargs.training": False})
    )
    lstm = _call("VF", "lstm", _lstm_inputs(train=False))
    before = torch.get_rng_state()
    outputs = recompute(quiet, dtype=None)
    assert outputs["output.0"].shape == (3, 1, 8)
    assert recompute(lstm, dtype=None)["output.0"].shape == (3, 1, 4)
    assert torch.equal(torch.get_rng_state(), before)


@pytest.mark.parametrize(
    ("kind", "op"),
    [
        ("Torch", "sparse_coo_tensor"),
        ("Torch", "sparse_csr_tensor"),
        ("Torch", "sparse_compressed_tensor"),
        ("Aten", "_sparse_coo_tensor_with_dims_and_tensors.default"),
        ("Torch", "segment_reduce"),
        ("Aten", "segment_reduce.default"),
        ("Torch", "_unsafe_index"),
        ("Aten", "_unsafe_index_put.default"),
    ],
)
def test_ops_that_skip_index_checks_are_refused(kind: str, op: str) -> None:
    reason = refusal(kind, op)
    assert reason is not None
    assert "index checks" in reason


@pytest.mark.parametrize(("kind", "op"), [("Torch", "unsafe_split"), ("Tensor", "unsafe_chunk")])
def test_unsafe_view_helpers_that_check_their_sizes_still_rerun(kind: str, op: str) -> None:
    assert refusal(kind, op) is None


_SEGFAULTS = {
    "sparse_coo_tensor": """
        call = _call("Torch", "sparse_coo_tensor", {
            "input.0": torch.tensor([[10**9]]), "input.1": torch.tensor([1.0]), "input.2": [2],
            "kwargs.check_invariants": False,
        })
        """,
    "segment_reduce": """
        call = _call("Torch", "segment_reduce", {
            "input.0": torch.zeros(2), "input.1": "sum",
            "kwargs.lengths": torch.tensor([10**9]), "kwargs.unsafe": True,
        })
        """,
}


@pytest.mark.parametrize("attack", list(_SEGFAULTS))
def test_a_recorded_index_out_of_range_does_not_crash_the_rerun(attack: str) -> None:
    """The rerun (and what compare does with its output) in a child: before the fix it died
    with SIGSEGV writing outside the tensor."""
    script = (
        textwrap.dedent(
            f"""
        import sys, warnings
        warnings.simplefilter("ignore")
        sys.path.insert(0, {str(__file__.rsplit("/", 1)[0])!r})
        import torch
        from test_untrusted_variants import _call
        from pytest_precision.rerun._recompute import recompute
        from pytest_precision.rerun._ops import NotReplayable
        """
        )
        + textwrap.dedent(_SEGFAULTS[attack])
        + textwrap.dedent(
            """
        try:
            out = recompute(call)
            print({k: v.to_dense().sum().item() for k, v in out.items()})
        except NotReplayable as exc:
            print("refused:", exc)
        """
        )
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "refused: not rerun:" in done.stdout
    assert "index checks" in done.stdout
