"""lab_utils.data_cache: datasets decoded once and mapped read-only by every process. Fast."""

from __future__ import annotations

import multiprocessing
import os
import stat
from pathlib import Path

import numpy as np
import pytest

from lab_utils import data, data_cache

NAMES = ("big", "small")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("LABS_CACHE_DIR", str(root))
    return root


@pytest.fixture
def source(tmp_path):
    path = tmp_path / "source.bin"
    path.write_bytes(b"one")
    return path


def _arrays(fill: int = 7) -> dict[str, np.ndarray]:
    # "big" is mapped (at least MAP_AT_LEAST bytes), "small" is read into memory
    return {"big": np.full(data_cache.MAP_AT_LEAST + 10, fill, np.uint8), "small": np.arange(5, dtype=np.int64)}


class Builds:
    """build() for mapped(), counting its calls."""

    def __init__(self, fill: int = 7):
        self.calls, self.fill = 0, fill

    def __call__(self):
        self.calls += 1
        return _arrays(self.fill)


def _is_mapped(array: np.ndarray) -> bool:
    base = array
    while base is not None and not isinstance(base, np.memmap):
        base = getattr(base, "base", None)
    return isinstance(base, np.memmap) or type(base).__name__ == "mmap"


def test_the_first_load_decodes_and_keeps_the_next_maps_it_read_only(cache, source):
    build = Builds()
    first, kept = data_cache.mapped("ds", [source], NAMES, build)
    again, kept_again = data_cache.mapped("ds", [source], NAMES, build)
    assert build.calls == 1 and kept and kept_again
    for arrays in (first, again):
        assert np.array_equal(arrays["big"], _arrays()["big"]) and np.array_equal(arrays["small"], np.arange(5))
        assert not arrays["big"].flags.writeable and type(arrays["big"]) is np.ndarray
        with pytest.raises(ValueError, match="read-only"):
            arrays["big"][0] = 1
    assert _is_mapped(again["big"]) and not _is_mapped(again["small"])
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    (entry,) = cache.iterdir()
    assert entry.name.startswith("ds-") and sorted(p.name for p in entry.iterdir()) == ["big.npy", "small.npy"]


def test_an_edited_source_is_decoded_again_and_only_the_newest_entries_stay(cache, source):
    build = Builds()
    data_cache.mapped("ds", [source], NAMES, build)
    for n in range(data_cache.KEEP + 1):
        source.write_bytes(b"edited" * (n + 2))  # a new size: a new key, whatever the clock's resolution
        build.fill = n
        arrays, _ = data_cache.mapped("ds", [source], NAMES, build)
        assert arrays["big"][0] == n
    assert build.calls == data_cache.KEEP + 2
    assert len([p for p in cache.iterdir() if p.name.startswith("ds-")]) == data_cache.KEEP


def test_a_damaged_entry_is_decoded_again_and_says_so(cache, source, capsys):
    build = Builds()
    data_cache.mapped("ds", [source], NAMES, build)
    (entry,) = cache.iterdir()
    big = entry / "big.npy"
    big.write_bytes(big.read_bytes()[:1000])  # truncated
    arrays, kept = data_cache.mapped("ds", [source], NAMES, build)
    assert build.calls == 2 and kept and np.array_equal(arrays["big"], _arrays()["big"])
    assert "cannot be read" in capsys.readouterr().err
    (entry / "small.npy").unlink()  # an entry missing an array is damaged too
    arrays, kept = data_cache.mapped("ds", [source], NAMES, build)
    assert build.calls == 3 and kept and np.array_equal(arrays["small"], np.arange(5))


