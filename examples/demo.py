"""The worked example: is this difference noise or a bug?

A causal attention block runs in bfloat16 on two "devices" that round in a different order
(the golden run scales the scores, the target run scales q first, as fused kernels do). Their
outputs differ by a few bf16 ULPs: harmless noise. Then the target gets a real bug (softmax
scale 1/d instead of 1/sqrt(d)) and, separately, one corrupted element (a broken kernel lane).

The plain ratio standard judges one rounding and cannot tell a few ULPs of accumulated noise
from a bug; the reference standard can: it measures both runs against a float64 computation
and accepts the target when its error is at most k times the golden run's own error.

Part two localizes: a tiny Llama-style decoder is captured op by op, as the golden (float32),
as a bfloat16 target (noise everywhere, no culprit) and as a target with one corrupted weight
element in layer 1; ``compare_dumps`` names the first guilty call, its module and its layer.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import torch

from examples.tiny_llama import build_tiny_llama, example_input_ids
from pytest_precision import assert_close, capture, compare_dumps, compare_tensors
from pytest_precision.report import render


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, fused: bool) -> torch.Tensor:
    scale = 1 / math.sqrt(q.shape[-1])
    scores = (q * scale) @ k.transpose(-1, -2) if fused else (q @ k.transpose(-1, -2)) * scale
    mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def attention_scale_bug(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return attention(q * (1 / math.sqrt(q.shape[-1])), k, v, fused=True)  # scales twice: 1/d


def main() -> None:
    judge()
    localize()


def judge() -> None:
    """Each target judged first by the reference standard (the question that fits many bf16
    ops), then, for contrast, by the one-rounding ratio standard."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(4, 64, 32, generator=gen).bfloat16() for _ in range(3))
    reference = attention(q.double(), k.double(), v.double(), fused=False)
    golden = attention(q, k, v, fused=False)

    corrupted = attention(q, k, v, fused=True)
    corrupted[2, 17, 5] += 1.0
    cases = {
        "target run (rounding noise)": attention(q, k, v, fused=True),
        "target with a softmax scale bug": attention_scale_bug(q, k, v),
        "target with one corrupted element": corrupted,
    }
    for title, out in cases.items():
        print(f"== {title}")
        try:
            result = assert_close(
                out, golden, reference=reference, standard="reference", name="attn_out"
            )
            print(f"   reference standard: PASS  {result.items[0].comparison.reason}")
        except AssertionError as failure:
            print("   reference standard: FAIL, report:")
            print("\n".join("     " + line for line in str(failure).splitlines()))
        ratio = compare_tensors(out, golden)
        print(f"   ratio standard:     {ratio.verdict.upper():4}  cosine {ratio.cosine:.6f}")
        if ratio.verdict != "pass" and "noise" in title:
            print(
                "     (the ratio standard allows one bf16 rounding per element; attention is "
                "many\n      bf16 ops, so even a correct kernel drifts further: the reference "
                "standard\n      above, which measures both runs against float64, is the "
                "question to ask here)"
            )
        print()


def localize() -> None:
    ids = example_input_ids(seq=8)
    corrupted = build_tiny_llama()
    with torch.no_grad():
        corrupted.model.layers[1].mlp.down_proj.weight[3, 5] += 1.0
    models = {
        "golden": build_tiny_llama(),
        "bf16": build_tiny_llama(dtype=torch.bfloat16),
        "corrupted weight": corrupted,
    }
    with tempfile.TemporaryDirectory() as folder:
        dumps = {}
        for name, model in models.items():
            dumps[name] = Path(folder, name.replace(" ", "-"))
            with torch.no_grad(), capture(model, dumps[name], level="mix", mode="tensor"):
                model(ids)
        for name in ("bf16", "corrupted weight"):
            print(f"== where did it start? golden float32 vs {name} (compare_dumps)")
            report = render(compare_dumps(dumps["golden"], dumps[name]), worst=0)
            print("\n".join("   " + line for line in report.splitlines()[2:]))
            print()


if __name__ == "__main__":
    main()
