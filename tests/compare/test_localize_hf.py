"""compare_dumps on real HF transformers architectures (issue #10): planted bugs are convicted
at the planted module (or a module inside it), noise cases name no culprit.

The matrix: 11 tiny architectures (``hf_zoo``) x the bugs that apply to each (``hf_bugs``,
where the reasons for each exclusion are written down) x capture mode (tensor, statistics) x
level (mix, module), plus 4 noise cases per architecture, mode and level.

Speed: one golden dump per (architecture, mode, level), captured once per process into
``tmp_path_factory`` and read once (a module-scoped cache of loaded dumps); each case captures
only its target. Every test runs on one torch thread (two xdist workers on two cores do not
oversubscribe), so goldens and targets are the same whichever worker makes them and in whatever
order. The ``threads`` noise case captures its target on two.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from compare_helpers import judged_in_shards
from hf_bugs import BUGS, NOISE, applicable, threads
from hf_zoo import ARCHS, build, inputs

from pytest_precision import Divergence, Dump, DumpComparison, capture, compare_dumps, load_dump
from pytest_precision.report import render

MODES = ("tensor", "statistics")
LEVELS = ("mix", "module")

#: (arch, bug) pairs of the matrix, in a stable order
BUG_CASES = [(arch, bug) for arch in ARCHS for bug in applicable(ARCHS[arch])]


def capture_forward(
    model: torch.nn.Module, path: Path, mode: str, level: str, n_threads: int = 1
) -> Path:
    """One forward of the zoo's batch, captured at ``path`` on ``n_threads`` threads."""
    with threads(n_threads), torch.no_grad(), capture(model, path, level=level, mode=mode):
        model(**inputs(), use_cache=False)
    return path


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    with threads(1):
        yield


@pytest.fixture(scope="module")
def golden(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, str, str], Dump]:
    """The fp32 golden dump of an architecture per mode and level, made and read once per
    process (``compare_dumps`` takes a loaded ``Dump`` as well as a path)."""
    made: dict[tuple[str, str, str], Dump] = {}

    def get(arch: str, mode: str, level: str) -> Dump:
        key = (arch, mode, level)
        if key not in made:
            path = tmp_path_factory.mktemp(f"golden-{arch}-{mode}-{level}") / "dump"
            with threads(1):
                made[key] = load_dump(capture_forward(build(arch), path, mode, level))
        return made[key]

    return get


def localize_bug(
    golden_dump: Dump, arch: str, bug: str, mode: str, level: str, tmp: Path
) -> tuple[str, DumpComparison, list[Divergence]]:
    """Capture the target with ``bug`` planted and compare it with the golden in shards; the
    planted module's path, the comparison, and the calls convicted by their own records."""
    model = build(arch)
    planted = BUGS[bug].plant(model, ARCHS[arch])
    target = capture_forward(model, tmp / "target", mode, level)
    return planted, *judged_in_shards(golden_dump, target)


def compare_noise(
    golden_dump: Dump, arch: str, case: str, mode: str, level: str, tmp: Path
) -> tuple[DumpComparison, list[Divergence]]:
    """Capture the target of a noise case and compare it with the golden in shards."""
    if case == "self":
        return judged_in_shards(golden_dump, golden_dump)
    dtype, plant, n_threads = NOISE[case]
    model = build(arch, dtype)
    if plant is not None:
        plant(model, ARCHS[arch])
    target = capture_forward(model, tmp / "target", mode, level, n_threads or 1)
    return judged_in_shards(golden_dump, target)


def inside(module: str | None, planted: str) -> bool:
    """The culprit's module is the planted module or one inside it."""
    return module is not None and (module == planted or module.startswith(planted + "."))


