"""assert_deterministic, the run-twice check: what it catches down to the last bit, how it
says where, and which outputs it refuses to compare."""

from __future__ import annotations

import functools
import math
import re
from typing import Any

import numpy as np
import pytest
import torch
from _state import changed, global_state
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from pytest_precision import PrecisionInputError, assert_deterministic

# --- assert_deterministic -------------------------------------------------------------------


class TinyBlock(nn.Module):
    """Attention + MLP with dropout everywhere, returning a nested structure like HF models."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, width)
        self.layer = nn.TransformerEncoderLayer(width, 2, 32, dropout=0.3, batch_first=True)
        self.head = nn.Linear(width, 50)

    def forward(self, tokens: torch.Tensor) -> dict[str, Any]:
        hidden = self.layer(self.embed(tokens))
        return {"logits": self.head(hidden), "hidden": (hidden, hidden.argmax(-1)), "n": 2}


class Noisy(nn.Module):
    """Adds 1e-5 relative noise from a private generator, as a racy kernel would."""

    def __init__(self) -> None:
        super().__init__()
        self.generator = torch.Generator().manual_seed(0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * (1 + 1e-5 * torch.randn(x.shape, generator=self.generator))


def chunked_sum(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Sum the columns of ``x`` chunk by chunk, in an order that changes on every call."""
    chunks = x.split(7, dim=1)
    total = torch.zeros(x.shape[0])
    for index in torch.randperm(len(chunks), generator=generator).tolist():
        total = total + chunks[index].sum(dim=1)
    return total


def test_passes_a_deterministic_model_with_active_dropout() -> None:
    torch.manual_seed(0)
    model = TinyBlock().train()
    assert_deterministic(model, torch.randint(0, 50, (2, 6)))


def test_catches_tiny_noise_and_says_where() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), Noisy(), nn.Linear(8, 4))
    with pytest.raises(AssertionError) as excinfo:
        assert_deterministic(model, torch.randn(3, 8), runs=3, seed=5)
    message = str(excinfo.value)
    assert message.startswith(
        "Sequential is not deterministic: run 2 of 3 differs from run 1 "
        "(seed 5, deterministic algorithms on)"
    )
    assert re.search(
        r"\n  output: \d+ of 12 elements differ \(torch.float32, shape \(3, 4\)\); "
        r"first at index \(\d, \d\): run 1 = \S+ \(bits 0x\w{8}\), run 2 = \S+ \(bits 0x\w{8}\)$",
        message,
    )


def test_catches_last_bit_differences_from_summation_order() -> None:
    x = torch.randn(64, 700, generator=torch.Generator().manual_seed(1))
    generator = torch.Generator().manual_seed(0)
    first, second = chunked_sum(x, generator), chunked_sum(x, generator)
    # The premise: the two orders disagree only in the last bits.
    assert not torch.equal(first, second)
    assert torch.allclose(first, second, rtol=1e-5, atol=1e-5)

    with pytest.raises(AssertionError, match=r"output: \d+ of 64 elements differ") as excinfo:
        assert_deterministic(chunked_sum, x, generator)
    assert "first at index (" in str(excinfo.value)


def test_names_the_first_module_whose_output_changed() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Sequential(nn.ReLU(), Noisy()), nn.Linear(8, 4))
    with pytest.raises(
        AssertionError, match=r"first module whose output differed: '1\.1' \(Noisy\), call 1"
    ):
        assert_deterministic(model, torch.randn(3, 8), locate=model)


def test_a_difference_outside_the_modules_is_said_to_be_outside() -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 4)
    noise = Noisy()

    def generate(x: torch.Tensor) -> torch.Tensor:
        return noise(model(x).detach())

    with pytest.raises(AssertionError, match="difference arose outside the model's modules"):
        assert_deterministic(generate, torch.randn(2, 4), locate=model)


def test_reports_each_differing_item_by_path() -> None:
    calls = iter(range(100))

    def fn() -> dict[str, Any]:
        n = next(calls)
        return {"same": torch.ones(2), "items": [torch.ones(3), torch.full((3,), float(n))], "n": n}

    with pytest.raises(AssertionError) as excinfo:
        assert_deterministic(fn)
    lines = str(excinfo.value).splitlines()[1:]
    assert lines == [
        "  ['items'][1]: 3 of 3 elements differ (torch.float32, shape (3,)); first at index (0,): "
        "run 1 = 0.0 (bits 0x00000000), run 2 = 1.0 (bits 0x3f800000)",
        "  ['n']: run 1 = 0, run 2 = 1",
    ]


def test_structure_changes_are_reported() -> None:
    lengths = iter([1, 2])

    def fn() -> list[torch.Tensor]:
        return [torch.zeros(1)] * next(lengths)

    with pytest.raises(
        AssertionError,
        match=r"structure differs: run 1 has items \[\[0\]\], run 2 has \[\[0\], \[1\]\]",
    ):
        assert_deterministic(fn, runs=2)


def test_comparison_is_bitwise_for_nan_and_signed_zero() -> None:
    constant = torch.tensor([float("nan"), 1.0])
    assert_deterministic(lambda: (constant.clone(), float("nan"), np.array([np.nan])))
    signs = iter([0.0, -0.0])
    with pytest.raises(AssertionError, match=r"output: run 1 = 0\.0, run 2 = -0\.0"):
        assert_deterministic(lambda: next(signs), runs=2)


