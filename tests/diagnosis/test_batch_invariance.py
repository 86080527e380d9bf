"""Batch invariance on real tiny HF models: a clean model is invariant or noise, never a
culprit; a row leak, statistics shared across rows and a padding mask dropped are bugs at
their module."""

from __future__ import annotations

import pytest
import torch
from batch_bugs import BUGS
from hf_zoo import ARCHS, build

from pytest_precision.diagnosis._batch import (
    BatchVariant,
    assert_batch_invariant,
    check_batch_invariance,
)

#: three prompts of different lengths: prompt 0 sits padded between longer and shorter ones
PROMPTS = [[5, 17, 99, 42, 7, 64], [9, 3, 120, 33, 81, 12, 50, 77], [101, 8, 36, 27, 4]]


def _within(module: str | None, path: str) -> bool:
    return module is not None and (module == path or module.startswith(path + "."))


@pytest.mark.parametrize("arch", ["llama", "gpt2", "mixtral"])
def test_clean_model_is_invariant_or_noise(arch: str) -> None:
    result = check_batch_invariance(build(arch), PROMPTS, batch_sizes=(3,), needles=[0])
    (case,) = result.cases
    assert case.verdict in ("invariant", "noise"), case.divergence
    assert case.divergence is None
    assert (case.batch_size, case.row, case.padding) == (3, 1, 2)
    if case.verdict == "noise":  # the kernel whose reduction follows the batch is named
        assert case.first_variant is not None


@pytest.mark.parametrize("bug", sorted(BUGS))
@pytest.mark.parametrize("arch", ["llama", "gpt2", "mixtral"])
def test_planted_batch_bug_is_a_bug_at_its_module(arch: str, bug: str) -> None:
    model = build(arch)
    planted = BUGS[bug](model, ARCHS[arch])
    result = check_batch_invariance(model, PROMPTS, batch_sizes=(3,), needles=[0])
    assert result.verdict == "bug"
    case = result.first_bug
    assert case is not None
    assert case.divergence is not None
    assert _within(case.divergence.module, planted), case.divergence


def test_moe_dispatch_is_judged_as_a_module() -> None:
    """An MoE block gathers tokens per expert: those calls have no row of the prompt, so the
    experts module is judged by what enters and leaves it."""
    result = check_batch_invariance(build("mixtral"), PROMPTS, batch_sizes=(2,), needles=[2])
    assert "model.layers.1.mlp.experts" in result.cases[0].opaque


class _Elementwise(torch.nn.Module):
    """Nothing reduces across tokens or rows: bitwise the same in any batch."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(128, 8)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, use_cache: bool = False
    ) -> torch.Tensor:
        return torch.tanh(self.embed(input_ids)) * attention_mask[..., None]


def test_elementwise_model_is_invariant() -> None:
    torch.manual_seed(0)
    result = check_batch_invariance(_Elementwise(), PROMPTS, batch_sizes=(2, 3))
    assert result.verdict == "invariant"
    assert len(result.cases) == 6
    assert all(case.first_variant is None for case in result.cases)


def test_assert_form_raises_on_a_bug_and_names_the_module() -> None:
    model = build("llama")
    BUGS["row_leak"](model, ARCHS["llama"])
    with pytest.raises(BatchVariant, match=r"bug at model\.layers\.1\.mlp") as info:
        assert_batch_invariant(model, PROMPTS, batch_sizes=(3,), needles=[0])
    assert info.value.result.verdict == "bug"


def test_assert_form_passes_noise_unless_bitwise_is_asked() -> None:
    model = build("llama")
    assert_batch_invariant(model, PROMPTS, batch_sizes=(3,), needles=[0])
    with pytest.raises(BatchVariant, match="noise"):
        assert_batch_invariant(model, PROMPTS, batch_sizes=(3,), needles=[0], allow_noise=False)


def test_right_padding_and_kept_dumps(tmp_path) -> None:
    lines: list[str] = []
    result = check_batch_invariance(
        build("llama"),
        PROMPTS,
        batch_sizes=(2,),
        needles=[0],
        padding_side="right",
        out=tmp_path / "dumps",
        progress=lines.append,
    )
    assert result.verdict in ("invariant", "noise")
    assert sorted(p.name for p in (tmp_path / "dumps").iterdir()) == ["p0", "p0-b2"]
    assert len(lines) == 1
    assert lines[0].startswith("prompt 0 as row 0 of 2")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"batch_sizes": (1,)}, "batch_sizes"),
        ({"batch_sizes": ()}, "batch_sizes"),
        ({"needles": [3]}, "needles"),
    ],
)
def test_bad_options_are_named(options: dict[str, object], message: str) -> None:
    from pytest_precision import PrecisionError

    with pytest.raises(PrecisionError, match=message):
        check_batch_invariance(_Elementwise(), PROMPTS, **options)  # type: ignore[arg-type]


def test_one_prompt_or_an_empty_prompt_is_refused() -> None:
    from pytest_precision import PrecisionError

    with pytest.raises(PrecisionError, match="at least two prompts"):
        check_batch_invariance(_Elementwise(), PROMPTS[:1])
    with pytest.raises(PrecisionError, match="at least one token"):
        check_batch_invariance(_Elementwise(), [[], [1, 2]])
