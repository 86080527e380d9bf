"""A dump is untrusted input: a symlink in it never makes a reader open anything outside it,
declared sizes never make it allocate what the file does not hold, and two captures to one
path never both write it."""

from __future__ import annotations

import io
import os
import shutil
import struct
import sys
import threading
import tracemalloc
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from atb_helpers import make_atb_dump
from dump_helpers import MSPROBE_FIXTURES, REPO

from pytest_precision import DumpFormatError, PrecisionError, capture, load_dump
from pytest_precision.cli import main
from pytest_precision.dump._safe_io import MAX_INFLATED_ENV
from pytest_precision.dump._writer import DumpWriter

MINDSPORE_GRAPH = REPO / "fixtures" / "mindspore" / "graph"

# -- what a reader opens ---------------------------------------------------------------------------

#: Paths opened (files) or listed (folders) while :func:`watching` is active; audit hooks cannot
#: be removed, so one hook is installed for the session and does nothing outside ``watching``.
_seen: list[str] | None = None
_EVENTS = {"open", "os.scandir", "os.listdir"}


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _seen is not None and event in _EVENTS and args and isinstance(args[0], (str, bytes, Path)):
        _seen.append(os.path.realpath(os.fsdecode(args[0])))


sys.addaudithook(_audit)


@contextmanager
def watching() -> Iterator[list[str]]:
    global _seen
    _seen = seen = []
    try:
        yield seen
    finally:
        _seen = None


def _under(folder: Path, paths: list[str]) -> list[str]:
    top = os.path.realpath(folder)
    return [p for p in paths if p == top or p.startswith(top + os.sep)]


# -- one dump per reader, with a folder replaced by a link to valid tensors outside ------------


def _link_out(folder: Path, outside: Path) -> Path:
    """Move ``folder`` (valid tensors) to ``outside`` and leave a symlink to it in its place."""
    target = outside / folder.name
    shutil.move(folder, target)
    folder.symlink_to(target, target_is_directory=True)
    return folder


def _native_rank(dump: Path, outside: Path) -> Path:
    writer = DumpWriter(dump, rank=0, world_size=1, info={"level": "op", "mode": "tensor"})
    writer.start()
    t = torch.arange(6, dtype=torch.float32)
    entry = {"name": "Torch.add.0.forward", "slot": "output.0", "kind": "Torch", "op": "add"}
    writer.add({**entry, "dtype": "float32", "shape": [6], "step": 0}, key="0", tensor=t)
    writer.close()
    return _link_out(dump / "rank0", outside)


def _msprobe_rank(dump: Path) -> Path:
    (source,) = (MSPROBE_FIXTURES / "l0_tensor" / "step0").iterdir()
    shutil.copytree(source, dump / "step0" / source.name)
    return dump / "step0" / source.name


def _msprobe_data(dump: Path, outside: Path) -> Path:
    return _link_out(_msprobe_rank(dump) / "dump_tensor_data", outside)


def _msprobe_proc(dump: Path, outside: Path) -> Path:
    return _link_out(_msprobe_rank(dump), outside)


def _atb_before(dump: Path, outside: Path) -> Path:
    make_atb_dump(dump, layers=1, rounds=1)
    before = min((dump / "atb_dump_data").rglob("before"), key=lambda p: (len(p.parts), p))
    return _link_out(before, outside)


def _mindspore_order(dump: Path, outside: Path) -> Path:
    shutil.copytree(MINDSPORE_GRAPH, dump, dirs_exist_ok=True)
    return _link_out(dump / "rank_0" / "execution_order", outside)


def _mindspore_file(dump: Path, outside: Path) -> Path:
    shutil.copytree(MINDSPORE_GRAPH, dump, dirs_exist_ok=True)
    file = next((dump / "rank_0").rglob("*.npy"))
    shutil.move(file, outside / file.name)
    file.symlink_to(outside / file.name)
    return file


def _plain_folder(dump: Path, outside: Path) -> Path:
    (dump / "layers").mkdir(parents=True)
    np.save(dump / "inside.npy", np.zeros(3, dtype=np.float32))
    np.save(dump / "layers" / "0.npy", np.ones(3, dtype=np.float32))
    return _link_out(dump / "layers", outside)


