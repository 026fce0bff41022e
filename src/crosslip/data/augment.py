"""Data augmentation of Section 5, batched (no Python loop over images).

MNIST: a random rotation by an angle in ``[-pi/20, pi/20]`` and a random ``24 x 24`` crop of
the ``28 x 28`` image. CIFAR-10 additionally: a left-right mirror with probability 0.5, a
random brightness shift in ``[-0.1, 0.1]`` and a random contrast factor in ``[0.6, 1.4]``.
"In each substep we ensure that we get an image in [0,1]^d by clipping." Test images are
*center*-cropped to the same size (the paper does not say; the center crop is the standard
choice and keeps the evaluation deterministic), so a model trained with augmentation takes
``24 x 24`` inputs and is certified and attacked on center-cropped test points.

Images travel flat, ``(n, d)`` with ``d = prod(shape)`` and ``shape = (h, w, c)`` as in
:class:`crosslip.data.Dataset`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def to_images(x: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """Flat (n, h*w*c) -> (n, c, h, w)."""
    h, w, c = shape
    return x.reshape(len(x), h, w, c).permute(0, 3, 1, 2)


def to_flat(img: torch.Tensor) -> torch.Tensor:
    """(n, c, h, w) -> flat (n, h*w*c), the layout of :func:`to_images`."""
    return img.permute(0, 2, 3, 1).reshape(len(img), -1)


def rotate(img: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Rotate each image (n, c, h, w) by its angle (radians, (n,)) about the centre; bilinear,
    zero outside; clipped to [0, 1]."""
    cos, sin = angles.cos(), angles.sin()
    zero = torch.zeros_like(cos)
    theta = torch.stack([torch.stack([cos, -sin, zero], 1), torch.stack([sin, cos, zero], 1)], 1)
    grid = F.affine_grid(theta.to(img.dtype), list(img.shape), align_corners=False)
    return F.grid_sample(
        img, grid, mode="bilinear", padding_mode="zeros", align_corners=False
    ).clamp(0, 1)


def crop(img: torch.Tensor, top: torch.Tensor, left: torch.Tensor, size: int) -> torch.Tensor:
    """Crop ``size x size`` windows at per-image offsets ``top, left`` (n,), by indexing."""
    n = img.shape[0]
    ar = torch.arange(size, device=img.device)
    rows = (top[:, None] + ar)[:, None, :, None]  # (n, 1, size, 1)
    cols = (left[:, None] + ar)[:, None, None, :]  # (n, 1, 1, size)
    batch = torch.arange(n, device=img.device)[:, None, None, None]
    chan = torch.arange(img.shape[1], device=img.device)[None, :, None, None]
    return img[batch, chan, rows, cols]


def center_crop(x: torch.Tensor, shape: tuple[int, ...], size: int) -> torch.Tensor:
    """Flat images -> flat center crops (the test-time transform of the augmented setting)."""
    img = to_images(x, shape)
    off = torch.full((len(x),), (shape[0] - size) // 2, device=x.device)
    offw = torch.full((len(x),), (shape[1] - size) // 2, device=x.device)
    return to_flat(crop(img, off, offw, size))


def augment(
    x: torch.Tensor,
    shape: tuple[int, ...],
    gen: torch.Generator,
    size: int = 24,
    max_angle: float = math.pi / 20,
    colour: bool = False,
) -> torch.Tensor:
    """One random augmentation per image of the flat batch ``x`` (n, d): rotation, crop to
    ``size``, and for ``colour`` (CIFAR-10) mirror, brightness and contrast, clipping to
    [0, 1] after each step. Returns flat (n, size*size*c). Random numbers from ``gen`` (CPU)."""
    n = len(x)
    img = to_images(x, shape)

    def draw(*size_: int) -> torch.Tensor:
        return torch.rand(*size_, generator=gen, device="cpu").to(x.device)

    img = rotate(img, (2 * draw(n) - 1) * max_angle)
    top = (draw(n) * (shape[0] - size + 1)).long().clamp(max=shape[0] - size)
    left = (draw(n) * (shape[1] - size + 1)).long().clamp(max=shape[1] - size)
    img = crop(img, top, left, size)
    if colour:
        flip = draw(n) < 0.5
        img = torch.where(flip[:, None, None, None], img.flip(-1), img)
        img = (img + (0.2 * draw(n) - 0.1).to(img.dtype)[:, None, None, None]).clamp(0, 1)
        mean = img.mean(dim=(1, 2, 3), keepdim=True)
        factor = (0.6 + 0.8 * draw(n)).to(img.dtype)[:, None, None, None]
        img = ((img - mean) * factor + mean).clamp(0, 1)
    return to_flat(img)
