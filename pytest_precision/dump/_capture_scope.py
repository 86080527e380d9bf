"""What a capture records besides the model's values: the calls its ``include`` / ``exclude``
patterns select, the rank it writes for, and the fused fast paths its op mode turns off (which
the user is warned about, as they may change the last bits of the outputs)."""

from __future__ import annotations

import fnmatch
import re
import warnings
from collections.abc import Iterable

import torch

from .._errors import PrecisionWarning


def compile_patterns(patterns: tuple[str, ...] | None) -> re.Pattern[str] | None:
    """One regular expression matching what any of the glob ``patterns`` matches."""
    if patterns is None:
        return None
    if not patterns:
        return re.compile("(?!)")  # matches nothing
    return re.compile("|".join(fnmatch.translate(p) for p in patterns))


#: Modules whose fused inference fast path is skipped while a torch-function mode is active.
_FAST_PATH_MODULES = (
    torch.nn.MultiheadAttention,
    torch.nn.TransformerEncoderLayer,
    torch.nn.TransformerEncoder,
)


def warn_about_fast_paths(model: torch.nn.Module) -> None:
    found = sorted({type(m).__name__ for m in model.modules() if isinstance(m, _FAST_PATH_MODULES)})
    if found:
        warnings.warn(
            PrecisionWarning(
                f"capture at the op level makes {', '.join(found)} skip its fused fast path: "
                "outputs may differ in the last bits from a run without capture (use "
                "level='module' for bitwise-identical outputs)"
            ),
            stacklevel=3,
        )


def as_patterns(patterns: Iterable[str] | str | None) -> tuple[str, ...] | None:
    if patterns is None:
        return None
    return (patterns,) if isinstance(patterns, str) else tuple(patterns)


def rank_and_world_size() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1