def test_where_nothing_can_be_written_the_arrays_are_this_process_s_own(tmp_path, monkeypatch, source, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("LABS_CACHE_DIR", str(blocker / "cache"))
    arrays, kept = data_cache.mapped("ds", [source], NAMES, Builds())
    assert not kept and np.array_equal(arrays["big"], _arrays()["big"]) and arrays["big"].flags.writeable
    err = capsys.readouterr().err
    assert "could not keep ds" in err and "this process holds its own copy" in err and "LABS_CACHE_DIR" in err


def test_a_folder_others_can_write_is_not_used(cache, source, capsys):
    cache.mkdir()
    cache.chmod(0o777)
    arrays, kept = data_cache.mapped("ds", [source], NAMES, Builds())
    assert not kept and np.array_equal(arrays["small"], np.arange(5))
    assert "can be written by other users" in capsys.readouterr().err
    assert list(cache.iterdir()) == []


def test_off_writes_nothing(tmp_path, monkeypatch, source):
    monkeypatch.setenv("LABS_CACHE_DIR", "off")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    build = Builds()
    _, kept = data_cache.mapped("ds", [source], NAMES, build)
    _, kept_again = data_cache.mapped("ds", [source], NAMES, build)
    assert build.calls == 2 and not kept and not kept_again
    assert not (tmp_path / "home").exists() and not (tmp_path / "xdg").exists()


def test_the_default_folder_is_the_user_s_cache(tmp_path, monkeypatch):
    monkeypatch.delenv("LABS_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert data_cache.cache_root() == tmp_path / "xdg" / "lab_utils"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert data_cache.cache_root() == tmp_path / "home" / ".cache" / "lab_utils"


def test_a_missing_source_is_left_to_the_loader_s_own_error(cache, tmp_path):
    def build():
        raise ValueError("the loader's error, naming the missing file")

    with pytest.raises(ValueError, match="naming the missing file"):
        data_cache.mapped("ds", [tmp_path / "missing"], NAMES, build)
    assert not cache.exists()


def test_a_build_missing_an_array_is_an_error(cache, source):
    with pytest.raises(ValueError, match="expected"):
        data_cache.mapped("ds", [source], NAMES, lambda: {"big": np.zeros(3)})


def _load_in_child(root: str, source: str, queue) -> None:
    os.environ["LABS_CACHE_DIR"] = root
    arrays, kept = data_cache.mapped("ds", [Path(source)], NAMES, lambda: _arrays(3))
    queue.put((kept, int(arrays["big"].sum()), arrays["small"].tolist()))


def test_processes_loading_at_once_agree_and_leave_one_entry(cache, source):
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_load_in_child, args=(str(cache), str(source), queue)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)  # a hang guard: each loads in about a second
        assert p.exitcode == 0, f"a loading process failed (exit code {p.exitcode}): see its traceback above"
    results = [queue.get(timeout=10) for _ in procs]
    assert results == [(True, 3 * (data_cache.MAP_AT_LEAST + 10), [0, 1, 2, 3, 4])] * 3
    assert len(list(cache.iterdir())) == 1  # no half-written folder left beside it


def test_mnist_training_bytes_are_mapped_and_the_floats_unchanged(cache, tmp_path, monkeypatch):
    gen = np.random.default_rng(0)
    arrays = {
        "x_train": gen.integers(0, 256, (2000, 28, 28), dtype=np.uint8),
        "y_train": gen.integers(0, 10, 2000).astype(np.uint8),
        "x_test": gen.integers(0, 256, (50, 28, 28), dtype=np.uint8),
        "y_test": gen.integers(0, 10, 50).astype(np.uint8),
    }
    (tmp_path / "data").mkdir()
    np.savez_compressed(tmp_path / "data" / "mnist.npz", **arrays)
    monkeypatch.setenv("LABS_DATA_DIR", str(tmp_path / "data"))
    raw = data.load_mnist(verbose=False, raw=True)
    floats = data.load_mnist(verbose=False)
    again = data.load_mnist(verbose=False, raw=True)
    assert _is_mapped(again.x_train) and again.x_train.shape == (2000, 784) and not again.x_train.flags.writeable
    assert np.array_equal(data.pixels(raw.x_train), floats.x_train) and floats.x_train.dtype == np.float32
    assert np.array_equal(again.x_test, floats.x_test) and again.y_train.dtype == np.int64
    assert len(list(cache.iterdir())) == 1


def test_cifar_bytes_are_decoded_once_and_mapped_by_every_later_load(cache, tmp_path, monkeypatch):
    import pickle

    folder = tmp_path / "data" / data.CIFAR_DIRNAME
    folder.mkdir(parents=True)
    gen = np.random.default_rng(1)
    for name in data.CIFAR_BATCHES:
        batch = {b"data": gen.integers(0, 256, (4, data.CIFAR_PIXELS), dtype=np.uint8), b"labels": [1, 2, 3, 4]}
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))
    monkeypatch.setenv("LABS_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setattr(data_cache, "MAP_AT_LEAST", 1)  # these few images are mapped too
    first = data.load_cifar10(verbose=False, raw=True)
    (folder / "data_batch_1").write_bytes(b"")  # were the folder read again, this would be an error...
    os.utime(folder / "data_batch_1", ns=(0, 0))
    with pytest.raises(ValueError, match="data_batch_1"):  # ...and it is: a changed source is decoded again
        data.load_cifar10(verbose=False, raw=True)
    (folder / "data_batch_1").write_bytes(
        pickle.dumps(
            {b"data": first.x_train[:4].transpose(0, 3, 1, 2).reshape(4, -1), b"labels": [1, 2, 3, 4]}, protocol=2
        )
    )
    again, floats = data.load_cifar10(verbose=False, raw=True), data.load_cifar10(verbose=False)
    mapped_again = data.load_cifar10(verbose=False, raw=True)
    assert np.array_equal(first.x_train, again.x_train) and np.array_equal(first.y_test, again.y_test)
    assert (
        _is_mapped(mapped_again.x_train)
        and _is_mapped(mapped_again.x_test)
        and mapped_again.x_train.shape == (20, 32, 32, 3)
    )
    assert np.array_equal(data.pixels(mapped_again.x_train), floats.x_train) and floats.x_train.dtype == np.float32
