"""Full-size stand-ins (lab_utils.standins): written in the real formats, read by the real
loaders, deterministic, learnable, never over real data."""

from __future__ import annotations

import hashlib
import pickle

import numpy as np
import pytest

from lab_utils import data, data_files, standins
from lab_utils.__main__ import main as cli


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    dest = tmp_path_factory.mktemp("standins")
    standins.write(dest)
    return dest


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_real_loaders_read_them_at_full_size_and_say_they_are_stand_ins(folder, monkeypatch, capsys):
    monkeypatch.setenv("LABS_DATA_DIR", str(folder))
    with np.load(folder / "mnist.npz") as f:  # the Keras file's own layout
        assert {k: (f[k].dtype, f[k].shape) for k in f.files} == {
            "x_train": (np.uint8, (60000, 28, 28)),
            "y_train": (np.uint8, (60000,)),
            "x_test": (np.uint8, (10000, 28, 28)),
            "y_test": (np.uint8, (10000,)),
        }
    mnist = data.load_mnist()
    assert (mnist.source, mnist.stand_in, mnist.x_train.shape, mnist.x_test.shape) == (
        "LABS_DATA_DIR",
        True,
        (60000, 784),
        (10000, 784),
    )
    assert "stand-ins" in capsys.readouterr().out
    cifar = data.load_cifar10()
    assert (cifar.source, cifar.name, cifar.stand_in, cifar.x_train.shape, cifar.x_test.shape) == (
        "LABS_DATA_DIR",
        "cifar10",
        True,
        (50000, 32, 32, 3),
        (10000, 32, 32, 3),
    )
    assert np.bincount(cifar.y_train).tolist() == [5000] * 10
    with open(folder / data.CIFAR_DIRNAME / "batches.meta", "rb") as f:
        assert pickle.load(f, encoding="bytes")[b"label_names"][0] == b"airplane"


def test_they_are_learnable_and_no_test_digit_is_a_training_one(folder):
    with np.load(folder / "mnist.npz") as f:
        x_train, y_train, x_test, y_test = (f[k] for k in ("x_train", "y_train", "x_test", "y_test"))
    assert not {bytes(r) for r in x_test.reshape(len(x_test), -1)} & {
        bytes(r) for r in x_train.reshape(len(x_train), -1)
    }
    means = np.stack([x_train[y_train == c].reshape(-1, 784).mean(0) for c in range(10)])
    nearest = ((x_test[:2000].reshape(-1, 784)[:, None, :] - means[None]) ** 2).sum(-1).argmin(1)
    assert (nearest == y_test[:2000]).mean() > 0.6  # real digits: a class-mean classifier does this well
    batches = data_files.read_cifar_folder(folder / data.CIFAR_DIRNAME)
    (xa, ya), (xt, yt) = batches["data_batch_1"], batches["test_batch"]
    means = np.stack([xa[ya == c].astype(np.float32).mean(0) for c in range(10)])
    nearest = ((xt[:1000, None, :].astype(np.float32) - means[None]) ** 2).sum(-1).argmin(1)
    assert (nearest == yt[:1000]).mean() > 0.5


def test_the_same_seed_writes_the_same_bytes_and_real_data_is_never_overwritten(folder, tmp_path, capsys):
    again = tmp_path / "again"
    assert cli(["stand-ins", str(again), "--datasets", "mnist"]) == 0
    assert "mnist.npz" in capsys.readouterr().out
    assert _sha(again / "mnist.npz") == _sha(folder / "mnist.npz")
    real = tmp_path / "real"
    real.mkdir()
    (real / "mnist.npz").write_bytes(b"the real file")
    assert cli(["stand-ins", str(real), "--datasets", "mnist"]) == 2
    assert "not overwritten" in capsys.readouterr().err
    assert (real / "mnist.npz").read_bytes() == b"the real file"
    with pytest.raises(ValueError, match="unknown datasets"):
        standins.write(tmp_path / "x", ("imagenet",))
