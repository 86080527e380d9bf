"""Capture of ``torch.distributed`` collectives, on a real two-rank gloo group (``tp_capture``).

A c10d collective writes its argument in place without bumping its version counter. Capture
names it as msprobe does (``Distributed.all_reduce``), records what it wrote as its output, and
never reuses what it recorded of that tensor before: the next op's input is the reduced tensor,
so a bf16 run stays noise and a wrong weight is found on its rank."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from compare_helpers import judged_in_shards
from tp_capture import capture_tp

from pytest_precision import capture, load_dump
from pytest_precision.dump._op_names import op_info
from pytest_precision.report import render

pytestmark = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed"
)


@pytest.fixture(scope="module")
def tp(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tp")
    variants = (
        "golden",
        "bf16",
        "weight",
        "async",
        "excluded",
        "detach",
        "p2p",
        "driver",
        "funcol",
    )
    return {variant: capture_tp(root, variant) for variant in variants}


def test_collectives_are_named_with_the_argument_they_write() -> None:
    reduce = op_info(dist.all_reduce)
    assert (reduce.api, reduce.mutated) == ("Distributed.all_reduce", ((0, "tensor"),))
    assert op_info(dist.all_gather_into_tensor).mutated == ((0, "output_tensor"),)
    assert op_info(dist.gather).mutated == ((1, "gather_list"),)
    assert op_info(dist.irecv).mutated == ((0, "tensor"),)
    assert op_info(dist.send).mutated == ()


@pytest.mark.filterwarnings("ignore:.*is deprecated:FutureWarning")
def test_renamed_collectives_keep_their_older_names(tmp_path: Path) -> None:
    """torch 2.13 renamed ``all_gather_into_tensor`` and ``reduce_scatter_tensor`` (to
    ``*_single``); the records keep the names older dumps and msprobe carry (a one-rank
    group)."""

    class Gathers(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            gathered, scattered = torch.empty_like(x), torch.empty_like(x)
            dist.all_gather_into_tensor(gathered, x)
            dist.reduce_scatter_tensor(scattered, x)
            return gathered + scattered

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        model = Gathers()
        with torch.no_grad(), capture(model, tmp_path / "dump", level="op"):
            model(torch.ones(4))
    finally:
        dist.destroy_process_group()
    calls = [c for c in load_dump(tmp_path / "dump").calls if c.kind == "Distributed"]
    assert [c.name for c in calls] == [
        "Distributed.all_gather_into_tensor.0.forward",
        "Distributed.reduce_scatter_tensor.0.forward",
    ]
    assert all(torch.equal(c.outputs[0].load(), torch.ones(4)) for c in calls)


def _tensors(dump: Path, name: str, slot: str, step: int = 0) -> dict[int, torch.Tensor]:
    """Each rank's recorded ``slot`` of the call ``name`` at ``step``."""
    return {
        r.rank: r.load()
        for r in load_dump(dump)
        if (r.name, r.slot, r.step) == (name, slot, step) and r.is_tensor
    }


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["golden", "async", "excluded", "detach", "p2p", "funcol"])
def test_the_reduced_tensor_is_what_the_next_op_reads(tp: dict[str, Path], variant: str) -> None:
    """Synchronous or asynchronous (capture waits for it), recorded or filtered out, read
    through a detached alias, sent to the other rank by an asynchronous receive, or functional
    (filled at ``wait_tensor``): the op after the all_reduce reads the sum of the ranks'
    partial sums, never a record made before the collective wrote it."""
    partials = _tensors(tp[variant], "Functional.linear.0.forward", "output.0")
    read = _tensors(tp[variant], "Tensor.add.0.forward", "input.1")
    for rank in (0, 1):
        torch.testing.assert_close(read[rank], partials[0] + partials[1])
    collective = {
        "excluded": None,
        "funcol": "Custom._c10d_functional.all_reduce.0.forward",  # recorded once it arrived
    }.get(variant, "Distributed.all_reduce.0.forward")
    if collective is not None:
        reduced = _tensors(tp[variant], collective, "output.0")
        assert all(torch.equal(reduced[rank], read[rank]) for rank in (0, 1))


@pytest.mark.slow
def test_a_broadcast_outside_the_forward_gives_the_next_step_its_data(
    tp: dict[str, Path],
) -> None:
    """Between two decode steps rank 0 broadcasts its input to rank 1, in place, outside any
    recorded forward: rank 1's step-1 input is rank 0's, not its own step-0 record."""
    step0 = _tensors(tp["driver"], "Module._Model.forward.0", "input.0")
    step1 = _tensors(tp["driver"], "Module._Model.forward.0", "input.0", step=1)
    assert not torch.equal(step0[0], step0[1])
    assert torch.equal(step1[1], step0[0])


@pytest.mark.slow
def test_bf16_is_noise_and_a_wrong_weight_is_found_on_its_rank(tp: dict[str, Path]) -> None:
    result, culprits = judged_in_shards(tp["golden"], tp["bf16"])
    assert result.first_divergence is None, render(result)
    assert result.counts()["fail"] > 0
    assert culprits == [], [(c.name, c.rank, c.reason) for c in culprits]
    result, culprits = judged_in_shards(tp["golden"], tp["weight"])
    found = result.first_divergence
    assert found is not None
    assert (found.rank, found.name, found.cause) == (1, "Functional.linear.0.forward", "source")
    assert {(c.rank, c.layer) for c in culprits} == {(1, "layers.0")}
