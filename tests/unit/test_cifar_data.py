"""lab_utils.data: CIFAR-10 sources (fake batches in tmp_path) and the synthetic stand-in. Fast, no network."""

from __future__ import annotations

import io
import os
import pickle
import tarfile
import urllib.request

import numpy as np
import pytest

from lab_utils import data

PER_BATCH = 3  # images in each fake batch: 15 training, 3 test


@pytest.fixture
def no_sources(tmp_path, monkeypatch):
    """No LABS_DATA_DIR, an empty KERAS_HOME and HOME (the real ~/.keras is never read), no network."""
    monkeypatch.delenv("LABS_DATA_DIR", raising=False)
    monkeypatch.delenv("LABS_OFFLINE", raising=False)
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(urllib.request, "urlopen", lambda *a, **k: pytest.fail("load_cifar10 must never download"))
    return tmp_path


def _batch(index: int, n: int = PER_BATCH) -> dict:
    """A fake batch in CIFAR-10's layout; pixel values and labels encode ``index``
    so that tests can tell the batches (and their order) apart."""
    x = np.full((n, 3 * 1024), index, dtype=np.uint8)
    x[0] = 0
    x[0, :1024] = 255  # image 0: the R plane is 255, G and B are 0
    if n > 1:  # image 1: G is the row, B the column (checks the row-major order inside a plane)
        rows, cols = np.divmod(np.arange(1024), 32)
        x[1, 1024:2048] = rows
        x[1, 2048:] = cols
    labels = [(index + i) % 10 for i in range(n)]
    return {b"batch_label": f"batch {index}".encode(), b"labels": labels, b"data": x, b"filenames": [b"x.png"] * n}


def _px(value: int) -> np.float32:
    """A uint8 pixel value as the loader gives it: divided by 255 in float32."""
    return np.float32(value) / np.float32(255)


def _batches() -> dict[str, bytes]:
    # protocol 2 with bytes keys: what the real files (written by Python 2's cPickle) hold
    return {name: pickle.dumps(_batch(i + 1), protocol=2) for i, name in enumerate(data.CIFAR_BATCHES)}


def _write_dir(folder, files=None):
    folder.mkdir(parents=True)
    for name, payload in (files or _batches()).items():
        (folder / name).write_bytes(payload)
    return folder


