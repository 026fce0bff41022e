"""Downloads through the workflow: a corrupt mirror file fails the prepare_data job, and a
rerun after the fix succeeds (library-level cases: test_data.py, test_data_archives.py)."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from crosslip.data import ChecksumError, load_dataset, load_prepared

from .helpers import shared_path
from .workflow_helpers import (
    BASE,
    MNIST_FILES,
    changed,
    files_under,
    snakemake,
    temporaries,
)

# --------------------------------------------------------------------------------------
# 2. downloads through the workflow: a corrupt mirror file, then the fixed mirror
# --------------------------------------------------------------------------------------
# Covered in tests/test_data.py (fetch_files, MNIST) and tests/test_data_archives.py
# (CIFAR-10, GTSRB): checksum mismatch leaves no file (test_checksum_mismatch_leaves_no_file,
# both files), truncated / interrupted transfer (test_interrupted_transfer_leaves_no_file,
# test_interrupted_transfer_leaves_no_file_and_rerun_succeeds, test_truncated_gzip_in_cache_
# is_replaced, test_corrupt_deflate_download_is_rejected), HTTP error 404
# (test_missing_file_404_message, test_missing_file_404_names_files_folders_and_key), no
# network (test_unreachable_url, test_no_network_names_files_folder_and_key,
# test_mnist_offline_without_mirror_names_every_file), no partial file (files_in(cache) == []
# in each), a corrupt mirror is an error and is left untouched
# (test_mirror_with_wrong_content_raises_and_is_untouched, test_corrupt_mirror_file_raises_
# and_is_kept), rerun after the fix (test_interrupted_transfer_leaves_no_file_and_rerun_
# succeeds, test_corrupt_cache_file_is_replaced). Missing there: the same through the
# workflow, which this section adds.


@pytest.fixture(scope="module")
def mnist_mirror() -> Path:
    """The official MNIST files, under ``$CROSSLIP_SHARED/data/mnist`` (skips where unset)."""
    return shared_path("data", "mnist", files=MNIST_FILES)


def corrupt_mirror(folder: Path, good: Path) -> Path:
    """A mirror with the official names: three good files (links) and a test-label file that
    is valid gzip with one label changed (a plausible but wrong copy)."""
    folder.mkdir(parents=True)
    for name in MNIST_FILES[:3]:
        (folder / name).symlink_to(good / name)
    raw = bytearray(gzip.decompress((good / MNIST_FILES[3]).read_bytes()))
    raw[8] = (raw[8] + 1) % 10  # the first test label
    (folder / MNIST_FILES[3]).write_bytes(gzip.compress(bytes(raw)))
    return folder


@pytest.mark.slow
def test_corrupt_mirror_fails_prepare_data_and_fixed_mirror_succeeds(tmp_path, mnist_mirror):
    mirror = corrupt_mirror(tmp_path / "mirror", mnist_mirror)
    bad = mirror / MNIST_FILES[3]
    cfg = changed(BASE, datasets=["mnist"], data={"mirrors": {"mnist": str(mirror)}})
    work = tmp_path / "work"
    target = "results/data/mnist.npz"
    proc = snakemake(work, "--cores", "1", target, config=cfg)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    line = f"{bad}: checksum mismatch (sha256"
    assert line in proc.stderr and "Error in rule prepare_data" in proc.stderr
    assert line in (work / "results" / "logs" / "prepare_data" / "mnist.log").read_text()
    assert "Traceback" not in proc.stderr  # one clear line, not a traceback
    assert not (work / target).exists()
    assert files_under(work / "results" / "data") == [] and temporaries(work / "results") == []
    assert not (work / "results" / "downloads").exists()  # nothing was downloaded or cached
    assert bad.read_bytes() != (mnist_mirror / MNIST_FILES[3]).read_bytes()  # mirror untouched

    bad.unlink()
    bad.symlink_to(mnist_mirror / MNIST_FILES[3])  # the user fixes the mirror
    proc = snakemake(work, "--cores", "1", target, config=cfg)  # the same command
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ds = load_prepared(work / target)
    assert ds.x_train.shape == (60000, 784) and ds.y_test[:3].tolist() == [7, 2, 1]
    assert temporaries(work / "results") == []


def test_corrupt_mirror_message_names_the_config_key(tmp_path, mnist_mirror):
    mirror = corrupt_mirror(tmp_path / "mirror", mnist_mirror)
    with pytest.raises(ChecksumError) as info:
        load_dataset("mnist", cache_dir=tmp_path / "cache", mirror_dir=mirror)
    assert str(mirror / MNIST_FILES[3]) in str(info.value)
    assert "data.mirrors.mnist" in str(info.value)
