"""What the snippets of README.md and the reference docs assume exists, built in the current
folder (documented in tests/docs/test_snippets.py): models, tensors, dumps, saved runs, eval and
token files, a stand-in tokenizer."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def hf_pair() -> tuple[Any, Any]:
    """A tiny HF Llama and a copy with one weight loaded wrong (x3)."""
    from hf_zoo import wandering_llama

    gpu = wandering_llama()
    npu = copy.deepcopy(gpu)
    with torch.no_grad():
        npu.model.layers[0].mlp.down_proj.weight.mul_(3.0)  # a weight loaded wrong
    return gpu, npu


def _tiny_dumps() -> Any:
    """dumps/gpu and dumps/npu: the example decoder, and the same with one corrupted weight;
    returns the example decoder (plain tensors out, no HF cache object)."""
    sys.path.insert(0, str(ROOT))
    from examples.tiny_llama import build_tiny_llama, example_input_ids
    from pytest_precision import capture

    ids = example_input_ids(seq=8)
    for name, corrupt in (("gpu", False), ("npu", True)):
        model = build_tiny_llama()
        if corrupt:
            with torch.no_grad():
                model.model.layers[1].mlp.down_proj.weight[3, 5] += 1.0
        with torch.no_grad(), capture(model, f"dumps/{name}", level="mix", mode="tensor"):
            model(ids)
    return build_tiny_llama(), ids


class Tokenizer:
    """The parts of a HF tokenizer the output checks use."""

    pad_token_id = 0
    unk_token_id = 3

    def decode(self, ids: Any) -> str:
        return " ".join(f"w{int(i)}" for i in ids)


def readme_namespace() -> dict[str, Any]:
    from safetensors.torch import save_file

    from pytest_precision import precision_environment, save_run

    gpu_model, npu_model = hf_pair()
    input_ids = torch.tensor([[17, 200, 45, 3, 99, 120]])
    x = torch.randn(4, 64)
    reference_in = torch.randn(8, 128, dtype=torch.float64)
    decoder, decoder_ids = _tiny_dumps()
    Path("msprobe_dump").symlink_to(ROOT / "fixtures" / "msprobe" / "mix_tensor_steps")
    save_run(gpu_model, input_ids, "runs/gpu", max_new_tokens=4)
    save_run(npu_model, input_ids, "runs/npu", max_new_tokens=4)
    Path("ckpt").mkdir()
    save_file(
        {k: v.contiguous() for k, v in gpu_model.state_dict().items()}, "ckpt/model.safetensors"
    )
    with torch.no_grad():
        logits = gpu_model(input_ids).logits
        generated = gpu_model.generate(
            input_ids,
            max_new_tokens=4,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
    rows = [{"id": i, "prompt": f"q{i}", "answer": f"a {i}", "score": 1.0} for i in range(3)]
    Path("gpu_eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    rows[1] = {**rows[1], "answer": "b 1", "score": 0.0}
    Path("npu_eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for stem in ("golden", "golden_ids"):
        Path(f"{stem}.json").write_text(json.dumps([[0, 5, 6, 7], [8, 9, 10, 11]]))
    for stem in ("target", "target_ids"):
        Path(f"{stem}.jsonl").write_text("[5, 6, 7]\n[8, 9, 10, 12]\n")
    Path("dumps/run1").symlink_to(Path("dumps/gpu").resolve())
    Path("dumps/target").symlink_to(Path("dumps/npu").resolve())

    def generate(prompt: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return decoder(prompt)

    def run(prompt: str) -> str:
        return f"answer to {prompt}"

    return {
        "pytest": pytest,
        "torch": torch,
        "model": decoder,
        "tokens": decoder_ids,
        "prompt_ids": decoder_ids,
        "longer_ids": torch.cat([decoder_ids, decoder_ids[:, :1]], dim=1),
        "input_ids": input_ids,
        "gpu_model": gpu_model,
        "npu_model": npu_model,
        "gpu": gpu_model,
        "npu": npu_model,
        "golden": gpu_model,
        "target": copy.deepcopy(gpu_model),
        "out": {"logits": logits, "past_key_values": [logits[:, :1]]},
        "expected": {"logits": logits.clone(), "past_key_values": [logits[:, :1].clone()]},
        "fp64_out": torch.softmax(reference_in, -1),
        "gpu_out": torch.softmax(reference_in.bfloat16(), -1),
        "npu_out": torch.softmax(reference_in.float(), -1).bfloat16(),
        "layer": torch.nn.Linear(64, 8),
        "x": x,
        "golden_ids": [[0, 0, 5, 6, 7], [8, 9, 10, 11, 0]],
        "target_ids": [[0, 5, 6, 7, 0], [8, 9, 10, 12, 0]],
        "g": generated,
        "t": generated,
        "tokenizer": lambda ids: " ".join(map(str, ids)),
        "text": "the answer is 42",
        "baseline_record": precision_environment(),
        # the reference docs (determinism, goldens-in-ci, replay, output-checks, readers)
        "generate": generate,
        "prompt": decoder_ids,
        "run": run,
        "tok": Tokenizer(),
        "ids": input_ids,
        "answer_ids": generated.sequences[0].tolist(),
        "golden_model": gpu_model,
        "target_model": copy.deepcopy(gpu_model),
        "gpu_generation_config": gpu_model.generation_config,
        "npu_generation_config": {**gpu_model.generation_config.to_dict(), "temperature": 0.7},
    }