def _write_tar(path, files=None, prefix="cifar-10-batches-py/"):
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:
        for name, payload in (files or _batches()).items():
            info = tarfile.TarInfo(prefix + name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return path


def _check_real(ds, source):
    assert ds.source == source and ds.name == "cifar10" and ds.num_classes == 10
    assert ds.x_train.shape == (5 * PER_BATCH, 32, 32, 3) and ds.x_test.shape == (PER_BATCH, 32, 32, 3)
    assert ds.x_train.dtype == np.float32 and ds.x_test.dtype == np.float32
    assert ds.x_train.flags["C_CONTIGUOUS"]
    assert ds.y_train.dtype == np.int64 and ds.y_test.dtype == np.int64
    # training batches 1..5 in order, then the test batch (index 6)
    assert ds.y_train.tolist() == [(b + i) % 10 for b in range(1, 6) for i in range(PER_BATCH)]
    assert ds.y_test.tolist() == [6, 7, 8]
    assert ds.x_train[2, 5, 7, 1] == _px(1) and ds.x_train[-1, 0, 0, 2] == _px(5)
    assert ds.x_test[2].min() == ds.x_test[2].max() == _px(6)
    for x in (ds.x_train, ds.x_test):
        assert 0.0 <= x.min() and x.max() <= 1.0


def test_channel_order(no_sources, monkeypatch):
    _write_dir(no_sources / "d" / "cifar-10-batches-py")
    monkeypatch.setenv("LABS_DATA_DIR", str(no_sources / "d"))
    ds = data.load_cifar10(verbose=False)
    red = ds.x_train[0]
    assert (red[..., 0] == 1.0).all() and (red[..., 1] == 0.0).all() and (red[..., 2] == 0.0).all()
    g, b = ds.x_train[1, ..., 1], ds.x_train[1, ..., 2]
    assert g[4, 9] == _px(4) and b[4, 9] == _px(9)
    ramp = _px(np.arange(32))
    assert np.array_equal(g, np.repeat(ramp[:, None], 32, axis=1))
    assert np.array_equal(b, np.repeat(ramp[None, :], 32, axis=0))
    assert (ds.x_train[1, ..., 0] == _px(1)).all()


@pytest.mark.parametrize("form", ["folder", "tarball"])
def test_raw_keeps_bytes_that_pixels_turns_into_the_same_floats(no_sources, monkeypatch, form):
    if form == "folder":
        _write_dir(no_sources / "d" / "cifar-10-batches-py")
    else:
        _write_tar(no_sources / "d" / "cifar-10-python.tar.gz")
    monkeypatch.setenv("LABS_DATA_DIR", str(no_sources / "d"))
    floats, raw = data.load_cifar10(verbose=False), data.load_cifar10(verbose=False, raw=True)
    for f, r in ((floats.x_train, raw.x_train), (floats.x_test, raw.x_test)):
        assert r.dtype == np.uint8 and r.shape == f.shape and r.flags["C_CONTIGUOUS"]
        assert np.array_equal(data.pixels(r).view(np.uint32), f.view(np.uint32))  # bit for bit, batch or whole
        assert np.array_equal(data.pixels(r[4:9]), f[4:9])
    assert raw.x_train[0, 3, 3].tolist() == [255, 0, 0] and raw.x_train[1, 4, 9].tolist() == [1, 4, 9]
    assert np.array_equal(raw.y_train, floats.y_train) and np.array_equal(raw.y_test, floats.y_test)
    assert (raw.source, raw.name, raw.stand_in) == (floats.source, floats.name, floats.stand_in)


def test_labs_data_dir_folder(no_sources, monkeypatch, capsys):
    _write_dir(no_sources / "d" / "cifar-10-batches-py")
    monkeypatch.setenv("LABS_DATA_DIR", str(no_sources / "d"))
    ds = data.load_cifar10()
    _check_real(ds, "LABS_DATA_DIR")
    assert capsys.readouterr().out.strip() == "cifar10: 15 training and 3 test images from LABS_DATA_DIR"


def test_labs_data_dir_tarball_read_in_place(no_sources, monkeypatch):
    _write_tar(no_sources / "d" / "cifar-10-python.tar.gz")
    monkeypatch.setenv("LABS_DATA_DIR", str(no_sources / "d"))
    _check_real(data.load_cifar10(verbose=False), "LABS_DATA_DIR")
    assert sorted(os.listdir(no_sources / "d")) == ["cifar-10-python.tar.gz"]  # nothing extracted


def test_labs_data_dir_folder_before_tarball_before_keras_cache(no_sources, monkeypatch):
    d = no_sources / "d"
    _write_tar(d / "cifar-10-python.tar.gz", _batches() | {"test_batch": b"broken"})
    _write_dir(no_sources / "keras" / "datasets" / "cifar-10-batches-py", {"test_batch": b"broken"})
    _write_dir(d / "cifar-10-batches-py")
    monkeypatch.setenv("LABS_DATA_DIR", str(d))
    _check_real(data.load_cifar10(verbose=False), "LABS_DATA_DIR")  # the broken copies are never opened


@pytest.mark.parametrize(
    "where",
    ["cifar-10-batches-py", "cifar-10-batches-py-target/cifar-10-batches-py", "cifar-10-batches-py.tar.gz"],
)
def test_keras_cache(no_sources, monkeypatch, where):
    path = no_sources / "keras" / "datasets" / where
    if where.endswith(".tar.gz"):
        _write_tar(path)
    else:
        _write_dir(path)
    monkeypatch.setenv("LABS_DATA_DIR", str(no_sources / "empty"))  # set, but holds no CIFAR-10
    _check_real(data.load_cifar10(verbose=False), "keras-cache")


def test_keras_cache_under_home_when_keras_home_unset(no_sources, monkeypatch):
    monkeypatch.delenv("KERAS_HOME")
    _write_dir(no_sources / "home" / ".keras" / "datasets" / "cifar-10-batches-py")
    _check_real(data.load_cifar10(verbose=False), "keras-cache")


@pytest.mark.parametrize("how", ["argument", "LABS_OFFLINE"])
def test_offline_still_reads_local_files(no_sources, monkeypatch, how):
    _write_dir(no_sources / "keras" / "datasets" / "cifar-10-batches-py")
    if how == "LABS_OFFLINE":
        monkeypatch.setenv("LABS_OFFLINE", "1")
    ds = data.load_cifar10(offline=True if how == "argument" else None, verbose=False)
    assert ds.source == "keras-cache"


def test_bad_labs_offline_value_is_an_error_as_in_load_mnist(no_sources, monkeypatch):
    monkeypatch.setenv("LABS_OFFLINE", "maybe")
    with pytest.raises(ValueError, match="LABS_OFFLINE='maybe'"):
        data.load_cifar10(verbose=False)


def test_synthetic_fallback(no_sources, capsys):
    ds = data.load_cifar10(synthetic_train=50, synthetic_test=20, seed=3)
    assert ds.source == "synthetic" == data.CIFAR_SOURCES[-1] and ds.name == "synthetic-imagenet"
    assert ds.x_train.shape == (50, 32, 32, 3) and ds.x_test.shape == (20, 32, 32, 3)
    same = data.synthetic_imagenet(50, 20, seed=3)
    assert np.array_equal(ds.x_train, same.x_train) and np.array_equal(ds.y_test, same.y_test)
    out = capsys.readouterr().out
    assert "No CIFAR-10" in out and str(no_sources / "keras" / "datasets" / "cifar-10-batches-py") in out
    assert out.strip().endswith(
        "synthetic-imagenet: 50 training and 20 test images from synthetic "
        "(synthetic ImageNet-like stand-in, the CS 744 'fake dataset': accuracy numbers are not CIFAR-10's)"
    )


def test_describe_note_only_for_the_synthetic_imagenet():
    assert "ImageNet" not in data.synthetic_images(n_train=4, n_test=2, shape=(2, 2, 1)).describe()
    assert "CS 744" in data.synthetic_imagenet(4, 2, image_size=4).describe()


# ------------------------------------------------------------------ damaged files
def test_truncated_pickle_names_the_file(no_sources, monkeypatch):
    files = _batches()
    files["data_batch_3"] = files["data_batch_3"][:-500]
    folder = _write_dir(no_sources / "keras" / "datasets" / "cifar-10-batches-py", files)
    with pytest.raises(ValueError, match="truncated or corrupt") as info:
        data.load_cifar10(verbose=False)
    assert str(folder / "data_batch_3") in str(info.value)


def test_truncated_tarball_names_the_file(no_sources, monkeypatch):
    tar = _write_tar(no_sources / "d" / "cifar-10-python.tar.gz")
    tar.write_bytes(tar.read_bytes()[: tar.stat().st_size // 2])
    monkeypatch.setenv("LABS_DATA_DIR", str(no_sources / "d"))
    with pytest.raises(ValueError, match="truncated or corrupt") as info:
        data.load_cifar10(verbose=False)
    assert str(tar) in str(info.value)


def test_incomplete_folder_and_tarball(no_sources, monkeypatch):
    files = _batches()
    del files["test_batch"]
    folder = _write_dir(no_sources / "keras" / "datasets" / "cifar-10-batches-py", files)
    with pytest.raises(ValueError, match="incomplete CIFAR-10 folder") as info:
        data.load_cifar10(verbose=False)
    assert str(folder / "test_batch") in str(info.value)
    tar = _write_tar(no_sources / "d" / "cifar-10-python.tar.gz", prefix="elsewhere/")
    monkeypatch.setenv("LABS_DATA_DIR", str(no_sources / "d"))
    with pytest.raises(ValueError, match="no cifar-10-batches-py/data_batch_1, .*test_batch inside") as info:
        data.load_cifar10(verbose=False)
    assert str(tar) in str(info.value)


@pytest.mark.parametrize(
    "batch,match",
    [
        ([1, 2], "pickled dict, this holds a list"),
        ({b"data": np.zeros((2, 3072), np.uint8)}, "'data' and 'labels'"),
        ({b"data": np.zeros((2, 1024), np.uint8), b"labels": [0, 1]}, r"shape \(N, 3072\), got uint8 \(2, 1024\)"),
        ({b"data": np.zeros((2, 3072), np.float32), b"labels": [0, 1]}, "got float32"),
        ({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0]}, r"2 images but labels of shape \(1,\)"),
        ({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 10]}, r"labels must lie in 0-9, got \[0, 10\]"),
        ({b"data": np.zeros((1, 3072), np.uint8), b"labels": [0], b"evil": os.getcwd}, "refusing to load"),
    ],
)
def test_wrong_contents(no_sources, batch, match):
    files = _batches()
    files["data_batch_2"] = pickle.dumps(batch, protocol=2)
    folder = _write_dir(no_sources / "keras" / "datasets" / "cifar-10-batches-py", files)
    with pytest.raises(ValueError, match=match) as info:
        data.load_cifar10(verbose=False)
    assert str(folder / "data_batch_2") in str(info.value)


# --------------------------------------------------------------- synthetic stand-in
def test_synthetic_imagenet_is_deterministic():
    a = data.synthetic_imagenet(200, 50, seed=7)
    b = data.synthetic_imagenet(200, 50, seed=7)
    for name in ("x_train", "y_train", "x_test", "y_test"):
        assert getattr(a, name).tobytes() == getattr(b, name).tobytes(), name
    c = data.synthetic_imagenet(200, 50, seed=8)
    assert not np.array_equal(a.x_train, c.x_train)
    # the training set does not depend on n_test
    assert data.synthetic_imagenet(200, 5, seed=7).x_train.tobytes() == a.x_train.tobytes()


@pytest.mark.parametrize("image_size,num_classes", [(32, 10), (4, 2), (13, 3), (64, 100)])
def test_synthetic_imagenet_shapes_and_values(image_size, num_classes):
    ds = data.synthetic_imagenet(200, 30, image_size=image_size, num_classes=num_classes, seed=1)
    assert ds.x_train.shape == (200, image_size, image_size, 3) and ds.x_test.shape == (30, image_size, image_size, 3)
    assert ds.source == "synthetic" and ds.name == "synthetic-imagenet" and ds.num_classes == num_classes
    for x, y in ((ds.x_train, ds.y_train), (ds.x_test, ds.y_test)):
        assert x.dtype == np.float32 and x.flags["C_CONTIGUOUS"]
        assert x.min() == 0.0 and x.max() == 1.0  # clipped noise reaches both ends
        assert 0.3 < x.mean() < 0.7
        assert y.dtype == np.int64 and y.shape == (len(x),)
        counts = np.bincount(y, minlength=num_classes)
        assert len(counts) == num_classes and counts.max() - counts.min() <= 1  # balanced
    assert not np.array_equal(ds.y_train[:20], np.arange(20) % num_classes)  # shuffled


def test_synthetic_imagenet_is_learnable_but_not_trivial():
    ds = data.synthetic_imagenet(2000, 500, seed=0)
    x, y = ds.x_train.reshape(len(ds.x_train), -1), ds.y_train
    means = np.stack([x[y == c].mean(axis=0) for c in range(10)])
    xt = ds.x_test.reshape(len(ds.x_test), -1)
    dist = (xt**2).sum(1)[:, None] - 2 * xt @ means.T + (means**2).sum(1)[None, :]
    accuracy = (dist.argmin(axis=1) == ds.y_test).mean()
    assert 0.5 < accuracy < 0.99, accuracy  # chance is 0.1
    # images of one class differ from each other (per-image noise and brightness)
    same_class = ds.x_train[ds.y_train == 0]
    assert np.abs(same_class[0] - same_class[1]).mean() > 0.1
    assert len({img.tobytes() for img in same_class}) == len(same_class)
    # the class patterns are smooth: neighbouring pixels of a class mean are close
    mean_img = means[0].reshape(32, 32, 3)
    assert np.abs(np.diff(mean_img, axis=0)).mean() < 0.05  # one noisy image: about 0.2
    assert np.abs(np.diff(ds.x_train[0], axis=0)).mean() > 0.1


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(n_train=0), ValueError, "n_train must be >= 1, got 0"),
        (dict(n_test=-1), ValueError, "n_test must be >= 0, got -1"),
        (dict(num_classes=1), ValueError, "num_classes must be >= 2, got 1"),
        (dict(image_size=3), ValueError, "image_size must be >= 4, got 3"),
        (dict(n_train=10.0), TypeError, "n_train must be an int >= 1, got float 10.0"),
        (dict(n_train=True), TypeError, "got bool True"),
    ],
)
def test_synthetic_imagenet_rejects_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        data.synthetic_imagenet(**kwargs)


def test_load_cifar10_checks_synthetic_sizes_even_with_real_data(no_sources):
    _write_dir(no_sources / "keras" / "datasets" / "cifar-10-batches-py")
    with pytest.raises(ValueError, match="n_test must be >= 0, got -5"):
        data.load_cifar10(synthetic_test=-5, verbose=False)


def test_n_test_zero_is_allowed():
    ds = data.synthetic_imagenet(20, 0, image_size=8)
    assert ds.x_test.shape == (0, 8, 8, 3) and ds.y_test.shape == (0,)
