"""One test per localization rule of issue #10 (``docs/compare.md``), each on the smallest
dump that shows it: synthetic dumps built record by record, or captures of a two-block model.
The HF matrix (``test_localize_hf.py``) checks the same rules on real architectures."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pytest_precision import Dump, capture, compare_dumps
from pytest_precision.dump._records import Record
from pytest_precision.numerics._dtypes import dtype_name
from pytest_precision.numerics._stats import TensorStats, tensor_stats
from pytest_precision.report import render, write_json

Value = torch.Tensor | TensorStats | float | int | str


class Dumps:
    """A dump built call by call: tensors (with data, or statistics only), statistics as
    given, and plain values."""

    def __init__(self, *, statistics: bool = False) -> None:
        self.statistics = statistics
        self.records: list[Record] = []

    def call(
        self,
        name: str,
        module: str | None,
        slots: Mapping[str, Value],
        *,
        rank: int = 0,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        kind, op = name.split(".")[:2]
        for slot, value in slots.items():
            self.records.append(self._record(name, kind, op, module, slot, value, rank, dtype))

    def _record(
        self,
        name: str,
        kind: str,
        op: str,
        module: str | None,
        slot: str,
        value: Value,
        rank: int,
        dtype: torch.dtype,
    ) -> Record:
        common: dict[str, Any] = {"name": name, "slot": slot, "kind": kind, "op": op}
        common.update(module=module, rank=rank)
        if isinstance(value, TensorStats):  # statistics as a dumper computed them
            return Record(**common, dtype=dtype_name(dtype), shape=(value.numel,), stats=value)
        if not isinstance(value, torch.Tensor):
            return Record(**common, value=value)
        t = value.clone()
        return Record(
            **common,
            dtype=dtype_name(t.dtype),
            shape=tuple(t.shape),
            stats=tensor_stats(t),
            loader=None if self.statistics else (lambda: t.clone()),
            checksum=None if self.statistics else _checksum(t),
        )

    def dump(self) -> Dump:
        return Dump(Path("synthetic"), "native", self.records)


def _checksum(t: torch.Tensor) -> str:
    data = t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
    return hashlib.md5(data + str(t.dtype).encode()).hexdigest()


X = torch.linspace(-1.0, 1.0, 32).reshape(4, 8)
W = torch.linspace(0.5, -0.5, 64).reshape(8, 8)


# -- A. uninitialized memory -----------------------------------------------------------------------


def test_uninitialized_memory_is_not_data() -> None:
    """``empty_like``'s output is whatever the memory held, and so is the input of the call
    that fills it: two runs that compute the same values do not diverge there."""

    def run(garbage: torch.Tensor) -> Dump:
        d = Dumps()
        d.call("Torch.empty_like.0.forward", "moe", {"input.0": X, "output.0": garbage})
        d.call("Tensor.mul.0.forward", "moe", {"input.0": X, "input.1": 2.0, "output.0": X * 2})
        slots = {"input.0": garbage, "input.1": X * 2, "output.0": X * 2}
        d.call("Tensor.copy_.0.forward", "moe", slots)
        return d.dump()

    result = compare_dumps(run(torch.zeros(4, 8)), run(torch.full((4, 8), 3e30)))
    assert result.first_divergence is None, render(result)
    assert result.passed, render(result)
    assert result.counts()["skip"] == 2


# -- B. code only one run has, inside a module -----------------------------------------------------


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(16)
        self.proj = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.proj(self.norm(x))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList([Block(), Block(), Block()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def _capture(model: nn.Module, path: Path, level: str, mode: str = "tensor") -> Path:
    x = torch.randn(2, 4, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), capture(model, path, level=level, mode=mode):  # type: ignore[arg-type]
        model(x.to(next(model.parameters()).dtype))
    return path


def _projection_in_bf16(model: Net) -> str:
    """Layer 1's projection rounds its output to bf16 and back: two casts only the target
    makes, inside the projection; nothing inside fails on a matched call."""
    proj = model.layers[1].proj
    proj.forward = lambda x: (
        F.linear(x, proj.weight, proj.bias).to(torch.bfloat16).to(torch.float32)
    )  # type: ignore[method-assign]
    return "layers.1.proj"


@pytest.mark.parametrize("mode", ["tensor", "statistics"])
@pytest.mark.parametrize("level", ["mix", "op"])
def test_code_only_one_run_has_is_convicted_at_its_module(
    tmp_path: Path, level: str, mode: str
) -> None:
    """With module records, the innermost module with exactly clean inputs and weights whose
    output differs beyond reordered rounding; without, the module the foreign code runs in,
    not the consumer outside it (the residual add)."""
    golden = _capture(Net(), tmp_path / "golden", level, mode)
    model = Net()
    planted = _projection_in_bf16(model)
    result = compare_dumps(golden, _capture(model, tmp_path / "target", level, mode))
    d = result.first_divergence
    assert d is not None, render(result)
    assert d.module == planted, render(result)
    assert d.cause == "unmatched"
    assert "Tensor.to" in d.reason
    rule = "module with clean inputs" if level == "mix" else "code only one run has"
    assert d.rule == rule


def test_the_report_says_the_rule_and_how_the_error_grew(tmp_path: Path) -> None:
    golden = _capture(Net(), tmp_path / "golden", "mix")
    model = Net()
    with torch.no_grad():
        model.layers[1].proj.weight[0, 0] += 0.5
    result = compare_dumps(golden, _capture(model, tmp_path / "target", "mix"))
    d = result.first_divergence
    assert d is not None
    assert d.rule == "source"
    assert d.growth is not None
    assert [x.layer for x in d.growth.layers][:2] == ["layers.1", "layers.2"]
    assert d.growth.explodes is not None
    assert d.growth.explodes.layer == "layers.1"
    text = render(result)
    assert "rule:   source" in text
    assert "growth: layers.1 " in text
    assert "exceeds the gross limit 0.001 at layers.1" in text
    write_json(result, tmp_path / "c.json")
    document = json.loads((tmp_path / "c.json").read_text())["first_divergence"]
    assert document["rule"] == "source"
    assert document["growth"]["explodes"] == "layers.1"
    assert document["growth"]["layers"][0]["layer"] == "layers.1"


# -- C. a constant computed from the run's dtype ---------------------------------------------------


class Masked(nn.Module):
    """Attention scores masked with the dtype's minimum, as HF's eager mask does."""

    def __init__(self, scale: float | None = None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(16, 16)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        scores = h @ h.transpose(-1, -2) * (self.scale or 0.25)
        mask = torch.ones(4, 4, dtype=torch.bool).tril()
        fill = torch.where(mask, torch.tensor(0.0, dtype=h.dtype), torch.finfo(h.dtype).min)
        return torch.softmax(scores + fill, dim=-1) @ h


@pytest.mark.parametrize("mode", ["tensor", "statistics"])
def test_a_constant_in_the_runs_dtype_is_no_source(tmp_path: Path, mode: str) -> None:
    """``finfo(bfloat16).min`` in a bf16 port is the golden's ``finfo(float32).min`` in
    bf16, saturated to its range: not a source. Another constant still is."""
    golden = _capture(Masked(), tmp_path / "golden", "mix", mode)
    port = _capture(Masked().to(torch.bfloat16), tmp_path / "port", "mix", mode)
    result = compare_dumps(golden, port)
    assert result.first_divergence is None, render(result)
    wrong = _capture(Masked(0.3).to(torch.bfloat16), tmp_path / "wrong", "mix", mode)
    d = compare_dumps(golden, wrong).first_divergence
    assert d is not None
    assert d.rule == "source"
    assert "0.3" in d.reason


# -- D. equal non-finite statistics ----------------------------------------------------------------


def test_equal_overflowing_statistics_are_equal() -> None:
    """msprobe sums in the tensor's dtype: a float32 mask of finfo.min has mean -inf and norm
    inf on both sides, and that is no difference."""
    low = torch.finfo(torch.float32).min
    overflowed = TensorStats(0.0, low, -float("inf"), float("inf"), 0, 0, 0, 64)
    d = Dumps(statistics=True)
    d.call("Torch.where.0.forward", None, {"input.0": X, "output.0": overflowed})
    d.call("Tensor.add.0.forward", None, {"input.0": overflowed, "output.0": overflowed})
    result = compare_dumps(d.dump(), d.dump())
    assert result.passed, render(result)


# -- E. collectives across ranks -------------------------------------------------------------------


def _tensor_parallel(scale: float, extra_op: bool) -> Dump:
    """Two ranks, each a partial product then an all_reduce of the partial sums. On rank 1
    the partial sum is ``scale`` times off: computed so (a matched call), or by an extra
    op without a module (code only the target has)."""
    d = Dumps()
    partials = [X[:, :4] @ W[:4], X[:, 4:] @ W[4:]]
    total = partials[0] + partials[1] * scale
    for rank, partial in enumerate(partials):
        out = partial * scale if rank == 1 and not extra_op else partial
        slots = {"input.0": X, "input.1": W, "output.0": out}
        d.call("Tensor.matmul.0.forward", None, slots, rank=rank)
        if rank == 1 and extra_op:
            slots = {"input.0": partial, "input.1": scale, "output.0": partial * scale}
            d.call("Tensor.__mul__.0.forward", None, slots, rank=rank)
            out = partial * scale
        slots = {"input.0": out, "output.0": total}
        d.call("Distributed.all_reduce.0.forward", None, slots, rank=rank)
    return d.dump()


@pytest.mark.parametrize("extra_op", [False, True])
def test_a_rank_local_error_before_a_collective_is_blamed_on_its_rank(extra_op: bool) -> None:
    """Rank 0's all_reduce has clean inputs and a wrong output; the error was added on rank 1
    before the collective. The ranks are walked in lockstep up to each collective."""
    golden = _tensor_parallel(1.0, extra_op=False)
    result = compare_dumps(golden, _tensor_parallel(1.5, extra_op))
    d = result.first_divergence
    assert d is not None, render(result)
    assert d.rank == 1, render(result)
    rule = "code only one run has" if extra_op else "float64 rerun"
    assert d.rule == rule, render(result)


# -- F. statistics equality is not data equality ---------------------------------------------------


def test_matching_statistics_inherit_the_producers_drift() -> None:
    """Routing counts permuted by a near-tie have the golden's statistics; the cumsum of them
    does not. The counts came out of a call whose inputs drifted, so the cumsum's inputs do
    not "match exactly": no conviction of the cumsum."""

    def run(scale: float, counts: list[int], dtype: torch.dtype) -> Dump:
        d = Dumps(statistics=True)
        logits, c = (X * scale).to(dtype), torch.tensor(counts)
        d.call("Torch.bincount.0.forward", "moe", {"input.0": logits, "output.0": c})
        d.call("Torch.cumsum.0.forward", "moe", {"input.0": c, "output.0": c.cumsum(0)})
        return d.dump()

    golden = run(1.0, [5, 4, 4], torch.float32)
    result = compare_dumps(golden, run(1.001, [4, 4, 5], torch.bfloat16))
    assert result.first_divergence is None, render(result)


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
