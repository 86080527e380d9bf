"""msprobe's L1 tensor dump of an HF ``transformers`` Llama, run in msprobe's environment.

    MSPROBE_PYTHON benchmarks/_msprobe_hf_dump.py FOLDER golden|target

The model (hidden 512, intermediate 1376, 8 layers, 8 heads, vocabulary 8000, eager attention,
float32, random weights under a fixed seed) runs one sequence of 256 tokens under msprobe's
``PrecisionDebugger`` (task ``tensor``, level ``L1``: every API call's inputs and outputs). The
golden and the target get the same token embeddings, the target's each scaled by
``1 + 1e-6 * noise``: every later tensor drifts slightly, as between two machines. msprobe writes
``FOLDER/dump/step0/proc<pid>/``; the step folder is moved to ``FOLDER/step0``.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

SEED = 1234
SEQ = 256
CONFIG = {
    "vocab_size": 8000,
    "hidden_size": 512,
    "intermediate_size": 1376,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "max_position_embeddings": 512,
    "tie_word_embeddings": False,
    "use_cache": False,
}


def main() -> None:
    folder, side = Path(sys.argv[1]), sys.argv[2]
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(SEED)
    config = LlamaConfig(**CONFIG)
    config._attn_implementation = "eager"
    model = LlamaForCausalLM(config).eval()
    tokens = torch.Generator().manual_seed(0)
    ids = torch.randint(3, CONFIG["vocab_size"], (1, SEQ), generator=tokens)
    with torch.no_grad():
        embeds = model.get_input_embeddings()(ids)
        if side == "target":
            noise = torch.randn(embeds.shape, generator=torch.Generator().manual_seed(1))
            embeds = embeds * (1 + 1e-6 * noise)
    settings = {
        "task": "tensor",
        "dump_path": str(folder / "dump"),
        "rank": [],
        "step": [],
        "level": "L1",
        "tensor": {"scope": [], "list": [], "data_mode": ["all"]},
    }
    (folder / "config.json").write_text(json.dumps(settings))
    from msprobe.pytorch import PrecisionDebugger

    debugger = PrecisionDebugger(config_path=str(folder / "config.json"))
    debugger.start(model)
    with torch.no_grad():
        model(inputs_embeds=embeds)
    debugger.stop()
    debugger.step()
    shutil.move(folder / "dump" / "step0", folder / "step0")


if __name__ == "__main__":
    main()
