"""Token acceptance: msit's logits rule, our near tie and the bare one-ULP tie, on the same runs.

Each run is one teacher-forced forward of an 8 x 16 batch (rows 4-7 left-padded by 4, with
their attention mask and position ids) through a tiny random-init model of ``tests/hf_zoo.py``;
every real (unpadded) position is one token decision, judged against the fp32 golden's logits
by ``compare_logits`` under each rule:

- ``honest``: the golden rerun on one thread (fp32), and the same checkpoint served in bf16;
- ``bug``: a planted bug of ``tests/hf_bugs.py`` in the bf16 port (structural bugs), or in an
  fp32 copy (the two dtype slips: a norm computed in bf16, an o_proj rounded to bf16).

It prints, per model and case, the share of positions each rule accepts, then the totals: a
good rule accepts every honest position and few buggy ones; ``caught`` is the share of buggy
runs where at least one position fails (what ``assert_logits_close`` would report).

    python benchmarks/acceptance_rules.py [--archs llama,qwen2,gpt2,mixtral]
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from hf_bugs import BUGS, applicable, threads
from hf_zoo import ARCHS, VOCAB, build

from pytest_precision import compare_logits
from pytest_precision.output._logits import RULES

#: bugs that round to bf16 inside an fp32 model: planted in an fp32 copy (a no-op in bf16)
DTYPE_SLIPS = ("norm_in_bf16", "projection_bf16")
ROWS, SEQ, PAD = 8, 16, 4


def batch() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(2024)
    ids = torch.randint(3, VOCAB, (ROWS, SEQ), generator=generator)
    mask = torch.ones(ROWS, SEQ, dtype=torch.long)
    ids[ROWS // 2 :, :PAD] = 0
    mask[ROWS // 2 :, :PAD] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": ids, "attention_mask": mask, "position_ids": positions}


@torch.no_grad()
def logits(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """The logits at the real positions, ``(positions, vocab)`` (float32 for any dtype)."""
    out = model(**inputs, use_cache=False).logits.float()
    return out[inputs["attention_mask"].bool()]


def rates(golden: torch.Tensor, target: torch.Tensor, ulp_dtype: torch.dtype) -> list[float]:
    return [
        compare_logits(golden, target, rule=rule, ulp_dtype=ulp_dtype).acceptance_rate
        for rule in RULES
    ]


def runs(arch: str, inputs: dict[str, torch.Tensor]) -> list[tuple[str, str, list[float]]]:
    golden_model = build(arch)
    golden = logits(golden_model, inputs)
    out = []
    with threads(1):
        rerun = logits(golden_model, inputs)
    out.append(("honest", "fp32, 1 thread", rates(golden, rerun, torch.float32)))
    port = build(arch, torch.bfloat16)
    out.append(("honest", "bf16 port", rates(golden, logits(port, inputs), torch.bfloat16)))
    for name in applicable(ARCHS[arch]):
        slip = name in DTYPE_SLIPS
        target = build(arch) if slip else copy.deepcopy(port)
        BUGS[name].plant(target, ARCHS[arch])
        dtype = torch.float32 if slip else torch.bfloat16
        label = f"{name} ({'fp32' if slip else 'bf16 port'})"
        out.append(("bug", label, rates(golden, logits(target, inputs), dtype)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archs", default="llama,qwen2,gpt2,mixtral")
    args = parser.parse_args()
    torch.set_num_threads(2)
    inputs = batch()
    header = f"{'model':<9} {'case':<34} " + " ".join(f"{r:>8}" for r in RULES)
    print(header)
    totals: dict[str, list[list[float]]] = {"honest": [], "bug": []}
    for arch in args.archs.split(","):
        for kind, label, rate in runs(arch, inputs):
            totals[kind].append(rate)
            print(f"{arch:<9} {label:<34} " + " ".join(f"{100 * r:7.1f}%" for r in rate))
    print()
    for kind, rows in totals.items():
        mean = [sum(col) / len(col) for col in zip(*rows, strict=True)]
        label = f"{kind} ({len(rows)} runs), accepted"
        print(f"{'all':<9} {label:<34} " + " ".join(f"{100 * r:7.1f}%" for r in mean))
    caught = [sum(r < 1.0 for r in col) / len(col) for col in zip(*totals["bug"], strict=True)]
    print(f"{'all':<9} {'bug runs caught':<34} " + " ".join(f"{100 * r:7.1f}%" for r in caught))
    flagged = [sum(r < 1.0 for r in col) for col in zip(*totals["honest"], strict=True)]
    print(f"{'all':<9} {'honest runs flagged (count)':<34} " + " ".join(f"{n:8d}" for n in flagged))


if __name__ == "__main__":
    main()
