"""Checklist: the first step of every localization, diffing the run against its baseline.

The guides start with a checklist: inference hyper-parameters and env vars, library versions,
the model config. :func:`diff_configs` and :func:`diff_environment` diff two of them and order
the differences by how often each kind causes a precision problem, so the likely culprit is the
first line. Both take nested or flat (dotted keys) mappings, so a golden's recorded environment
(flat) diffs against a fresh fingerprint (nested).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..runtime._environment import ChecklistDiff, diff_environment, diff_flat, flatten
from ._common import OutputCheckFailed

# (category, key pattern): earlier categories cause precision problems more often. Patterns
# match the last component of a dotted key, or the whole key for environment records.
CONFIG_ORDER: tuple[tuple[str, str], ...] = (
    ("special tokens and padding", r"(pad|eos|bos|decoder_start)_token_id|padding_side"),
    (
        "sampling",
        r"do_sample|temperature|top_[pk]|min_p|typical_p|repetition_penalty|num_beams|"
        r"length_penalty|no_repeat_ngram_size|seed",
    ),
    ("length limits", r"max_(new_tokens|length|position_embeddings|seq_len\w*)|min_\w*length"),
    ("dtype", r"(torch_)?dtype|\w*_dtype|quantization_config|load_in_\w+"),
    ("rotary embedding", r"rope\w*|rotary\w*|partial_rotary_factor|original_max\w*"),
    ("normalization epsilon", r"\w*(norm|layernorm)_eps\w*|layer_norm_epsilon|eps"),
    (
        "attention",
        r"_?attn_implementation|attention_\w+|sliding_window\w*|num_key_value_heads|head_dim|"
        r"use_cache|\w*softmax\w*|attn_\w+|logit\w*soft\w*cap\w*",
    ),
    ("weight tying", r"tie_word_embeddings|tie_\w+"),
    (
        "structure",
        r"hidden_size|intermediate_size|num_\w+|vocab_size|hidden_act|\w*bias|model_type|"
        r"architectures",
    ),
)
#: Keys that differ between any two saves of the same config.
CONFIG_IGNORE = ("transformers_version", "_name_or_path", "_commit_hash")


def diff_configs(a: Any, b: Any, *, ignore: Iterable[str] = CONFIG_IGNORE) -> ChecklistDiff:
    """The keys where config ``b`` (the target) differs from ``a`` (the baseline).

    Takes dicts, dataclasses, HF ``PretrainedConfig`` / ``GenerationConfig`` (anything with
    ``to_dict()``), nested or flat. Changes come ordered by category, most often guilty first:
    special token ids and padding, sampling, length limits, dtype and quantization, RoPE,
    norm epsilons, attention, weight tying, structure, then the rest. ``ignore`` drops keys
    (by full dotted key or last component); by default those that differ between any two saves.
    """
    return diff_flat("config", flatten(a), flatten(b), CONFIG_ORDER, ignore, whole=False)


class ChecklistDiffers(OutputCheckFailed):
    """:func:`assert_same_config` or :func:`assert_same_environment` failed; ``result`` is
    the :class:`ChecklistDiff`."""


def assert_same_config(a: Any, b: Any, *, ignore: Iterable[str] = CONFIG_IGNORE) -> ChecklistDiff:
    """Assert two configs are equal (see :func:`diff_configs`)."""
    __tracebackhide__ = True
    result = diff_configs(a, b, ignore=ignore)
    if result:
        raise ChecklistDiffers(diff_message(result), result)
    return result


def assert_same_environment(
    a: Mapping[str, Any], b: Mapping[str, Any] | None = None, *, ignore: Iterable[str] = ()
) -> ChecklistDiff:
    """Assert two environments agree (see :func:`diff_environment`)."""
    __tracebackhide__ = True
    result = diff_environment(a, b, ignore=ignore)
    if result:
        raise ChecklistDiffers(diff_message(result), result)
    return result


def diff_message(result: ChecklistDiff) -> str:
    """The assert form's message: one line per change, most likely culprit first."""
    lines = [f"{len(result.changes)} {result.what} difference(s), most likely culprit first:"]
    lines += [
        f"  [{c.category}] {c.key}: {c.golden!r} (golden) vs {c.target!r} (target)"
        for c in result.changes
    ]
    return "\n".join(lines)
