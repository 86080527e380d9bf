"""compare_dumps on architectures and bug classes the rest of the suite never used
(``hf_zoo_more``, ``hf_bugs_more``): every planted bug is convicted inside the module where
forward hooks measured it (the truth, not the plant), noise pairs name no culprit.

The fast subset (one case of each bug class, on a few architectures, and the noise pairs of three)
runs by default; the whole matrix is ``slow``. Mix level only (``test_localize_hf`` covers the
module level on its zoo). One golden per (architecture, mode), made once per module; every test
runs on one torch thread, so goldens and targets are the same in whatever order they run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from compare_helpers import judged_in_shards
from hf_bugs import threads
from hf_bugs_more import BUGS, NOISE, applicable, inside, truth
from hf_zoo_more import ARCHS, build, model_inputs

from pytest_precision import (
    Divergence,
    Dump,
    DumpComparison,
    capture,
    check_batch_invariance,
    load_dump,
    render,
)

MODES = ("tensor", "statistics")

#: one case of each bug class, on as many families as the classes allow
FAST = {
    "norm_eps": "gpt_neox",
    "activation": "gemma3",  # exact GELU for tanh-GELU: a small move in statistics
    "gqa_mapping": "falcon",
    "softmax_bf16": "bloom",
    "residual_bf16": "olmo2",
    "embedding_scale": "gemma3",
    "logit_scale": "cohere",
    "lm_head_tied": "mpt",
    "lm_head_stale": "starcoder2",
    "rotary_fraction": "phi",
    "alibi_slopes": "bloom",
    "router_renorm": "olmoe",
    "wrong_expert": "deepseek_v2",
    "ssm_decay": "jamba",
}
FAST_NOISE = ("gemma3", "deepseek_v2", "jamba")


def _case(arch: str, case: str, mode: str, fast: bool) -> object:
    marks: list[pytest.MarkDecorator] = [] if fast else [pytest.mark.slow]
    return pytest.param(arch, case, mode, marks=marks, id=f"{arch}-{case}-{mode}")


BUG_CASES = [
    _case(arch, bug, mode, fast=FAST.get(bug) == arch)
    for arch in ARCHS
    for bug in applicable(ARCHS[arch])
    for mode in MODES
]
NOISE_CASES = [
    _case(arch, case, mode, fast=arch in FAST_NOISE)
    for arch in ARCHS
    for case in NOISE
    for mode in MODES
]


def capture_forward(model: torch.nn.Module, arch: str, path: Path, mode: str) -> Path:
    with torch.no_grad(), capture(model, path, level="mix", mode=mode):
        model(**model_inputs(arch), use_cache=False)
    return path


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    with threads(1):
        yield


@pytest.fixture(scope="module")
def golden(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, str], Dump]:
    made: dict[tuple[str, str], Dump] = {}

    def get(arch: str, mode: str) -> Dump:
        if (arch, mode) not in made:
            path = tmp_path_factory.mktemp(f"golden-{arch}-{mode}") / "dump"
            with threads(1):
                made[arch, mode] = load_dump(capture_forward(build(arch), arch, path, mode))
        return made[arch, mode]

    return get


def localize(
    golden_dump: Dump, arch: str, bug: str, mode: str, tmp: Path
) -> tuple[DumpComparison, list[Divergence]]:
    model = build(arch)
    BUGS[bug].plant(model, ARCHS[arch])
    return judged_in_shards(golden_dump, capture_forward(model, arch, tmp / "target", mode))


def compare_noise(
    golden_dump: Dump, arch: str, case: str, mode: str, tmp: Path
) -> tuple[DumpComparison, list[Divergence]]:
    dtype, n_threads = NOISE[case]
    with threads(n_threads):
        target = capture_forward(build(arch, dtype), arch, tmp / "target", mode)
    return judged_in_shards(golden_dump, target)


@pytest.mark.parametrize(("arch", "bug", "mode"), BUG_CASES)
def test_planted_bug_is_convicted_where_it_was_measured(
    golden: Callable[[str, str], Dump], arch: str, bug: str, mode: str, tmp_path: Path
) -> None:
    where = truth(arch, BUGS[bug].plant)
    assert where is not None, f"{bug} changes nothing in {arch}: give it a Bug.skip"
    result, culprits = localize(golden(arch, mode), arch, bug, mode, tmp_path)
    d = result.first_divergence
    assert d is not None, f"{bug} in {where!r}: no divergence\n{render(result)}"
    assert inside(d.module, where), (
        f"{bug} in {where!r}, convicted {d.name} in {d.module} ({d.rule}): {d.reason}"
    )
    for c in culprits:
        assert inside(c.module, where), f"{bug} in {where!r}: a shard convicts {c.name}"


@pytest.mark.parametrize(("arch", "case", "mode"), NOISE_CASES)
def test_noise_names_no_culprit(
    golden: Callable[[str, str], Dump], arch: str, case: str, mode: str, tmp_path: Path
) -> None:
    result, culprits = compare_noise(golden(arch, mode), arch, case, mode, tmp_path)
    d = result.first_divergence
    assert d is None, f"{case}: false alarm at {d.name} in {d.module} ({d.rule}): {d.reason}"
    assert culprits == [], f"{case}: a shard convicts {culprits[0].name}: {culprits[0].reason}"


@pytest.mark.parametrize("arch", ["glm", "olmoe", "jamba", "deepseek_v2", "bloom"])
def test_a_prompt_alone_against_its_row_of_the_batch_is_noise(arch: str) -> None:
    """A prompt alone against its padded row among others (``check_batch_invariance`` cuts the
    row out of every batched record): the batch changes reduction orders, never what the prompt
    computes, also where an MoE dispatch or a Mamba scan mixes the batch's tokens."""
    prompts = [[5, 17, 99, 42, 7, 64], [9, 3, 120, 33, 81, 12, 50, 77], [101, 8, 36, 27, 4]]
    result = check_batch_invariance(build(arch), prompts, batch_sizes=(3,), needles=[0])
    (case,) = result.cases
    assert case.verdict in ("invariant", "noise"), case.divergence
    assert case.padding == 2


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "arch",
    [
        "gemma3",
        pytest.param("gpt_neox", marks=pytest.mark.slow),
        pytest.param("falcon", marks=pytest.mark.slow),
        pytest.param("olmoe", marks=pytest.mark.slow),
    ],
)
def test_sdpa_against_eager_names_no_culprit(
    golden: Callable[[str, str], Dump], arch: str, mode: str, tmp_path: Path
) -> None:
    """Eager and SDPA attention agree at real positions and put out other values at row 1's
    fully masked pad positions (a softmax over no key is undefined): not evidence."""
    model = build(arch, attention="sdpa")
    target = capture_forward(model, arch, tmp_path / "sdpa", mode)
    result, culprits = judged_in_shards(golden(arch, mode), target)
    d = result.first_divergence
    assert d is None, f"false alarm at {d.name} in {d.module} ({d.rule}): {d.reason}"
    assert culprits == []


