"""Full MNIST (LeCun, Cortes, Burges) from the official IDX files: 60,000 + 10,000 digits."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .dataset import Dataset, register
from .fetch import RemoteFile, fetch_dataset
from .idx import read_idx

#: Official locations, in order of preference (the second is the long-standing public copy
#: used by the major frameworks since the first became unreliable).
BASE_URLS = (
    "https://yann.lecun.com/exdb/mnist/",
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
)

#: SHA-256 of the *decompressed* IDX content (the gzip wrappers differ between copies).
CHECKSUMS = {
    "train-images-idx3-ubyte.gz": (
        "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db"
    ),
    "train-labels-idx1-ubyte.gz": (
        "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5"
    ),
    "t10k-images-idx3-ubyte.gz": "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
    "t10k-labels-idx1-ubyte.gz": "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
}


def remote_files(base_urls: tuple[str, ...] | None = None) -> list[RemoteFile]:
    """The four official files with their checksums and download URLs."""
    base_urls = BASE_URLS if base_urls is None else base_urls
    return [
        RemoteFile(name, sha, tuple(base + name for base in base_urls))
        for name, sha in CHECKSUMS.items()
    ]


def read_mnist_files(paths: dict[str, Path], name: str = "mnist") -> Dataset:
    """Build a :class:`Dataset` from the four (verified) IDX files."""

    def split(prefix: str) -> tuple[np.ndarray, np.ndarray]:
        images = read_idx(paths[f"{prefix}-images-idx3-ubyte.gz"])
        return images, read_idx(paths[f"{prefix}-labels-idx1-ubyte.gz"])

    return Dataset.from_pixels(name, split("train"), split("t10k"), (28, 28, 1), 10)


@register("mnist")
def load_mnist(cache_dir: Path, mirror_dir: Path | None = None) -> Dataset:
    """Full MNIST: mirror folder, else cache, else the official locations."""
    return read_mnist_files(fetch_dataset("mnist", remote_files(), cache_dir, mirror_dir))
