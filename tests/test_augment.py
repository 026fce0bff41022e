"""Batched data augmentation (Section 5): shapes, ranges, and exact rotation/crop."""

from __future__ import annotations

import math

import numpy as np
import torch

from crosslip.data import load_dataset
from crosslip.data.augment import augment, center_crop, crop, rotate, to_flat, to_images


def test_flat_image_round_trip_and_exact_crop():
    x = torch.rand(5, 28 * 28)
    img = to_images(x, (28, 28, 1))
    assert img.shape == (5, 1, 28, 28) and torch.equal(to_flat(img), x)
    top, left = torch.tensor([0, 4, 2, 1, 3]), torch.tensor([4, 0, 2, 3, 1])
    out = crop(img, top, left, 24)
    for i in range(5):
        assert torch.equal(out[i], img[i, :, top[i] : top[i] + 24, left[i] : left[i] + 24])
    cc = center_crop(x, (28, 28, 1), 24)
    assert torch.equal(cc, to_flat(img[:, :, 2:26, 2:26]))


def test_rotation_by_zero_is_identity_and_quarter_turn_is_exact():
    img = torch.rand(3, 1, 28, 28)
    assert torch.allclose(rotate(img, torch.zeros(3)), img, atol=1e-5)
    quarter = rotate(img, torch.full((3,), math.pi / 2))  # counter-clockwise on screen
    assert torch.allclose(quarter, torch.rot90(img, k=1, dims=(2, 3)), atol=1e-5)


def test_augmented_batches_keep_range_shape_and_change_images():
    ds = load_dataset("mnist5k")
    x = torch.as_tensor(ds.x_train[:256])
    gen = torch.Generator().manual_seed(0)
    out = augment(x, ds.shape, gen)
    assert out.shape == (256, 24 * 24) and out.dtype == x.dtype
    assert out.min() >= 0 and out.max() <= 1
    # different images get different random transforms; mass is roughly preserved
    cc = center_crop(x, ds.shape, 24)
    assert (out - cc).abs().amax(1).gt(0.1).float().mean() > 0.9
    assert np.allclose(out.sum(1).numpy(), cc.sum(1).numpy(), rtol=0.35)
    again = augment(x, ds.shape, torch.Generator().manual_seed(0))
    assert torch.equal(out, again)  # same seed, same batch


def test_colour_augmentation_stays_in_the_box():
    x = torch.rand(64, 32 * 32 * 3)
    out = augment(x, (32, 32, 3), torch.Generator().manual_seed(1), colour=True)
    assert out.shape == (64, 24 * 24 * 3) and out.min() >= 0 and out.max() <= 1