#: new tokens generated in the decode noise pair: the prefill and two decode steps
NEW_TOKENS = 3


def capture_generate(model: torch.nn.Module, arch: str, path: Path, mode: str) -> Path:
    """Greedy ``generate`` on the KV cache of the left-padded batch, one step per forward."""
    batch = model_inputs(arch)
    batch.pop("position_ids", None)  # generate derives them from the mask
    with torch.no_grad(), capture(model, path, level="mix", mode=mode, step_per_forward=True):
        model.generate(
            **batch, max_new_tokens=NEW_TOKENS, do_sample=False, use_cache=True, pad_token_id=0
        )
    return path


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "arch",
    [
        pytest.param("gemma3", marks=pytest.mark.slow),
        pytest.param("gpt_neox", marks=pytest.mark.slow),
        pytest.param("falcon", marks=pytest.mark.slow),
        pytest.param("bloom", marks=pytest.mark.slow),
        "olmoe",  # its bf16 router flips a near tie at one real token: topk's indices move
    ],
)
def test_bf16_decode_against_fp32_names_no_culprit(arch: str, mode: str, tmp_path: Path) -> None:
    """A bf16 model against its fp32 golden through ``generate`` with a KV cache: the prefill
    and each decode step, whose cache holds the pad positions' keys and values."""
    golden = capture_generate(build(arch), arch, tmp_path / "fp32", mode)
    target = capture_generate(build(arch, torch.bfloat16), arch, tmp_path / "bf16", mode)
    result, culprits = judged_in_shards(golden, target)
    assert len({r.step for r in result.records}) == NEW_TOKENS
    d = result.first_divergence
    assert d is None, f"false alarm at {d.name} in {d.module} ({d.rule}), step {d.step}: {d.reason}"
    assert culprits == []