@pytest.mark.slow
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("arch", "bug"), BUG_CASES)
def test_planted_bug_is_convicted_at_its_module(
    golden: Callable[[str, str, str], Dump],
    arch: str,
    bug: str,
    mode: str,
    level: str,
    tmp_path: Path,
) -> None:
    planted, result, culprits = localize_bug(
        golden(arch, mode, level), arch, bug, mode, level, tmp_path
    )
    d = result.first_divergence
    assert d is not None, f"{bug} planted in {planted}: no divergence\n{render(result)}"
    assert inside(d.module, planted), (
        f"{bug} planted in {planted}, convicted {d.name} in {d.module} ({d.cause}): {d.reason}"
    )
    assert (d.rank, d.step) == (0, 0)
    # the shards' tests convict on their own records only calls where the bug is
    for c in culprits:
        assert inside(c.module, planted), (
            f"{bug} in {planted}: shard convicts {c.name} ({c.reason})"
        )
    # a weight, constant or argument convicts on the culprit's own records, and with tensor
    # data a module with clean inputs on the records of its shard: that shard fails. Tensor
    # data always fails some shard (statistics may inherit drift from another shard's calls)
    if d.rule == "source" or (mode == "tensor" and d.rule == "module with clean inputs"):
        assert d.name in [c.name for c in culprits]
    if mode == "tensor":
        assert culprits, f"{bug} in {planted}: no shard fails ({d.name}, {d.rule})"


@pytest.mark.slow
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", list(NOISE))
@pytest.mark.parametrize("arch", list(ARCHS))
def test_noise_names_no_culprit(
    golden: Callable[[str, str, str], Dump],
    arch: str,
    case: str,
    mode: str,
    level: str,
    tmp_path: Path,
) -> None:
    result, culprits = compare_noise(golden(arch, mode, level), arch, case, mode, level, tmp_path)
    d = result.first_divergence
    assert d is None, f"{case}: false alarm at {d.name} in {d.module} ({d.cause}): {d.reason}"
    assert culprits == [], f"{case}: a shard convicts {culprits[0].name}: {culprits[0].reason}"
    if case in ("self", "threads", "extra_noop_op"):
        assert result.passed, render(result)


# -- dumps users bring: msprobe (fixtures/msprobe/make_dumps.py) -------------------------------

MSPROBE = Path(__file__).resolve().parents[2] / "fixtures" / "msprobe"


@pytest.mark.parametrize(
    "case",
    [
        "hf_llama_l1_statistics",
        "hf_llama_mix_statistics",
        "tp_golden_tensor",
        "tp_golden_statistics",
        "tp_rank1_scaled_tensor",
        "tp_rank1_scaled_statistics",
    ],
)
def test_an_msprobe_dump_against_itself_does_not_diverge(case: str) -> None:
    """The HF Llama's causal mask holds finfo(float32).min: msprobe's float32 statistics of it
    overflow (mean -inf, norm inf), the same on both sides."""
    result = compare_dumps(MSPROBE / case, MSPROBE / case)
    assert result.first_divergence is None, render(result)
    assert result.passed, render(result)


@pytest.mark.parametrize("task", ["tensor", "statistics"])
def test_a_rank_local_bug_before_a_collective_is_found_on_that_rank(task: str) -> None:
    """Rank 1 scales its partial sum before the all_reduce of a row-parallel MLP: rank 0's
    all_reduce output differs with clean inputs, but the error was added on rank 1."""
    result, culprits = judged_in_shards(
        MSPROBE / f"tp_golden_{task}", MSPROBE / f"tp_rank1_scaled_{task}"
    )
    d = result.first_divergence
    assert d is not None, render(result)
    assert (d.rank, d.step) == (1, 0), f"{d.name} on rank {d.rank} ({d.cause}): {d.reason}"
    # rank 0's all_reduce, whose own inputs match exactly, put out what it gathered from rank
    # 1: no fault of rank 0's shard (rank 1's comes from code only that run has: judged by
    # the walk across shards, no shard's own records prove it)
    assert culprits == [], [(c.name, c.rank) for c in culprits]
