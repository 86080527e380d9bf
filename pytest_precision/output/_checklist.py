"""Checklist: the first step of every localization, diffing the run against its baseline.

The guides start with a checklist: inference hyper-parameters and env vars, library versions,
the model config. :func:`diff_configs` and :func:`diff_environment` diff two of them and order
the differences by how often each kind causes a precision problem, so the likely culprit is the
first line. Both take nested or flat (dotted keys) mappings, so a golden's recorded environment
(flat) diffs against a fresh fingerprint (nested).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .._errors import PrecisionInputError
from ..runtime._devices import environment_fingerprint
from ._common import OutputCheckFailed


@dataclass(frozen=True)
class Change:
    """One differing key; a side that lacks the key holds None and ``only`` names the side."""

    key: str
    golden: Any
    target: Any
    category: str
    rank: int

    @property
    def only(self) -> str | None:
        if self.golden is None and self.target is not None:
            return "target"
        if self.target is None and self.golden is not None:
            return "golden"
        return None


@dataclass(frozen=True)
class ChecklistDiff:
    """The changes between two configs or environments, most likely culprit first."""

    what: str
    changes: tuple[Change, ...]

    @property
    def passed(self) -> bool:
        return not self.changes

    def __bool__(self) -> bool:
        return bool(self.changes)


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

#: Environment variables that change numerics or determinism (beyond the device backends' own).
PRECISION_ENV = (
    # CPU: threads change reduction order; oneDNN / MKL may pick other kernels or fp math
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "MKL_CBWR",
    "ONEDNN_DEFAULT_FPMATH_MODE",
    "DNNL_DEFAULT_FPMATH_MODE",
    "ATEN_CPU_CAPABILITY",
    "KMP_DETERMINISTIC_REDUCTION",
    # CUDA
    "CUBLAS_WORKSPACE_CONFIG",
    "NVIDIA_TF32_OVERRIDE",
    "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
    "CUDA_LAUNCH_BLOCKING",
    "CUDA_VISIBLE_DEVICES",
    "NCCL_ALGO",
    "NCCL_PROTO",
    # Ascend
    "HCCL_DETERMINISTIC",
    "LCCL_DETERMINISTIC",
    "CLOSE_MATMUL_K_SHIFT",
    "ATB_LLM_LCOC_ENABLE",
    "ATB_MATMUL_SHUFFLE_K_ENABLE",
    "ASCEND_LAUNCH_BLOCKING",
    "INF_NAN_MODE_ENABLE",
    "ASCEND_RT_VISIBLE_DEVICES",
    # serving
    "VLLM_ATTENTION_BACKEND",
    "VLLM_USE_V1",
)
#: Libraries whose version changes kernels or model code.
PRECISION_LIBRARIES = (
    "torch",
    "torch_npu",
    "transformers",
    "vllm",
    "vllm_ascend",
    "flash_attn",
    "xformers",
    "triton",
    "accelerate",
    "mindspore",
    "mindformers",
    "numpy",
)
#: CPU feature flags that decide which kernels (and so which rounding) a CPU runs.
CPU_FLAGS = re.compile(r"avx\w*|amx\w*|fma\w*|f16c|sse4_2|asimd\w*|sve\w*|bf16|fp16\w*|i8mm")

ENVIRONMENT_ORDER: tuple[tuple[str, str], ...] = (
    (
        "library versions",
        r"(libraries\.\w+|torch|numpy|python|(devices\.\w+\.)?versions\.\w+)",
    ),
    ("device", r"devices\.\w+\.(available|device_name)|device|machine|cpu\.(model|capability)"),
    ("matmul precision", r"precision\.\w+"),
    ("determinism", r"determinism\.\w+|seed"),
    ("environment variables", r"env\.\w+"),
    ("CPU flags", r"cpu\.flags\.\w+"),
    ("threads", r"threads\.\w+"),
)


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested mappings, dataclasses and config objects as ``{dotted.key: leaf}``."""
    value = _as_mapping(value)
    flat: dict[str, Any] = {}
    for key, item in value.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(item, Mapping) or _is_config(item):
            flat.update(flatten(item, name))  # an empty mapping leaves no key
        else:
            flat[name] = list(item) if isinstance(item, tuple) else item
    return flat


def _is_config(value: Any) -> bool:
    return (dataclasses.is_dataclass(value) and not isinstance(value, type)) or callable(
        getattr(value, "to_dict", None)
    )


def _as_mapping(value: Any) -> Mapping[str, Any]:
    if isinstance(value, Mapping):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    to_dict = getattr(value, "to_dict", None)  # HF PretrainedConfig, GenerationConfig
    if callable(to_dict):
        return to_dict()
    raise PrecisionInputError(
        f"cannot diff a {type(value).__name__}: expected a dict, a dataclass or a config with "
        "to_dict() (HF PretrainedConfig, GenerationConfig)"
    )


