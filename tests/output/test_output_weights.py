"""Weight-loading checks and fingerprints on small torch modules and checkpoint files."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from pytest_precision import (
    PrecisionInputError,
    assert_close,
    assert_weights_loaded,
    check_weights_loaded,
    fingerprint_weights,
)
from pytest_precision.output._weights import WeightsNotLoaded


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(10, 4)
        self.proj = torch.nn.Linear(4, 4)
        self.norm = torch.nn.LayerNorm(4)
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight  # tied
        self.register_buffer("scale", torch.tensor(2.0))


def _checkpoint() -> dict[str, torch.Tensor]:
    state = {k: torch.randn_like(v) for k, v in Net().state_dict().items()}
    del state["head.weight"]  # tied: stored once, as frameworks do
    return state


def test_a_cleanly_loaded_model_passes_from_every_source(tmp_path: Path) -> None:
    state = _checkpoint()
    net = Net()
    net.load_state_dict(state, strict=False)
    save_file(state, tmp_path / "model.safetensors")
    torch.save(state, tmp_path / "model.pt")
    torch.save({"model": state, "epoch": 3}, tmp_path / "wrapped.bin")
    for source in (state, tmp_path / "model.safetensors", tmp_path / "model.pt"):
        report = assert_weights_loaded(net, source)
        assert report.loaded == 6
        assert report.missing == ()
    assert check_weights_loaded(net, tmp_path / "wrapped.bin").passed
    assert check_weights_loaded(net, tmp_path).passed  # a folder: its safetensors shards


def test_every_kind_of_problem_is_listed() -> None:
    state = _checkpoint()
    net = Net()
    net.load_state_dict({k: v for k, v in state.items() if k != "norm.weight"}, strict=False)
    state["proj.bias"] = torch.randn(5)  # shape mismatch
    state["scale"] = state["scale"].double()  # dtype mismatch
    state["extra.weight"] = torch.zeros(1)  # unexpected
    with torch.no_grad():
        net.proj.weight.add_(1.0)  # changed after loading
        net.norm.bias.fill_(0.0)  # still constant: looks like an initializer
    report = check_weights_loaded(net, state)
    assert report.missing == ()
    assert report.unexpected == ("extra.weight",)
    assert [i.key for i in report.shape_mismatches] == ["proj.bias"]
    assert report.shape_mismatches[0].network == "(4,) float32"
    assert report.shape_mismatches[0].checkpoint == "(5,) float32"
    assert [i.key for i in report.dtype_mismatches] == ["scale"]
    not_loaded = {i.key: i.network for i in report.not_loaded}
    assert set(not_loaded) == {"norm.weight", "norm.bias", "proj.weight"}
    assert "still at its initializer (every element 1)" in not_loaded["norm.weight"]
    assert "differs from the checkpoint at 16 of 16" in not_loaded["proj.weight"]
    with pytest.raises(WeightsNotLoaded) as failure:
        assert_weights_loaded(net, state)
    message = str(failure.value)
    assert "parameters not loaded in the weights (never used) (1):\n  extra.weight" in message
    assert check_weights_loaded(net, state, check_dtype=False).dtype_mismatches == ()


def test_missing_keys_and_renames() -> None:
    state = {f"model.{k}": v for k, v in _checkpoint().items() if k != "norm.bias"}
    net = Net()
    report = check_weights_loaded(net, state, check_values=False)
    assert len(report.missing) == 7
    assert len(report.unexpected) == 5
    renamed = check_weights_loaded(net, state, rename=lambda k: k.removeprefix("model."))
    assert renamed.missing == ("norm.bias",)
    assert renamed.unexpected == ()


def test_a_pickled_object_is_refused_without_running_it(tmp_path: Path) -> None:
    path = tmp_path / "evil.bin"
    torch.save({"weight": torch.zeros(2), "hook": Net}, path)
    with pytest.raises(PrecisionInputError) as failure:
        check_weights_loaded(Net(), path)
    message = str(failure.value)
    assert "refused" in message
    assert "Net" in message
    assert "weights_only=False" not in message
    assert "weights_only` set to `False" not in message
    with pytest.raises(PrecisionInputError, match="no such checkpoint"):
        check_weights_loaded(Net(), tmp_path / "nothing.safetensors")
    (tmp_path / "broken.safetensors").write_bytes(b"\x00" * 4)
    with pytest.raises(PrecisionInputError, match="not a readable safetensors"):
        check_weights_loaded(Net(), tmp_path / "broken.safetensors")


def test_fingerprints_catch_a_row_permutation_that_plain_statistics_miss() -> None:
    net = Net()
    golden = fingerprint_weights(net)
    assert set(golden) == {"embed.weight", "proj.weight", "proj.bias", "norm.weight", "norm.bias"}
    stats = golden["proj.weight"]
    assert stats["shape"] == [4, 4]
    weight = net.proj.weight.detach().double()
    assert stats["mean"] == pytest.approx(float(weight.mean()))
    assert stats["norm"] == pytest.approx(float(weight.norm()))
    with torch.no_grad():
        net.proj.weight.copy_(net.proj.weight[[1, 0, 2, 3]])  # two rows trade places
    target = fingerprint_weights(net)
    for key in ("mean", "std", "abs_mean", "min", "max", "norm"):
        assert target["proj.weight"][key] == pytest.approx(stats[key], rel=1e-12)
    with pytest.raises(AssertionError, match=r"\['proj.weight'\]\['checksum'\]"):
        assert_close(target, golden)
    assert "scale" in fingerprint_weights(net, buffers=True)


def test_fingerprints_of_a_file_match_those_of_the_model(tmp_path: Path) -> None:
    net = Net()
    state = {k: v for k, v in net.state_dict().items() if k not in ("head.weight", "scale")}
    save_file({k: v.contiguous() for k, v in state.items()}, tmp_path / "m.safetensors")
    assert_close(fingerprint_weights(tmp_path / "m.safetensors"), fingerprint_weights(net))
