"""The one-ULP tie: two tokens whose logits one rounding of the serving dtype cannot tell apart.

Ascend's msit accepts a flipped top token when the largest logit is within one unit in the last
place of the dtype: a bf16 logit of 20 rounds in steps of 0.125, so two logits 0.1 apart may be
stored equal, and which one wins is a coin toss of the accumulation order.
"""

from __future__ import annotations

import math
from typing import Any

from .._errors import PrecisionInputError


def ulp(value: float, dtype: Any) -> float:
    """The spacing of ``dtype``'s numbers at ``value`` (floored at its subnormal spacing)."""
    import torch

    info = torch.finfo(dtype)
    if not math.isfinite(value):
        return math.inf
    if value == 0.0 or abs(value) < info.tiny:
        return info.tiny * info.eps
    _, exponent = math.frexp(abs(value))  # |value| = m * 2 ** exponent, m in [0.5, 1)
    return info.eps * 2.0 ** (exponent - 1)


def float_dtype(dtype: Any, where: str) -> Any:
    """``dtype`` (a torch dtype or its name: "bfloat16", "torch.float16") as a floating torch
    dtype, refused in one line otherwise."""
    import torch

    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise PrecisionInputError(f"{where}: expected a floating torch dtype, got {dtype!r}")
    return dtype


def one_ulp_tie(golden: Any, target: Any, golden_token: int, target_token: int, dtype: Any) -> bool:
    """Each side's own token beats the other side's token by at most one ULP of ``dtype`` at
    its top logit (raw logits, 1-D over the vocabulary)."""
    sides = ((golden, golden_token, target_token), (target, target_token, golden_token))
    for logits, mine, theirs in sides:
        top = float(logits[mine])
        if not float(top - float(logits[theirs])) <= ulp(top, dtype):
            return False
    return True