def _rank(key: str, order: tuple[tuple[str, str], ...], *, whole: bool) -> tuple[int, str]:
    name = key if whole else key.rsplit(".", 1)[-1]
    for i, (category, pattern) in enumerate(order):
        if re.fullmatch(pattern, name):
            return i, category
    return len(order), "other"


def _diff(
    what: str,
    golden: Mapping[str, Any],
    target: Mapping[str, Any],
    order: tuple[tuple[str, str], ...],
    ignore: Iterable[str],
    *,
    whole: bool,
) -> ChecklistDiff:
    skip = set(ignore)
    changes = []
    for key in sorted(set(golden) | set(target)):
        if key in skip or key.rsplit(".", 1)[-1] in skip:
            continue
        a, b = golden.get(key), target.get(key)
        if a != b:
            rank, category = _rank(key, order, whole=whole)
            changes.append(Change(key, a, b, category, rank))
    changes.sort(key=lambda c: (c.rank, c.key))
    return ChecklistDiff(what, tuple(changes))


def diff_configs(a: Any, b: Any, *, ignore: Iterable[str] = CONFIG_IGNORE) -> ChecklistDiff:
    """The keys where config ``b`` (the target) differs from ``a`` (the baseline).

    Takes dicts, dataclasses, HF ``PretrainedConfig`` / ``GenerationConfig`` (anything with
    ``to_dict()``), nested or flat. Changes come ordered by category, most often guilty first:
    special token ids and padding, sampling, length limits, dtype and quantization, RoPE,
    norm epsilons, attention, weight tying, structure, then the rest. ``ignore`` drops keys
    (by full dotted key or last component); by default those that differ between any two saves.
    """
    return _diff("config", flatten(a), flatten(b), CONFIG_ORDER, ignore, whole=False)


def precision_environment() -> dict[str, Any]:
    """This process as a checklist: the shared environment fingerprint, plus library versions,
    the env vars that matter for precision, matmul precision switches, CPU flags and threads."""
    import torch

    record = dict(environment_fingerprint())
    env = dict(record.get("env", {}))
    env.update({name: os.environ.get(name) for name in PRECISION_ENV})
    record["env"] = env
    libraries = {}
    for name in PRECISION_LIBRARIES:
        try:
            libraries[name] = importlib.metadata.version(name.replace("_", "-"))
        except importlib.metadata.PackageNotFoundError:
            libraries[name] = None
    record["libraries"] = libraries
    record["precision"] = {
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cuda_matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        "cuda_matmul_allow_fp16_reduced_precision_reduction": (
            torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction
        ),
        "cuda_matmul_allow_bf16_reduced_precision_reduction": (
            torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
        ),
    }
    record["cpu"] = {"capability": torch.backends.cpu.get_cpu_capability(), "flags": _cpu_flags()}
    record["threads"] = {"intra_op": torch.get_num_threads()}
    return record


def _cpu_flags() -> dict[str, bool]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return {
                        flag: True for flag in sorted(value.split()) if CPU_FLAGS.fullmatch(flag)
                    }
    except OSError:
        pass
    return {}


def diff_environment(
    a: Mapping[str, Any], b: Mapping[str, Any] | None = None, *, ignore: Iterable[str] = ()
) -> ChecklistDiff:
    """The differences between environment ``a`` (the baseline's record) and ``b`` (default:
    this process, :func:`precision_environment`).

    Records are nested (``precision_environment()``, a dump manifest's fingerprint) or flat
    (a golden's ``dotted.key -> str`` record); values are compared as strings (unset is None),
    and a section only one side recorded is left out. Ordered: library versions,
    device and architecture, matmul precision switches, determinism flags, env vars, CPU
    flags, threads, the rest.
    """
    golden = _strings(flatten(a))
    target = _strings(flatten(precision_environment() if b is None else b))
    # A section (first key component) only one side recorded, such as the libraries of a
    # golden written by an older version, is no evidence of a change; a key missing from a
    # section both recorded is (flat records leave unset variables out).
    sections = {k.split(".", 1)[0] for k in golden} & {k.split(".", 1)[0] for k in target}
    golden = {k: v for k, v in golden.items() if k.split(".", 1)[0] in sections}
    target = {k: v for k, v in target.items() if k.split(".", 1)[0] in sections}
    return _diff("environment", golden, target, ENVIRONMENT_ORDER, ignore, whole=True)


def _strings(flat: Mapping[str, Any]) -> dict[str, str | None]:
    return {k: None if v is None else str(v) for k, v in flat.items()}


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
