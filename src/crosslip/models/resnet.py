"""ResNet-32 of the paper's deep-network experiments (supplement; He et al. 2015, CIFAR-10).

Non-bottleneck residual blocks, three stages of ``n = 5`` blocks with 16, 32 and 64 channels
(``6 n + 2 = 32`` parameter layers: the first convolution, ``2 x 3 x 5`` block convolutions
and the final linear layer), batch normalization, the softplus ``log(1 + exp(alpha z))/alpha``
(alpha = 10) as activation so that the network is continuously differentiable, optional
dropout between the two convolutions of a block, global average pooling. Shortcuts that
change the shape use a strided 1x1 convolution.

Inputs are flat images ``(m, h*w*c)`` in ``[0, 1]`` (no mean subtraction, as in the paper),
so the model plugs into the same certification, attack and Cross-Lipschitz code as the
one-hidden-layer net: Cross-Lipschitz regularization uses
:func:`crosslip.training.regularizers.cross_lipschitz_autograd` (exact, double backpropagation), and
input gradients for the attacks come from automatic differentiation.
"""

from __future__ import annotations

import torch
from torch import nn

from ..data.augment import to_images
from .softplus import Softplus


class BasicBlock(nn.Module):
    """conv3x3 - BN - softplus - [dropout] - conv3x3 - BN, plus the shortcut, then softplus."""

    def __init__(self, c_in: int, c_out: int, stride: int, alpha: float, dropout: float) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.act = Softplus(alpha)
        self.drop = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.drop(self.act(self.bn1(self.conv1(x))))
        out = self.bn2(self.conv2(out))
        return self.act(out + self.shortcut(x))


class ResNet(nn.Module):
    """ResNet-(6n+2) for images of ``shape = (h, w, c)``; ``n = 5`` gives ResNet-32.
    ``width`` scales the channels (16, 32, 64 at width 1)."""

    def __init__(
        self,
        shape: tuple[int, int, int],
        num_classes: int = 10,
        n: int = 5,
        width: int = 1,
        alpha: float = 10.0,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.hyper = dict(
            shape=list(shape),
            num_classes=num_classes,
            n=n,
            width=width,
            alpha=alpha,
            dropout=dropout,
        )
        self.shape = tuple(shape)
        chans = [16 * width, 32 * width, 64 * width]
        self.stem = nn.Sequential(
            nn.Conv2d(shape[2], chans[0], 3, 1, 1, bias=False),
            nn.BatchNorm2d(chans[0]),
            Softplus(alpha),
        )
        blocks, c_in = [], chans[0]
        for stage, c_out in enumerate(chans):
            for i in range(n):
                stride = 2 if stage > 0 and i == 0 else 1
                blocks.append(BasicBlock(c_in, c_out, stride, alpha, dropout))
                c_in = c_out
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(c_in, num_classes)

    def depth(self) -> int:
        """Parameter layers: convolutions and linear layers outside the shortcuts."""
        convs = sum(
            1
            for name, m in self.named_modules()
            if isinstance(m, nn.Conv2d) and "shortcut" not in name
        )
        return convs + 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (m, K) for flat images ``x`` (m, h*w*c)."""
        out = self.blocks(self.stem(to_images(x, self.shape)))
        return self.fc(out.mean(dim=(2, 3)))
