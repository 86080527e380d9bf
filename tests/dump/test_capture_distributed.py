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

from pytest_precision import load_dump
from pytest_precision.dump._op_names import op_info

pytestmark = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed"
)


@pytest.fixture(scope="module")
def tp(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tp")
    variants = ("golden", "bf16", "weight", "async")
    return {variant: capture_tp(root, variant) for variant in variants}


def test_collectives_are_named_with_the_argument_they_write() -> None:
    import torch.distributed._functional_collectives as functional

    reduce = op_info(dist.all_reduce)
    assert (reduce.api, reduce.mutated) == ("Distributed.all_reduce", ((0, "tensor"),))
    assert op_info(dist.all_gather_into_tensor).mutated == ((0, "output_tensor"),)
    assert op_info(dist.gather).mutated == ((1, "gather_list"),)
    assert op_info(dist.send).mutated == ()
    assert op_info(dist.barrier).mutated == ()
    out_of_place = op_info(functional.all_reduce)  # returns a new tensor: recorded as any op
    assert (out_of_place.kind, out_of_place.mutated) == ("Distributed", ())


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["golden", "async"])
def test_the_reduced_tensor_is_the_collectives_output_and_its_readers_input(
    tp: dict[str, Path], variant: str
) -> None:
    """Also when the all_reduce is asynchronous: capture waits for it, then records."""
    dump = load_dump(tp[variant])
    partials, reduced, added = {}, {}, {}
    for call in dump.calls:
        if call.step == 0 and call.name.endswith(".0.forward"):
            data = {r.slot: r.load() for r in call.records if r.is_tensor}
            if call.name == "Distributed.all_reduce.0.forward":
                assert call.kind == "Distributed"
                partials[call.rank], reduced[call.rank] = data["input.0"], data["output.0"]
            elif call.name == "Tensor.add.0.forward":
                added[call.rank] = data["input.1"]
    total = partials[0] + partials[1]
    for rank in (0, 1):
        torch.testing.assert_close(reduced[rank], total)
        assert torch.equal(added[rank], reduced[rank])  # not the partial recorded before


@pytest.mark.slow
def test_bf16_is_noise_and_a_wrong_weight_is_found_on_its_rank(tp: dict[str, Path]) -> None:
    result, culprits = judged_in_shards(tp["golden"], tp["bf16"])
    assert result.first_divergence is None, result.report()
    assert result.counts()["fail"] > 0
    assert culprits == [], [(c.name, c.rank, c.reason) for c in culprits]
    result, culprits = judged_in_shards(tp["golden"], tp["weight"])
    found = result.first_divergence
    assert found is not None
    assert (found.rank, found.name, found.cause) == (1, "Functional.linear.0.forward", "source")
    assert {(c.rank, c.layer) for c in culprits} == {(1, "layers.0")}
