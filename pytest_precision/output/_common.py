"""What every output-level check shares: the failure type and turning ids into plain lists.

Nothing here imports torch at module level: ids arrive as lists just as often as tensors.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .._errors import PrecisionInputError


class OutputCheckFailed(AssertionError):
    """An output-level assert form failed; ``result`` holds the data the message was built from."""

    def __init__(self, message: str, result: Any) -> None:
        super().__init__(message)
        self.result = result


def as_int_list(value: Any, where: str) -> list[int]:
    """One sequence of token ids (list, tuple, 1-D tensor or array) as a list of ints."""
    if hasattr(value, "tolist") and not isinstance(value, (list, tuple)):
        value = value.tolist()
    if isinstance(value, numbers.Integral) or not isinstance(value, Sequence):
        raise PrecisionInputError(f"{where}: expected a sequence of token ids, got {value!r}"[:200])
    out = []
    for i, item in enumerate(value):
        if isinstance(item, bool) or not isinstance(item, numbers.Integral):
            raise PrecisionInputError(f"{where}[{i}]: token ids are integers, got {item!r}"[:200])
        out.append(int(item))
    return out


def as_rows(value: Any, where: str) -> tuple[list[list[int]], bool]:
    """Token ids of one sequence or a batch (rows may differ in length) as lists of ints, and
    whether it was a batch."""
    if hasattr(value, "tolist") and not isinstance(value, (list, tuple)):
        if getattr(value, "ndim", 1) > 2:
            raise PrecisionInputError(f"{where}: token ids have {value.ndim} dimensions (1 or 2)")
        value = value.tolist()
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise PrecisionInputError(f"{where}: expected token ids, got {type(value).__name__}")
    if value and all(not isinstance(item, numbers.Integral) for item in value):
        return [as_int_list(row, f"{where}[{i}]") for i, row in enumerate(value)], True
    return [as_int_list(value, where)], False


Decoder = Callable[[list[int]], str]


def decoder(decode: Any) -> Decoder | None:
    """A tokenizer (anything with ``.decode``) or a callable, as ``ids -> text``."""
    if decode is None:
        return None
    method = getattr(decode, "decode", None)
    if callable(method):
        return lambda ids: str(method(ids))
    if callable(decode):
        return lambda ids: str(decode(ids))
    raise PrecisionInputError(
        f"decode: expected a tokenizer or a callable ids -> text, got {type(decode).__name__}"
    )


def read_text(path: Path) -> str:
    """A results or token file's text; unreadable files are refused in one line naming them."""
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PrecisionInputError(f"{path}: cannot be read: {exc}") from None