LINKS: dict[str, Callable[[Path, Path], Path]] = {
    "native rank0/": _native_rank,
    "msprobe dump_tensor_data/": _msprobe_data,
    "msprobe step0/proc<pid>/": _msprobe_proc,
    "atb before/": _atb_before,
    "mindspore execution_order/": _mindspore_order,
    "mindspore .npy file": _mindspore_file,
    "plain subfolder": _plain_folder,
}


def _load_everything(dump: Path) -> None:
    for record in load_dump(dump):
        record.load()


@pytest.mark.parametrize("case", list(LINKS))
def test_a_link_leaving_the_dump_is_refused_and_nothing_outside_is_read(
    tmp_path: Path, case: str
) -> None:
    dump, outside = tmp_path / "dump", tmp_path / "outside"
    dump.mkdir()
    outside.mkdir()
    link = LINKS[case](dump, outside)
    with watching() as seen, pytest.raises(DumpFormatError) as info:
        _load_everything(dump)
    message = str(info.value)
    assert "\n" not in message
    assert "symlink points outside the dump folder" in message
    # the link itself, or a file reached through it (the folder is never listed before)
    assert info.value.path == str(link) or info.value.path.startswith(f"{link}{os.sep}")
    assert _under(outside, seen) == []


def test_the_root_itself_may_be_a_link(tmp_path: Path) -> None:
    """The path the user names is trusted: a dump reached through a symlinked root loads."""
    real = tmp_path / "real"
    (real / "sub").mkdir(parents=True)
    np.save(real / "sub" / "x.npy", np.arange(3, dtype=np.float32))
    (tmp_path / "alias").symlink_to(real, target_is_directory=True)
    (record,) = load_dump(tmp_path / "alias")
    assert record.name == "sub/x"
    assert torch.equal(record.load(), torch.arange(3, dtype=torch.float32))


def test_a_link_staying_inside_the_dump_is_followed(tmp_path: Path) -> None:
    outside = tmp_path / "unused"
    outside.mkdir()
    dump = tmp_path / "dump"
    rank = _msprobe_rank(dump)
    moved = rank.parent / "kept_data"
    shutil.move(rank / "dump_tensor_data", moved)
    (rank / "dump_tensor_data").symlink_to(moved, target_is_directory=True)
    records = [r for r in load_dump(dump) if r.loader is not None]
    assert records
    assert all(r.load() is not None for r in records)


# -- declared sizes --------------------------------------------------------------------------------


def _npy_header(shape: tuple[int, ...], descr: str = "<f8") -> bytes:
    out = io.BytesIO()
    header = {"descr": descr, "fortran_order": False, "shape": shape}
    np.lib.format.write_array_header_1_0(out, header)  # type: ignore[no-untyped-call]
    return out.getvalue()


