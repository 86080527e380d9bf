"""Dumps in msprobe's own layout for the side-by-side compare benchmark.

``write_gelu_pair`` writes what msprobe's ``PrecisionDebugger`` (task ``tensor``, level ``L1``)
writes for a forward that calls ``torch.nn.functional.gelu`` on 1024 x 1024 float32 tensors:
``step0/rank0/`` holding ``dump.json`` (``task``, ``level``, ``framework``, ``dump_data_dir``,
``data``: per call ``input_args``, ``input_kwargs``, ``output``, each tensor with ``type``,
``dtype``, ``shape``, ``Max``, ``Min``, ``Mean``, ``Norm`` computed in the tensor's dtype,
``requires_grad`` and ``data_name``), ``construct.json`` (``{}`` at L1), ``stack.json`` and
``dump_tensor_data/`` with one ``torch.save`` file per tensor (an input and an output per call).
Each call's input is a distinct rotation of one of a few random tensors (and its output the
same rotation of their gelu), so a pair of any size is written holding a few tensors.
The structure was checked against a real msprobe 26.2 dump of such a forward (same keys in the
same order, same ``.pt`` archive members). The target's tensors are the golden's, each element
scaled by ``1 + 1e-6 * noise``: every tensor slightly different, every record within the float32
standards (nothing for either tool to rerun).

``hf_llama_pair`` has msprobe itself dump a real HF ``transformers`` Llama at L1 (see
``_msprobe_hf_dump.py``), in the Python environment msprobe is installed in.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
from torch.nn import functional as F

SIDE = 1024  # 1024 x 1024 float32: 1M elements, 4 MiB per tensor
NUMEL = SIDE * SIDE
#: random inputs drawn per side; every call's input is a distinct rotation of one of them
BASES = 4
ROTATION = 7919
NOISE = 1e-6
HF_DUMP_SCRIPT = Path(__file__).with_name("_msprobe_hf_dump.py")
#: the call stack msprobe records for every gelu call (the frames of a module's forward)
STACK = [
    "File model.py, line 12, in forward, \n x = F.gelu(x)",
    "File torch/nn/modules/module.py, line 1789, in _call_impl, \n return forward_call(*args)",
    "File torch/nn/modules/module.py, line 1778, in _wrapped_call_impl, \n return self._call_impl",
    "File run.py, line 18, in <module>, \n model(x)",
]


def _summary(tensor: torch.Tensor, data_name: str) -> dict[str, object]:
    """One tensor's entry in dump.json, with msprobe's statistics (in the tensor's dtype)."""
    return {
        "type": "torch.Tensor",
        "dtype": str(tensor.dtype),
        "shape": list(tensor.shape),
        "Max": tensor.max().item(),
        "Min": tensor.min().item(),
        "Mean": tensor.mean().item(),
        "Norm": torch.linalg.vector_norm(tensor).item(),
        "requires_grad": False,
        "data_name": data_name,
    }


def pair_bytes(tensors: int, numel: int = NUMEL) -> int:
    """What :func:`write_gelu_pair` writes, both sides (the data files; the JSON is small)."""
    return 2 * (tensors // 2) * 2 * numel * 4


def write_gelu_pair(folder: Path, tensors: int, numel: int = NUMEL) -> tuple[Path, Path]:
    """The step folders (what ``msprobe compare`` takes) of ``folder/golden`` and
    ``folder/target``: ``tensors // 2`` gelu calls each on float32 tensors of ``numel``
    elements (rows of 1024 where it divides); reused if already complete. One tensor at a
    time is in memory, whatever the size of the pair."""
    pair = (folder / "golden", folder / "target")
    calls = tensors // 2
    if all(_complete(side, calls) for side in pair):
        return pair[0] / "step0", pair[1] / "step0"
    shape = (numel // SIDE, SIDE) if numel % SIDE == 0 else (numel,)
    wobble = 1 + NOISE * torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    for side in pair:
        rank = side / "step0" / "rank0"
        data = rank / "dump_tensor_data"
        data.mkdir(parents=True, exist_ok=True)
        values = torch.Generator().manual_seed(0)
        bases = [torch.randn(*shape, generator=values) for _ in range(BASES)]
        outputs = [F.gelu(x) for x in bases]  # gelu commutes with a rotation
        entries: dict[str, object] = {}
        for i in range(calls):
            call = f"Functional.gelu.{i}.forward"
            # each call's input another rotation of a base: random draws and gelu were most
            # of the time of writing a pair
            shift = (i // BASES) * ROTATION % numel
            x, y = bases[i % BASES].roll(shift), outputs[i % BASES].roll(shift)
            if side.name == "target":
                x, y = x * wobble.roll(2 * i), y * wobble.roll(2 * i + 1)
            names = f"{call}.input.0.pt", f"{call}.output.0.pt"
            torch.save(x, data / names[0])
            torch.save(y, data / names[1])
            entries[call] = {
                "input_args": [_summary(x, names[0])],
                "input_kwargs": {},
                "output": [_summary(y, names[1])],
            }
        stack = {"0": [list(entries), STACK]}
        (rank / "stack.json").write_text(json.dumps(stack, indent=1))
        (rank / "construct.json").write_text("{}")
        header = {"task": "tensor", "level": "L1", "framework": "pytorch"}
        content = {**header, "dump_data_dir": str(data), "data": entries}
        (rank / "dump.json").write_text(json.dumps(content, indent=1))
    return pair[0] / "step0", pair[1] / "step0"


def _complete(side: Path, calls: int) -> bool:
    dump_json = side / "step0" / "rank0" / "dump.json"
    if not dump_json.is_file():
        return False
    return len(json.loads(dump_json.read_text())["data"]) == calls


def msprobe_python(msprobe: Path) -> Path:
    """The Python interpreter of msprobe's environment: the one its launcher script names."""
    first = msprobe.read_bytes().split(b"\n", 1)[0].decode(errors="replace")
    if first.startswith("#!") and Path(first[2:].strip()).is_file():
        return Path(first[2:].strip())
    return msprobe.with_name("python")


def hf_llama_pair(folder: Path, msprobe: Path) -> tuple[Path, Path] | str:
    """A real msprobe L1 tensor dump of an HF Llama, golden and target (``step0`` folders),
    or why it could not be made (msprobe's environment lacks ``transformers``)."""
    pair = (folder / "hf_golden", folder / "hf_target")
    if all((side / "step0").is_dir() for side in pair):
        return tuple(side / "step0" for side in pair)  # type: ignore[return-value]
    python = msprobe_python(msprobe)
    for side in pair:
        run = subprocess.run(
            [str(python), str(HF_DUMP_SCRIPT), str(side), side.name.removeprefix("hf_")],
            capture_output=True,
            text=True,
        )
        if run.returncode != 0:
            return f"making the HF dump in {python} failed: {run.stderr.strip().splitlines()[-1]}"
    return tuple(side / "step0" for side in pair)  # type: ignore[return-value]


if __name__ == "__main__":  # python benchmarks/_msprobe_layout.py FOLDER TENSORS [NUMEL]
    numel = int(sys.argv[3]) if len(sys.argv) > 3 else NUMEL
    print(write_gelu_pair(Path(sys.argv[1]), int(sys.argv[2]), numel))
