"""ShardedComparison: shards measured apart, as xdist workers measure them, and judged once give
the report of ``compare_dumps``; a worker reads the tensors of its shards and nothing else; the
judge reads none. On simulated tensor-parallel dumps (``tests/tp_dumps.py``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from compare_helpers import judged_in_shards
from tp_dumps import Bug, shard_data, write_calls, write_tp_dump

from pytest_precision import DumpComparison, ShardedComparison, compare_dumps
from pytest_precision.compare._shards import Shard
from pytest_precision.dump import _native
from pytest_precision.report import render, write_json

BUGS = {
    "same": None,
    "weight": Bug("weight", rank=1, layer=0),  # a source on rank 1, every step
    "kernel": Bug("kernel", rank=1, layer=1, step=1),  # rank 1's last residual add, step 1
}


@pytest.fixture(scope="module")
def tp(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A golden and a target per bug: 2 ranks, 2 steps, 2 layers."""
    root = tmp_path_factory.mktemp("tp")
    dumps = {"golden": write_tp_dump(root / "golden", ranks=2, steps=2, layers=2)}
    for name, bug in BUGS.items():
        dumps[name] = write_tp_dump(root / name, ranks=2, steps=2, layers=2, bug=bug)
    return dumps


class Reads:
    """Every tensor read from a native dump, as its data id (``rank/shard/key``)."""

    def __init__(self) -> None:
        self.ids: list[str] = []

    def take(self) -> set[str]:
        taken, self.ids = set(self.ids), []
        return taken


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Reads:
    log = Reads()
    load = _native._load

    def logged(shard: Path, key: str, *args: object) -> object:
        log.ids.append(f"{shard.parent.name.removeprefix('rank')}/{shard.name}/{key}")
        return load(shard, key, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(_native, "_load", logged)
    return log


def _distributed(
    golden: Path, target: Path, *, workers: int = 2, reads: Reads | None = None
) -> tuple[DumpComparison, ShardedComparison]:
    """Each worker its own comparison (its own process, in xdist), the shards dealt round
    robin, the payloads through JSON; a fresh judge merges them and judges."""
    payloads = []
    for number in range(workers):
        worker = ShardedComparison(golden, target)
        for shard in worker.shards[number::workers]:
            part = worker.measure(shard)
            payloads.append(json.loads(json.dumps(part.payload)))
            if reads is not None:
                assert reads.take() <= shard_data(worker, shard), shard.id
    judge = ShardedComparison(golden, target)
    for payload in reversed(payloads):  # in any order
        judge.merge(payload)
    return judge.result(), judge


def _json(result: DumpComparison, path: Path) -> object:
    write_json(result, path)
    return json.loads(path.read_text())


@pytest.mark.parametrize("variant", list(BUGS))
def test_shards_judged_together_give_the_report_of_compare_dumps(
    tp: dict[str, Path], variant: str, tmp_path: Path
) -> None:
    serial = compare_dumps(tp["golden"], tp[variant])
    distributed, judge = _distributed(tp["golden"], tp[variant])
    assert _json(distributed, tmp_path / "d.json") == _json(serial, tmp_path / "s.json")
    assert render(distributed) == render(serial)
    assert judge.measurements.computed == 0  # the judge read no tensor
    if BUGS[variant] is not None:
        found = distributed.first_divergence
        assert found is not None
        assert (found.rank, found.cause) == (1, "source" if variant == "weight" else "rerun")


def test_a_planted_bug_fails_exactly_its_shard(tp: dict[str, Path]) -> None:
    comparison = ShardedComparison(tp["golden"], tp["kernel"])
    measured = {s.id: comparison.measure(s) for s in comparison.shards}
    failing = [shard for shard, part in measured.items() if part.culprits]
    assert failing == ["step1-rank1-layers.1"]
    culprit = measured["step1-rank1-layers.1"].culprits
    assert [(d.name, d.rule) for d in culprit] == [("Tensor.add.1.forward", "float64 rerun")]
    # the error it made reaches the layer's output record too: failing, but not guilty
    assert [r.name for r in measured["step1-rank1-layers.1"].failed] == [
        "Tensor.add.1.forward",
        "Module.layers.1.Block.forward.0",
    ]
    assert len(comparison.shards) == 2 * 2 * 3  # steps x ranks x (2 layers + the rest)


def test_a_wrong_weight_fails_the_shards_that_read_it_not_those_it_reaches(
    tp: dict[str, Path],
) -> None:
    """Rank 1's layer-0 weight is off: its error reaches every later layer and, through the
    all_reduce, rank 0, where records fail the standard; only the call reading the weight is
    guilty."""
    comparison = ShardedComparison(tp["golden"], tp["weight"])
    measured = {s.id: comparison.measure(s) for s in comparison.shards}
    guilty = {shard: [(d.name, d.cause) for d in part.culprits] for shard, part in measured.items()}
    # at step 1 an input from nowhere may follow another token (other shards tell): the
    # weight, an op's input rather than a module parameter here, convicts at step 0
    assert {shard: found for shard, found in guilty.items() if found} == {
        "step0-rank1-layers.0": [("Functional.linear.0.forward", "source")],
    }
    assert measured["step0-rank0-layers.1"].failed  # the drift it received fails the standard


@pytest.mark.parametrize(
    "collective", ["Distributed.all_reduce", "Torch.all_reduce", "Custom.vllm.all_reduce"]
)
def test_a_collective_by_any_name_carries_a_ranks_error_to_the_others(
    tmp_path: Path, collective: str
) -> None:
    """msprobe's spelling, an older native capture's and vLLM's custom op: rank 0's all_reduce
    receives exactly the golden's partial sum and puts out the error rank 1 fed it. Rank 1's
    wrong weight is the culprit, in the walk and in the shards."""
    golden = write_tp_dump(tmp_path / "g", ranks=2, steps=1, layers=1, collective=collective)
    bug = Bug("weight", rank=1, layer=0)
    target = write_tp_dump(
        tmp_path / "t", ranks=2, steps=1, layers=1, bug=bug, collective=collective
    )
    result, culprits = judged_in_shards(golden, target)
    found = result.first_divergence
    assert found is not None
    assert (found.rank, found.name) == (1, "Functional.linear.0.forward"), found.reason
    assert {(c.rank, c.name) for c in culprits} == {(1, "Functional.linear.0.forward")}


def test_a_module_level_tp_dump_fails_only_the_rank_that_made_the_error(tmp_path: Path) -> None:
    """No collective recorded (a module-level dump): rank 0's layer receives exactly the
    golden's inputs and weights and puts out the error rank 1's wrong weight fed the
    all_reduce hidden inside it. Neither rank 0's shard nor the walk may blame rank 0."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(4, 8, generator=generator)
    weights = [torch.randn(8, 8, generator=generator) * 0.3 for _ in range(2)]
    wrong = [weights[0], weights[1].clone()]
    wrong[1][3, 5] += 1.0

    def write(path: Path, ws: list[torch.Tensor]) -> Path:
        partials = [x @ w.T for w in ws]
        y = x + partials[0] + partials[1]
        for rank in (0, 1):
            calls = [
                (0, "Module.layers.0.proj.Linear.forward.0", "layers.0.proj",
                 {"input.0": x, "parameters.weight": ws[rank], "output.0": partials[rank]}),
                (0, "Module.layers.0.Block.forward.0", "layers.0", {"input.0": x, "output.0": y}),
            ]  # fmt: skip
            write_calls(path, calls, rank=rank, world_size=2)
        return path

    result, culprits = judged_in_shards(
        write(tmp_path / "g", weights), write(tmp_path / "t", wrong)
    )
    assert {(c.rank, c.name) for c in culprits} == {(1, "Module.layers.0.proj.Linear.forward.0")}
    # the walk holds rank 0's layer as a weak culprit only: rank 1's weight, found after, wins
    found = result.first_divergence
    assert found is not None
    assert (found.rank, found.cause) == (1, "source"), found.reason


def test_a_token_that_noise_flipped_fails_no_later_shard(tmp_path: Path) -> None:
    """bf16 against fp32: rounding fails records at step 0 (the rerun clears them); at step 1
    generation took another token, and a call takes a Python int derived from the token ids
    (as MoE code does with ``.tolist()``): its argument differs. The walk judges nothing after
    the flip, and no shard may blame what the other token brought."""
    weights = torch.randn(16, 8, generator=torch.Generator().manual_seed(0)) * 4

    def run(dtype: torch.dtype, token: int) -> list[tuple[int, str, str | None, dict[str, Any]]]:
        calls: list[tuple[int, str, str | None, dict[str, Any]]] = []
        for step in (0, 1):
            ids = torch.tensor([3, 7, 1, 5 if step == 0 else token])
            h = weights.to(dtype)[ids]
            e, k = h.exp(), int(ids[-1]) % 4
            calls += [
                (step, "Functional.embedding.0.forward", None,
                 {"input.0": ids, "input.1": weights.to(dtype), "output.0": h}),
                (step, "Tensor.exp.0.forward", None, {"input.0": h, "output.0": e}),
                (step, "Tensor.__getitem__.0.forward", None,
                 {"input.0": e, "input.1": k, "output.0": e[k]}),
            ]  # fmt: skip
        return calls

    golden = write_calls(tmp_path / "g", run(torch.float32, 5))
    target = write_calls(tmp_path / "t", run(torch.bfloat16, 6))
    result, culprits = judged_in_shards(golden, target)
    assert result.first_divergence is None, render(result)
    assert result.inputs_diverged is not None
    assert result.inputs_diverged.step == 1
    assert culprits == [], [(c.name, c.step, c.reason) for c in culprits]


def test_a_worker_reads_only_the_tensors_of_its_shards(tp: dict[str, Path], reads: Reads) -> None:
    worker = ShardedComparison(tp["golden"], tp["weight"])
    assert worker.shards  # the index was read
    assert reads.take() == set()  # listing the shards reads no tensor
    for shard in worker.shards:
        worker.measure(shard)
        taken = reads.take()
        assert taken, f"{shard.id} measured nothing"
        assert taken <= shard_data(worker, shard), shard.id
    result, _ = _distributed(tp["golden"], tp["weight"], reads=reads)
    assert reads.take() == set()  # judging merged measurements reads nothing
    assert result.first_divergence is not None


def test_an_unknown_shard_is_refused(tp: dict[str, Path]) -> None:
    comparison = ShardedComparison(tp["golden"], tp["same"])
    with pytest.raises(KeyError, match=r"step9-rank0-layers\.0"):
        comparison.measure(Shard(9, 0, "layers.0"))


@pytest.mark.slow
def test_sixty_four_ranks_judge_the_same_first_divergence_distributed(
    tmp_path: Path, reads: Reads
) -> None:
    """64 ranks, 2 decode steps, small tensors: a weight off on rank 37 reaches every rank
    through the all_reduce; serial and two workers convict the same call, and each worker
    reads only the tensors of the shards it measured."""
    golden = write_tp_dump(tmp_path / "g", ranks=64, steps=2, layers=1)
    target = write_tp_dump(tmp_path / "t", ranks=64, steps=2, layers=1, bug=Bug("weight", 37, 0))
    serial = compare_dumps(golden, target)
    reads.take()
    distributed, judge = _distributed(golden, target, reads=reads)
    assert judge.measurements.computed == 0
    assert len(judge.shards) == 64 * 2 * 2
    found = distributed.first_divergence
    assert found is not None
    assert (found.rank, found.step, found.name) == (37, 0, "Functional.linear.0.forward")
    assert _json(distributed, tmp_path / "d.json") == _json(serial, tmp_path / "s.json")
