"""Reading token ids from files, for ``pytest-precision tokens``.

Formats: ``.json`` holds a list of ids (one sequence), a list of lists (a batch) or an object
with ``ids``; ``.jsonl`` one row per line (a list, or an object with ``ids`` / ``output_ids`` /
``token_ids``); any other file one row per line, ids separated by spaces or commas.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._errors import PrecisionInputError
from ._common import as_int_list, as_rows, read_text

_ID_KEYS = ("ids", "output_ids", "token_ids", "sequences")


def _ids_of(value: Any, where: str) -> Any:
    if isinstance(value, Mapping):
        for key in _ID_KEYS:
            if key in value:
                return value[key]
        raise PrecisionInputError(f"{where}: no {' / '.join(_ID_KEYS)} field")
    return value


def read_token_rows(path: str | os.PathLike[str]) -> list[int] | list[list[int]]:
    """The ids in ``path``: one sequence (a JSON list of ints) or rows."""
    path = Path(path)
    text = read_text(path)
    try:
        if path.suffix == ".json":
            rows, batched = as_rows(_ids_of(json.loads(text), str(path)), str(path))
            return rows if batched else rows[0]
        lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
        if path.suffix == ".jsonl":
            return [
                as_int_list(_ids_of(json.loads(line), f"{path}:{n}"), f"{path}:{n}")
                for n, line in lines
            ]
        rows = []
        for n, line in lines:
            try:
                rows.append([int(item) for item in line.replace(",", " ").split()])
            except ValueError:
                raise PrecisionInputError(f"{path}:{n}: not a line of integer ids") from None
        return rows
    except json.JSONDecodeError as exc:
        raise PrecisionInputError(f"{path}: malformed JSON: {exc}") from None
