"""The adversarial samples of adversarial training (Section 5, ``train.adv_attack``).

The first ``adv_fraction`` of every batch is replaced by box-constrained samples of the
current model in the ``adv_norm``, with their true labels, made in eval mode (no dropout):

* ``one_step``: the authors' code (:mod:`crosslip.attacks.one_step`), one step towards the
  runner-up class for a random fraction of the gap; the fractions of each epoch are drawn by
  :func:`adversarial_fractions`;
* ``search``: the paper's evaluation procedure (:func:`crosslip.attacks.upper_bound`) with
  the bisection's relative tolerance ``adv_search_rtol`` and at most ``adv_search_steps``
  steps (:func:`search_settings`); a point whose attack fails stays as it is.

:func:`adversarial_batch` makes them for one network, :func:`adversarial_inputs` for every
network of a stack at once (the search; the grid makes the one-step samples inside its
step, :meth:`crosslip.training.grid.GridStep.one_step_inputs`).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..attacks import one_step, upper_bound
from ..config.specs import NetTrainSpec
from ..models import StackedSoftplusNet
from ..norms import norm_p


def search_settings(cfg: NetTrainSpec) -> dict[str, Any]:
    """The keyword arguments of :func:`crosslip.attacks.upper_bound` for ``adv_attack``
    ``search`` (config ``train.adv_search_rtol``, ``train.adv_search_steps``)."""
    return {"rtol": cfg.adv_search_rtol, "max_steps": cfg.adv_search_steps}


def adversarial_rows(cfg: NetTrainSpec, n: int) -> int:
    """How many points of a batch of ``n`` adversarial training replaces:
    ``ceil(adv_fraction n)``."""
    return math.ceil(cfg.adv_fraction * n)


def makes_one_step_samples(cfg: NetTrainSpec) -> bool:
    """Whether the network trains adversarially with ``adv_attack`` ``one_step``."""
    return cfg.setting == "adversarial" and cfg.adv_attack == "one_step"


def adversarial_fractions(
    cfg: NetTrainSpec, batches: int, generator: torch.Generator
) -> torch.Tensor | None:
    """The one-step attack's fractions ``r`` of one epoch (:mod:`crosslip.attacks.one_step`),
    (batches, ceil(adv_fraction batch_size)), float64 on the CPU, uniform in [0, 1) from
    ``generator`` (the training seed's, shared by every network of that seed, like the batch
    order); row ``b`` serves batch ``b`` (a shorter last batch uses its first entries).
    None unless :func:`makes_one_step_samples`."""
    if not makes_one_step_samples(cfg):
        return None
    m = adversarial_rows(cfg, cfg.batch_size)
    return torch.rand(batches, m, generator=generator, dtype=torch.float64, device="cpu")


def adversarial_generator(seed: int) -> torch.Generator:
    """The generator of :func:`adversarial_fractions` for a training seed (``seed + 2``; the
    batch order draws from ``seed``, the augmentations from ``seed + 1``)."""
    return torch.Generator(device="cpu").manual_seed(seed + 2)


def adversarial_batch(
    net: torch.nn.Module,
    xb: torch.Tensor,
    cfg: NetTrainSpec,
    fractions: torch.Tensor | None = None,
) -> torch.Tensor:
    """``xb`` (n, d) with its first ``adv_fraction`` replaced by adversarial samples of
    ``net`` in ``adv_norm`` (module docstring), made in eval mode (no dropout); the model is
    left in train mode. ``adv_attack`` ``one_step`` takes the fractions ``r`` (at least m,
    on ``xb``'s device) of :func:`adversarial_fractions`."""
    m = adversarial_rows(cfg, len(xb))
    if m == 0:
        return xb
    p = norm_p(cfg.adv_norm)
    net.eval()
    if cfg.adv_attack == "one_step":
        if fractions is None:
            raise ValueError("the one-step attack needs its fractions (adversarial_fractions)")
        first = one_step(net, xb[:m], fractions[:m], p)
        net.train()
        return torch.cat([first, xb[m:]])
    ub = upper_bound(net, xb[:m], p=p, **search_settings(cfg), dtype=xb.dtype, progress=False)
    net.train()
    adv = (xb[:m] + ub.delta.to(xb.device, xb.dtype)).clamp(0, 1)
    return torch.cat([torch.where(ub.success.to(xb.device)[:, None], adv, xb[:m]), xb[m:]])


def adversarial_inputs(
    stack: StackedSoftplusNet, xb: torch.Tensor, cfg: NetTrainSpec
) -> torch.Tensor:
    """The batch of every grid point for ``adv_attack`` ``search``, (G, n, d): ``xb`` (n, d)
    with its first ``adv_fraction`` replaced by box-constrained adversarial samples of that
    grid point's network (as :func:`adversarial_batch` for one network; a point whose attack
    fails stays as it is). All G networks are attacked in one batch of G x m rows."""
    size, (n, d) = stack.size, xb.shape
    m = adversarial_rows(cfg, n)
    if m == 0:
        return xb.expand(size, n, d)
    rows = xb[:m].repeat(size, 1)  # row r attacks grid point r // m
    groups = torch.arange(size, device=xb.device).repeat_interleave(m)
    stack.eval()
    ub = upper_bound(
        stack,
        rows,
        p=norm_p(cfg.adv_norm),
        **search_settings(cfg),
        dtype=xb.dtype,
        progress=False,
        groups=groups,
        to_cpu=False,
    )
    stack.train()
    adv = (rows + ub.delta.to(xb.dtype)).clamp(0, 1)
    first = torch.where(ub.success[:, None], adv, rows).view(size, m, d)
    return torch.cat([first, xb[m:].expand(size, n - m, d)], dim=1)