def test_numpy_integer_and_bool_outputs_are_compared() -> None:
    counter = iter(range(10))
    with pytest.raises(
        AssertionError, match=r"\[1\]: 1 of 4 elements differ \(int64.*run 1 = 0, run 2 = 1"
    ):
        assert_deterministic(lambda: (np.ones(2, dtype=bool), np.array([next(counter), 0, 0, 0])))


def test_outputs_are_copied_so_a_reused_buffer_cannot_hide_a_difference() -> None:
    buffer = torch.zeros(3)
    values = iter([1.0, 2.0])

    def fn() -> torch.Tensor:
        buffer.fill_(next(values))
        return buffer

    with pytest.raises(AssertionError, match="3 of 3 elements differ"):
        assert_deterministic(fn, runs=2)


def test_arguments_are_forwarded_and_seeds_restored() -> None:
    before = global_state()
    assert_deterministic(functools.partial(torch.randn, 3), 4, dtype=torch.float64)
    assert changed(before, global_state()) == []


def test_runs_below_two_and_a_non_module_locate_are_input_errors() -> None:
    with pytest.raises(PrecisionInputError, match="runs >= 2"):
        assert_deterministic(torch.zeros, 1, runs=1)
    with pytest.raises(PrecisionInputError, match=r"locate must be a torch\.nn\.Module"):
        assert_deterministic(torch.zeros, 1, locate="model")  # type: ignore[arg-type]


@settings(max_examples=30, deadline=None)
@given(
    shapes=st.lists(st.lists(st.integers(1, 4), min_size=0, max_size=3), min_size=1, max_size=4),
    data=st.data(),
)
def test_a_one_ulp_change_anywhere_is_caught_at_its_path_and_index(
    shapes: list[list[int]], data: st.DataObject
) -> None:
    outputs = {f"out{i}": torch.randn(shape) for i, shape in enumerate(shapes)}
    item = data.draw(st.sampled_from(sorted(outputs)))
    flat = data.draw(st.integers(0, outputs[item].numel() - 1))
    changed_outputs = {name: t.clone() for name, t in outputs.items()}
    target = changed_outputs[item].view(-1)
    target[flat] = torch.nextafter(target[flat], torch.tensor(math.inf))
    results = iter([outputs, changed_outputs])

    with pytest.raises(AssertionError) as excinfo:
        assert_deterministic(lambda: next(results), runs=2)
    index = tuple(int(i) for i in np.unravel_index(flat, tuple(outputs[item].shape)))
    assert (
        str(excinfo.value)
        .splitlines()[1]
        .startswith(
            f"  ['{item}']: 1 of {outputs[item].numel()} elements differ (torch.float32, "
            f"shape {tuple(outputs[item].shape)}); first at index {index}: "
        )
    )


# --- found in review -------------------------------------------------------------------------


def test_numpy_scalars_and_complex_numbers_compare_bit_by_bit() -> None:
    assert_deterministic(lambda: (np.float32("nan"), complex(math.nan, 0.0)))
    signs = iter([0.0, -0.0, -0.0])
    with pytest.raises(AssertionError, match=r"1 of 1 elements differ"):
        assert_deterministic(lambda: np.float32(next(signs)))
    zeros = iter([complex(0.0, 0.0), complex(-0.0, 0.0), complex(-0.0, 0.0)])
    with pytest.raises(AssertionError, match="differ"):
        assert_deterministic(lambda: next(zeros))


def test_values_that_cannot_be_compared_are_input_errors() -> None:
    with pytest.raises(PrecisionInputError, match=r"\[1\]: cannot compare a object between runs"):
        assert_deterministic(lambda: (torch.ones(2), object()))
    with pytest.raises(PrecisionInputError, match="numpy object array"):
        assert_deterministic(lambda: np.array([object()]))


def test_fn_keyword_reaches_the_callee() -> None:
    assert_deterministic(lambda fn: torch.full((2,), float(fn)), fn=3)


class _Cache:
    """Like an HF DynamicCache: an opaque object whose repr holds its address."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


class _LayerWithCache(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, _Cache]:
        return x * 2, _Cache(x)


class _NoisyTop(torch.nn.Module):
    """Deterministic inside its layer; the top adds a different value on every call."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = _LayerWithCache()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _ = self.layer(x)
        self.calls += 1
        return y + 1e-3 * self.calls


def test_locate_ignores_addresses_of_opaque_outputs() -> None:
    model = _NoisyTop()
    with pytest.raises(
        AssertionError, match="first module whose output differed: the model itself"
    ):
        assert_deterministic(lambda: model(torch.ones(3)), locate=model, deterministic=False)


def test_complex_bits_print_real_part_first() -> None:
    values = iter([1 + 2j, 1 + 3j, 1 + 3j])
    with pytest.raises(AssertionError, match=r"\(1\+2j\) \(bits 0x3f800000 0x40000000\)"):
        assert_deterministic(lambda: torch.tensor([next(values)], dtype=torch.complex64))
