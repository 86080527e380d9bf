"""The JSON of the fields capture writes in every record, encoded once and cached: a capture
writes one record per tensor of every call, so each field's encoding is on its hot path."""

from __future__ import annotations

import functools
import json
from typing import Any

import torch

from ..numerics._dtypes import dtype_name
from ._native import encode_value, json_members, json_text


@functools.lru_cache(maxsize=4096)
def json_slot(slot: str) -> str:
    return json_text(slot)


@functools.cache
def json_dtype(dtype: torch.dtype) -> str:
    return json_text(dtype_name(dtype))


@functools.lru_cache(maxsize=4096)
def json_shape(shape: torch.Size) -> str:
    return json_text(list(shape))


def json_value(value: Any) -> str:
    """``json_text(encode_value(value))``, without the encoder for the usual ints and None."""
    kind = type(value)
    if kind is int:
        return str(value)
    if value is None:
        return "null"
    return json_text(encode_value(value))


def changed_since_json(label: str) -> str:
    """The ``changed_since`` field of a record: the name, slot and step of the earlier record
    ``label`` (its members up to its slot: ``"name":"...",...,"slot":"output.0"``) that the
    tensor was expected to equal. Only a stomp pays for the decoding."""
    earlier = json.loads("{" + label + "}")
    return json_members({k: earlier[k] for k in ("name", "slot", "step")}).join("{}")
