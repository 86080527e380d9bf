"""diagnose on families of ``tests/hf_zoo_more.py`` the other diagnose tests do not use, on
their own cached generation path: a parallel attention + MLP block with grouped keys (Falcon)
and ALiBi (Bloom) with a bug of ``tests/hf_bugs_more.py``, the culprit inside the module where
forward hooks measured the bug; OLMo-2 (q/k norms, post-norms) and Granite (scaled residuals)
with the KV-cache bugs of ``decode_bugs.py``, found at the decode step and layer."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).parent.parent))  # tests/: hf_zoo_more, hf_bugs_more

from decode_bugs import DECODE_BUGS  # noqa: E402
from hf_bugs_more import BUGS, inside, truth  # noqa: E402
from hf_zoo_more import ARCHS, build, model_inputs  # noqa: E402

from pytest_precision import Diagnosis  # noqa: E402
from pytest_precision.diagnosis._workflow import diagnose  # noqa: E402

#: (arch, bug, what the generation shows, measured): Falcon's wrong epsilon moves the logits
#: and flips no token in 6 steps; Bloom's reversed slopes flip row 1's first token
CASES = [("falcon", "norm_eps", "logprobs"), ("bloom", "alibi_slopes", "tokens")]


def _diagnosed(arch: str, golden: torch.nn.Module, target: torch.nn.Module, out: Path) -> Diagnosis:
    """``diagnose`` on the zoo's batch (its padded row included), 6 tokens, replay on CPU."""
    batch = model_inputs(arch)
    return diagnose(
        golden,
        target,
        batch["input_ids"],
        attention_mask=batch["attention_mask"],
        max_new_tokens=6,
        out=out,
        devices=["cpu"],
    )


@pytest.mark.parametrize(("arch", "bug", "finding"), CASES)
def test_a_planted_bug_is_diagnosed_in_its_module(
    arch: str, bug: str, finding: str, tmp_path: Path
) -> None:
    where = truth(arch, BUGS[bug].plant)
    assert where is not None
    golden, target = build(arch), build(arch)
    BUGS[bug].plant(target, ARCHS[arch])
    d = _diagnosed(arch, golden, target, tmp_path)
    assert d.cached
    assert d.finding == finding, d.summary()
    assert d.step == 0  # the prefill: a token flip at position 0, or the logits localized there
    assert d.divergence is not None, d.summary()
    assert inside(d.divergence.module, where), d.summary()


#: (arch, KV-cache bug of decode_bugs, the decode step it is found at, measured): the prefill
#: is exact; the keys rounded to bf16 are first read by step 1, layer 1's unwritten slot by
#: step 2 (the first token it changes is row 1's position 2 on OLMo-2)
CACHE_CASES = [
    ("olmo2", "keys stored in bf16", 1),
    ("olmo2", "cache slot not written", 2),
    ("granite", "cache slot not written", 2),
]


@pytest.mark.parametrize(("arch", "bug", "step"), CACHE_CASES)
def test_a_kv_cache_bug_is_diagnosed_at_its_step_and_layer(
    arch: str, bug: str, step: int, tmp_path: Path
) -> None:
    golden, target = build(arch), build(arch)
    layer = DECODE_BUGS[bug](target)
    d = _diagnosed(arch, golden, target, tmp_path)
    assert d.cached
    assert d.step == step, d.summary()
    assert d.divergence is not None, d.summary()
    assert (d.divergence.layer, d.divergence.step) == (layer, step), d.summary()


def test_a_bug_behind_another_attention_is_diagnosed_past_the_padding(tmp_path: Path) -> None:
    """An SDPA target against an eager golden puts out other values at the padded row's pad
    positions from layer 0 on (a softmax over no key is undefined): not evidence, so the
    wrong epsilon in layer 1 is the culprit, not SDPA's attention in layer 0."""
    where = truth("falcon", BUGS["norm_eps"].plant)
    assert where is not None
    target = build("falcon", attention="sdpa")
    BUGS["norm_eps"].plant(target, ARCHS["falcon"])
    d = _diagnosed("falcon", build("falcon"), target, tmp_path)
    assert d.divergence is not None, d.summary()
    assert inside(d.divergence.module, where), d.summary()
    assert d.comparison is not None
    assert d.comparison.padding is not None
    assert (d.comparison.padding.positions, d.comparison.padding.of) == (3, 16)
