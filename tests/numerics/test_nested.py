"""flatten: the (path, leaf) pairs used to name the item of a nested output that differs."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from pytest_precision.numerics._nested import flatten


@dataclass
class Step:
    hidden: Any
    extras: list[Any] = field(default_factory=list)


class ModelOutputLike(OrderedDict):
    """Like HF's ModelOutput: a mapping of its set fields, which is also a dataclass there."""


def test_a_bare_leaf_has_the_empty_path() -> None:
    t = torch.zeros(2)
    assert flatten(t) == [("", t)]
    assert flatten(None) == [("", None)]
    assert flatten("text") == [("", "text")]


def test_sequences_mappings_and_dataclasses_give_indexing_paths() -> None:
    a, b, c = torch.zeros(1), np.ones(2), torch.ones(3)
    value = {"logits": a, "past_key_values": ((a, b), (c, a)), 3: [Step(b, [1.5])]}
    assert [(path, leaf) for path, leaf in flatten(value)] == [
        ("['logits']", a),
        ("['past_key_values'][0][0]", a),
        ("['past_key_values'][0][1]", b),
        ("['past_key_values'][1][0]", c),
        ("['past_key_values'][1][1]", a),
        ("[3][0].hidden", b),
        ("[3][0].extras[0]", 1.5),
    ]


def test_a_model_output_mapping_is_walked_by_key() -> None:
    out = ModelOutputLike(logits=torch.zeros(1), hidden_states=(torch.ones(1),))
    assert [path for path, _ in flatten(out)] == ["['logits']", "['hidden_states'][0]"]


def test_dataclass_types_and_empty_containers_are_handled() -> None:
    assert flatten(Step) == [("", Step)]
    assert flatten(([], {})) == []


leaves = st.integers() | st.none() | st.text(max_size=3)
structures = st.recursive(
    leaves,
    lambda children: (
        st.lists(children, max_size=3)
        | st.lists(children, max_size=3).map(tuple)
        | st.dictionaries(st.text(max_size=3) | st.integers(), children, max_size=3)
    ),
    max_leaves=12,
)


@given(structures)
def test_every_path_indexes_back_to_its_leaf(value: Any) -> None:
    for path, leaf in flatten(value):
        assert eval(f"value{path}", {"value": value}) is leaf  # the path is real Python indexing


def test_an_hf_kv_cache_is_walked_into_its_layers_keys_and_values() -> None:
    transformers = pytest.importorskip("transformers")
    cache = transformers.DynamicCache()
    keys, values = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4)
    cache.update(keys, values, layer_idx=0)
    leaves = dict(flatten({"past_key_values": cache}))
    assert leaves["['past_key_values'].layers[0].keys"] is not None
    assert torch.equal(leaves["['past_key_values'].layers[0].keys"], keys)
    assert torch.equal(leaves["['past_key_values'].layers[0].values"], values)
