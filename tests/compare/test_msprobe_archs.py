"""Real msprobe dumps of architectures the rest of the suite does not build (GPT-NeoX, Falcon,
BLOOM, Phi, StarCoder2, Gemma3), made by msprobe 26.2 itself: ``fixtures/msprobe/
make_arch_dumps.py`` says how, ``archs/bug_modules.json`` where each planted bug is.

msprobe records about fourteen kinds of call and only the outermost of a nest: a slice of
``q_proj``'s output reaches the rotary ``mul`` with no recorded producer. Gemma3 computes its
rotary embeddings in ``set(layer_types)`` order, which another hash seed reverses.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from pytest_precision import compare_dumps, load_dump, render

ARCHS = Path(__file__).resolve().parents[2] / "fixtures" / "msprobe" / "archs"
BUG_MODULES: dict[str, dict[str, str]] = json.loads((ARCHS / "bug_modules.json").read_text())

#: (level, task) of every architecture's dumps; mix tensor only where it was made (GPT-NeoX,
#: BLOOM)
DUMPS = ("mix_statistics", "L1_statistics", "mix_tensor")


def _cases(variants: tuple[str, ...]) -> list[object]:
    out: list[object] = []
    for arch in sorted(BUG_MODULES):
        for variant in variants:
            for dump in DUMPS:
                if not (ARCHS / arch / f"{variant}_{dump}").exists():
                    continue
                marks = [pytest.mark.slow] if dump == "mix_tensor" and variant != "bf16" else []
                out.append(
                    pytest.param(arch, variant, dump, id=f"{arch}-{variant}-{dump}", marks=marks)
                )
    return out


@cache
def _calls_in(arch: str, variant: str, module: str) -> frozenset[str]:
    """The names of the calls inside ``module``, from the mix-level dump of the same run: an
    L1 dump records no module, but names its calls the same way."""
    mix = load_dump(ARCHS / arch / f"{variant}_mix_statistics")
    return frozenset(c.name for c in mix.calls if c.module and _within(c.module, module))


def _within(module: str, path: str) -> bool:
    return module == path or module.startswith(path + ".")


BUGS = ("weight", "rope", "gelu", "mask", "bf16_weight")


@pytest.mark.parametrize(("arch", "variant", "dump"), _cases(BUGS))
def test_a_planted_bug_is_found_at_its_module(arch: str, variant: str, dump: str) -> None:
    """Also a wrong weight in the bf16 model (Gemma3's rotary calls in the other order too):
    the inputs that inherit bf16 drift from outputs made of them never excuse it."""
    result = compare_dumps(ARCHS / arch / f"clean_{dump}", ARCHS / arch / f"{variant}_{dump}")
    d = result.first_divergence
    assert d is not None, render(result)
    module = BUG_MODULES[arch][variant]
    where = f"{d.name} [{d.module}] ({d.rule}): {d.reason}"
    if dump.startswith("L1"):
        assert d.name in _calls_in(arch, variant, module), where
    else:
        assert d.module is not None, where
        assert _within(d.module, module), where


@pytest.mark.parametrize(("arch", "variant", "dump"), _cases(("clean_hash", "bf16")))
def test_the_clean_model_again_or_in_bf16_names_no_culprit(
    arch: str, variant: str, dump: str
) -> None:
    """Another process with another hash seed (bit-equal logits, Gemma3's rotary calls in the
    other order), and the whole model in bfloat16 against float32."""
    result = compare_dumps(ARCHS / arch / f"clean_{dump}", ARCHS / arch / f"{variant}_{dump}")
    d = result.first_divergence
    assert d is None, render(result)


@pytest.mark.parametrize("dump", ["mix_statistics", "L1_statistics"])
def test_rotary_embeddings_in_set_order_are_paired_by_content(dump: str) -> None:
    """Gemma3's two rotary embeddings (sliding base 10000, full base 1e6) come in the other
    order under another hash seed: every record is bit-equal once they are paired by
    content, and the report says so once."""
    result = compare_dumps(
        ARCHS / "gemma3" / f"clean_{dump}", ARCHS / "gemma3" / f"clean_hash_{dump}"
    )
    assert result.passed, render(result)
    assert result.counts()["fail"] == 0, render(result)
    moved = {(p.golden, p.target) for p in result.permuted}
    assert ("Tensor.cos.0.forward", "Tensor.cos.1.forward") in moved
    assert ("Tensor.cos.1.forward", "Tensor.cos.0.forward") in moved
    assert "reordered: " in render(result)


def test_a_slice_of_a_recorded_output_inherits_its_error() -> None:
    """GPT-NeoX rotates a quarter of each head: ``q_proj``'s output, viewed and sliced by calls
    msprobe does not record, reaches the rotary ``mul`` with no recorded producer. In bf16
    against fp32 it differs, but as much as the output it is part of: no source."""
    result = compare_dumps(
        ARCHS / "gpt_neox" / "clean_mix_tensor", ARCHS / "gpt_neox" / "bf16_mix_tensor"
    )
    assert result.first_divergence is None, render(result)
    assert any(d.derived.startswith("part of Functional.linear") for d in result.derived)
    assert "derived: " in render(result)


@pytest.mark.parametrize("arch", ["gpt_neox", "phi"])
@pytest.mark.parametrize("dump", ["mix_statistics", "L1_statistics"])
def test_a_wrong_weight_below_bf16_tolerance_is_no_cast(arch: str, dump: str) -> None:
    """+0.5 on one of 2048 weight elements moves that weight's statistics by 0.003, under
    bf16's tolerance (0.0078), but its mean beyond what rounding each element once can."""
    result = compare_dumps(ARCHS / arch / f"clean_{dump}", ARCHS / arch / f"bf16_weight_{dump}")
    d = result.first_divergence
    assert d is not None, render(result)
    assert d.rule == "source", render(result)
    assert "no rounding of the golden's float32" in d.reason, d.reason


@pytest.mark.parametrize("arch", ["bloom", "phi"])
def test_an_activation_only_one_run_calls_is_judged_by_what_leaves_it(arch: str) -> None:
    """At L1 no module is recorded: the exact GELU the target calls where the golden spells
    the tanh formula out in recorded ``mul`` / ``tanh`` / ``add`` calls read exactly the
    golden's values, and what it put out (the down projection's input) differs beyond
    reordered rounding."""
    dumps = ARCHS / arch
    result = compare_dumps(dumps / "clean_L1_statistics", dumps / "gelu_L1_statistics")
    d = result.first_divergence
    assert d is not None, render(result)
    assert d.rule == "code only one run has", render(result)
    assert "Functional.gelu.0.forward read exactly the golden's values" in d.reason, d.reason
