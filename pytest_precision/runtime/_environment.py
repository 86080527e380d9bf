"""The environment as a checklist: what a run was computed with, and how two runs differ.

The guides start every localization with a checklist against the baseline: library versions,
device, matmul precision switches, determinism flags, env vars, CPU flags, threads.
:func:`precision_environment` records this process; :func:`diff_environment` diffs two records
(nested, or flat dotted keys as goldens store them) and orders the differences by how often each
kind causes a precision problem. Goldens, dumps and the output checks share it."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .._errors import PrecisionInputError
from ._devices import environment_fingerprint


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


def diff_flat(
    what: str,
    golden: Mapping[str, Any],
    target: Mapping[str, Any],
    order: tuple[tuple[str, str], ...],
    ignore: Iterable[str],
    *,
    whole: bool,
) -> ChecklistDiff:
    """The keys where flat record ``target`` differs from ``golden``, ordered by ``order``
    (category patterns, most often guilty first); ``whole``: patterns match whole keys."""
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


def precision_environment() -> dict[str, Any]:
    """This process as a checklist: the shared environment fingerprint, plus library versions,
    the env vars that matter for precision, matmul precision switches, CPU flags and threads."""
    import torch

    record = dict(environment_fingerprint())
    libraries: dict[str, str | None] = {}
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
    return diff_flat("environment", golden, target, ENVIRONMENT_ORDER, ignore, whole=True)


def _strings(flat: Mapping[str, Any]) -> dict[str, str | None]:
    return {k: None if v is None else str(v) for k, v in flat.items()}