def test_an_npz_claiming_1e11_elements_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lie = tmp_path / "lie.npz"
    with zipfile.ZipFile(lie, "w") as archive:
        archive.writestr("x.npy", _npy_header((10**11,)))
    assert lie.stat().st_size < 300
    assert main(["compare", str(lie), str(lie)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith(f"pytest-precision compare: error: {lie}: array 'x': its header declares")


def _peak_bytes(action: Callable[[], object]) -> int:
    """Peak Python + numpy heap while ``action`` runs (numpy reports to tracemalloc)."""
    tracemalloc.start()
    try:
        action()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


def test_a_compressed_member_over_the_cap_is_refused_without_inflating(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(MAX_INFLATED_ENV, str(1 << 20))
    bomb = tmp_path / "bomb.npz"
    np.savez_compressed(bomb, x=np.zeros(4 << 20, dtype=np.uint8))
    assert bomb.stat().st_size < 64 << 10

    def load() -> None:
        with pytest.raises(DumpFormatError, match=r"inflates to 4194\d+ bytes, over the 1048576"):
            load_dump(bomb)

    assert _peak_bytes(load) < 1 << 20
    monkeypatch.setenv(MAX_INFLATED_ENV, str(8 << 20))
    (record,) = load_dump(bomb)
    assert record.load().shape == (4 << 20,)  # type: ignore[union-attr]


def test_a_member_lying_about_its_size_is_caught_while_streaming(tmp_path: Path) -> None:
    """The header and the zip both say 8 kB; the deflated stream holds 4 MiB of zeros."""
    header = _npy_header((1000,))
    real = header + bytes(4 << 20)
    bomb = tmp_path / "bomb.npz"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("x.npy", real)
    data = bomb.read_bytes()
    size = struct.pack("<I", len(real))
    assert data.count(size) == 2  # the local header and the central directory
    bomb.write_bytes(data.replace(size, struct.pack("<I", len(header) + 8000)))
    (record,) = load_dump(bomb)
    assert record.shape == (1000,)

    def load() -> None:
        with pytest.raises(DumpFormatError, match="array 'x' cannot be read: Bad CRC-32"):
            record.load()

    assert _peak_bytes(load) < 1 << 20


def test_the_cap_must_be_a_positive_number(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    np.savez_compressed(tmp_path / "a.npz", x=np.zeros(3))
    monkeypatch.setenv(MAX_INFLATED_ENV, "1GiB")
    with pytest.raises(PrecisionError, match=f"{MAX_INFLATED_ENV}='1GiB': expected a positive"):
        load_dump(tmp_path / "a.npz")


def test_memory_running_out_is_the_bad_input_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    np.savez(tmp_path / "a.npz", x=np.zeros(3))
    (record,) = load_dump(tmp_path / "a.npz")

    def no_memory(*args: object, **kwargs: object) -> None:
        raise MemoryError

    monkeypatch.setattr(np, "empty", no_memory)
    with pytest.raises(DumpFormatError, match=r"array 'x' \(24 bytes\) does not fit in memory"):
        record.load()


def test_safetensors_offsets_must_hold_the_declared_tensor(tmp_path: Path) -> None:
    header = b'{"x":{"dtype":"F32","shape":[1000000],"data_offsets":[0,16]}}'
    file = tmp_path / "lie.safetensors"
    file.write_bytes(struct.pack("<Q", len(header)) + header + bytes(16))
    with pytest.raises(DumpFormatError, match=r"offsets 0\.\.16 do not hold its float32"):
        load_dump(file)


# -- concurrent captures ---------------------------------------------------------------------------


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())


def _taken(path: Path) -> str:
    return f"{path}: already holds a dump (rank0/ is taken"


def test_a_second_capture_to_a_path_being_written_fails_at_once(tmp_path: Path) -> None:
    path = tmp_path / "dump"
    first, second = _model(0), _model(1)
    with torch.no_grad(), capture(first, path, level="module"):
        first(torch.ones(2, 4))
        with pytest.raises(PrecisionError) as info, capture(second, path, level="module"):
            pytest.fail("the second capture started")
        assert str(info.value).startswith(_taken(path))
        assert str(info.value).endswith("choose another path or delete the old dump")
    dump = load_dump(path)
    assert {r.name for r in dump} == {"Module.Sequential.forward.0", "Module.0.Linear.forward.0",
                                      "Module.1.ReLU.forward.0"}  # fmt: skip
    weight = next(r for r in dump if r.slot == "parameters.weight")
    assert torch.equal(weight.load(), first[0].weight)


def test_two_captures_past_the_empty_folder_check_at_once_one_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both captures are held right after finding the folder free, then let go together:
    exactly one claims it, the other fails before the winner has run anything."""
    path = tmp_path / "dump"
    both_checked = threading.Barrier(2, timeout=10)
    loser_failed = threading.Event()
    real_mkdir = Path.mkdir
    claims = iter(range(2))  # the first call of each capture: later ones write shards

    def mkdir(self: Path, *args: Any, **kwargs: Any) -> None:
        if self == path / "rank0" and kwargs.get("parents") and next(claims, None) is not None:
            both_checked.wait()
        real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    outcomes: dict[int, object] = {}
    models = {seed: _model(seed) for seed in (0, 1)}  # torch's generator is one for all threads

    def run(seed: int) -> None:
        model = models[seed]
        try:
            with torch.no_grad(), capture(model, path, level="module"):
                outcomes[seed] = loser_failed.wait(10)  # the other side failed meanwhile
                model(torch.ones(2, 4))
        except PrecisionError as exc:
            outcomes[seed] = exc
            loser_failed.set()

    threads = [threading.Thread(target=run, args=(seed,)) for seed in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    errors = [o for o in outcomes.values() if isinstance(o, PrecisionError)]
    assert len(outcomes) == 2, outcomes
    assert len(errors) == 1, outcomes
    assert str(errors[0]).startswith(_taken(path))
    (winner,) = (seed for seed, o in outcomes.items() if o is True)
    weight = next(r for r in load_dump(path) if r.slot == "parameters.weight")
    assert torch.equal(weight.load(), models[winner][0].weight)
