"""A grid of one-hidden-layer networks trained by SGD as one batched model (Section 5).

Section 5 trains the network of Section 2.3 for every regularizer and hyperparameter of a
grid. Networks that share the data, the seed (initialisation and batch order), the epochs
and every other setting are trained here *together*: a
:class:`~crosslip.models.StackedSoftplusNet` holds their weights with a leading grid
dimension, so one step costs one batched product per layer for all G of them (on a GPU, as
many kernel launches as one network). Each grid point keeps its own

* regularizer and lambda: none, weight decay (half the squared norm of the weights),
  Cross-Lipschitz in closed form (eq. crosslip, :func:`crosslip.training.regularizers.
  cross_lipschitz_closed_form` on the stack), dropout;
* learning rate and schedule (``lr_decay`` after each fraction ``lr_decay_at`` of the
  updates);
* dropout masks, drawn independently per grid point (:class:`DropoutMasks`);
* adversarial samples in the adversarial setting, made on its own network: the authors'
  one step towards the runner-up class (``adv_attack`` ``one_step``,
  :func:`crosslip.attacks.one_step_stacked`, part of the step: fixed shapes, so a CUDA
  graph records it with the update) or the paper's search
  (``search``, :func:`crosslip.attacks.upper_bound` with ``groups``, op by op before the
  step);
* divergence: a grid point whose loss is not finite stops at that update, as a training of
  its own would, and the others go on.

Apart from the dropout masks, grid point ``g`` comes out as :func:`crosslip.training.single.train`
trains it alone: the same initialisation (the seed's), batches, augmentations and update
per step (tests/test_train_grid.py compares them in float64, dropout under the same masks).
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

import torch
from torch.nn import functional as F

from ..attacks import one_step_stacked
from ..data.augment import augment
from ..data.dataset import Dataset
from ..device import in_tf32
from ..models import SoftplusNet, StackedSoftplusNet
from ..norms import norm_p
from ..progress import Progress
from . import core
from .adversarial import (
    adversarial_fractions,
    adversarial_inputs,
    adversarial_rows,
    makes_one_step_samples,
)
from .certified_margin import CertifiedMargin, warmup_updates
from .core import TrainConfig, TrainResult
from .regularizers import cross_lipschitz_closed_form, half_squared_norm

LOG = logging.getLogger(__name__)

#: Fields of a training spec that may differ between the networks of one grid batch; all
#: others (data layout, seed, epochs, batch size, architecture, setting, ...) are shared.
PER_NETWORK = ("regularizer", "lam", "lr", "keep_hidden", "keep_input", "lr_decay", "lr_decay_at")
#: Order of the grid points inside a stack: each regularizer's points are contiguous, so
#: that the penalties act on slices (views) of the stacked weights.
REGULARIZER_ORDER = ("none", "dropout", "weight_decay", "cross_lipschitz", "certified_margin")
#: Elements of one chunk of the error evaluation (G networks x rows x hidden units).
EVAL_ELEMENTS = 2**24


def shared_settings(cfgs: Sequence[TrainConfig]) -> dict[str, Any]:
    """The settings every network of a grid batch shares (all fields but
    :data:`PER_NETWORK`); raises :class:`ValueError` naming the first field that differs, or
    for a non-``mlp`` architecture."""
    if not cfgs:
        raise ValueError("a grid batch needs at least one network")
    first = asdict(cfgs[0])
    for i, cfg in enumerate(cfgs[1:], 1):
        other = asdict(cfg)
        differ = [k for k in first if k not in PER_NETWORK and other[k] != first[k]]
        if differ:
            raise ValueError(
                f"network {i} of the grid batch differs from network 0 in {differ[0]} "
                f"({other[differ[0]]!r} != {first[differ[0]]!r}): only networks that share "
                "everything but the regularizer, lambda, dropout and learning rate train together"
            )
    if first["arch"] != "mlp":
        raise ValueError(f"grid batches train one-hidden-layer networks (mlp), not {first['arch']}")
    return {k: v for k, v in first.items() if k not in PER_NETWORK}


def _span(regs: Sequence[str], name: str) -> slice | None:
    """The slice of the grid points with regularizer ``name`` (None if there are none);
    raises :class:`ValueError` if they are not contiguous."""
    where = [i for i, r in enumerate(regs) if r == name]
    if where and where != list(range(where[0], where[-1] + 1)):
        raise ValueError(f"the {name} grid points are not contiguous: {where}")
    return slice(where[0], where[-1] + 1) if where else None


def dropout_seed(cfg: TrainConfig) -> int:
    """The seed of a dropout network's masks: a fixed function of its seed, keep
    probabilities and learning rate (CRC-32 of their text), so that its masks, hence its
    weights, do not depend on the networks trained beside it."""
    text = f"dropout {cfg.seed} {cfg.keep_input!r} {cfg.keep_hidden!r} {cfg.lr!r}"
    return zlib.crc32(text.encode())


class DropoutMasks:
    """Inverted-dropout scales of a grid batch (``specs`` in stack order) on ``device``:
    for each grid point with a keep probability below 1, a Bernoulli(keep) mask divided by
    keep (``nn.Dropout``'s training-time map) from a generator of its own
    (:func:`dropout_seed`), so independent across grid points and the same whatever the
    batch; 1 where nothing is dropped. :meth:`scales` is called once per step (the masks
    do not depend on the adversarial samples); a subclass may record or replay masks
    (:func:`train_grid`'s ``masks``)."""

    def __init__(self, specs: Sequence[TrainConfig], device: torch.device | str) -> None:
        self.specs = list(specs)
        self.keep_input = [c.keep_input for c in specs]
        self.keep_hidden = [c.keep_hidden for c in specs]
        self.generators = {
            g: torch.Generator(device=device).manual_seed(dropout_seed(c))
            for g, c in enumerate(specs)
            if c.keep_input < 1 or c.keep_hidden < 1
        }
        self._buffers: dict[tuple[Any, ...], tuple[torch.Tensor, torch.Tensor]] = {}

    def _scale(
        self, keeps: list[float], n: int, width: int, like: torch.Tensor
    ) -> torch.Tensor | None:
        dropped = [i for i, k in enumerate(keeps) if k < 1]
        if not dropped:
            return None
        key = (len(keeps), n, width, like.dtype, like.device)
        if key not in self._buffers:  # made once: no copy from the host in later steps
            keep = torch.tensor(keeps, dtype=like.dtype, device=like.device)[:, None, None]
            self._buffers[key] = (keep, like.new_ones(len(keeps), n, width))
        keep, ones = self._buffers[key]
        scale = ones.clone()
        for g in dropped:
            draws = torch.rand(
                n, width, generator=self.generators[g], dtype=like.dtype, device=like.device
            )
            scale[g] = (draws < keep[g]).to(like.dtype) / keep[g]
        return scale

    def scales(
        self, n: int, d: int, h: int, like: torch.Tensor
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """``(input_scale (G, n, d), hidden_scale (G, n, H))`` for a batch of ``n`` points,
        in the dtype and on the device of ``like``; None where no grid point drops any."""
        return (
            self._scale(self.keep_input, n, d, like),
            self._scale(self.keep_hidden, n, h, like),
        )


class GridStep:
    """One SGD step of every grid point of ``stack`` at once (``cfgs`` in stack order, each
    regularizer's grid points contiguous, as :func:`train_grid` orders them).

    The state the step changes lives in tensors on the device and is changed in place,
    and the step reads nothing back to the host, so that a fixed-shape step can be
    recorded once and replayed (a CUDA graph) as well as run directly:

    * ``alive`` (G,): grid points whose every loss so far was finite; a non-finite loss
      stops its grid point before the update, as a training of its own would;
    * ``updates`` (G,): the updates each grid point made (a stopped one: the update that
      failed is ``updates + 1``);
    * ``sums`` (2, G), float64: ``sum_batches loss * batch size`` (row 0) and the same of
      the penalty (row 1) since the last :meth:`reset_sums`, the epoch's curve;
    * ``neg_lr`` (G,): minus each grid point's current learning rate (the schedule sets
      it between steps, :meth:`set_learning_rates`).

    ``adv_norm`` (p, or None): with the one-step attack's fractions, the step first makes
    each grid point's adversarial samples (:func:`crosslip.attacks.one_step_stacked`), so
    that they are part of what is recorded.
    """

    def __init__(
        self,
        stack: StackedSoftplusNet,
        cfgs: Sequence[TrainConfig],
        adv_norm: float | None = None,
        certified: CertifiedMargin | None = None,
    ) -> None:
        self.stack = stack
        self.adv_norm = adv_norm
        p = stack.U
        opts = {"dtype": p.dtype, "device": p.device}
        regs = [c.regularizer for c in cfgs]
        self.cl, self.wd = _span(regs, "cross_lipschitz"), _span(regs, "weight_decay")
        self.cm = _span(regs, "certified_margin")
        if (self.cm is None) != (certified is None):
            raise ValueError("a grid with certified_margin networks needs their state, only then")
        self.certified = certified
        # the penalty vector in pieces: zeros, weight decay, Cross-Lipschitz, certified
        # margin, in stack order
        spans = ((self.cl, "cl"), (self.wd, "wd"), (self.cm, "cm"))
        self.pieces = sorted([(s.start, s.stop, kind) for s, kind in spans if s])
        size = len(cfgs)
        self.lam = torch.tensor([c.lam for c in cfgs], **opts)
        self.neg_lr = torch.tensor([-c.lr for c in cfgs], **opts)
        self.alive = torch.ones(size, dtype=torch.bool, device=p.device)
        self.updates = torch.zeros(size, dtype=torch.int64, device=p.device)
        self.sums = torch.zeros(2, size, dtype=torch.float64, device=p.device)

    def objective(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        input_scale: torch.Tensor | None = None,
        hidden_scale: torch.Tensor | None = None,
        weights: Sequence[tuple[torch.Tensor, torch.Tensor]] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per grid point, the mean cross-entropy on the batch and the penalty without
        lambda (eq. L-Alg), each (G,), for ``x`` (n, d) or (G, n, d) and labels ``y`` (n,).
        Cross-Lipschitz uses the forward's preactivation, as :func:`crosslip.training.single.
        objective_terms` does. ``weights``: the ``(U, W)`` each penalty piece reads (by
        default slices of the stack's)."""
        stack = self.stack
        logits, z = stack.logits_and_preactivation(x, input_scale, hidden_scale)
        size, n = logits.shape[:2]
        ce = F.cross_entropy(logits.transpose(1, 2), y.expand(size, n), reduction="none")
        ce = ce.mean(1)
        if weights is None:
            weights = [(stack.U[a:b], stack.W[a:b]) for a, b, _ in self.pieces]
        parts, at = [], 0
        for (start, stop, kind), (u, w) in zip(self.pieces, weights, strict=True):
            if start > at:
                parts.append(ce.new_zeros(start - at))
            if kind == "cl":
                s = stack.sigma_prime(z[start:stop])
                parts.append(cross_lipschitz_closed_form(s, w, u))
            elif kind == "cm" and self.certified is not None:
                done = self.updates[start:stop]
                zp, lp = z[start:stop], logits[start:stop]
                parts.append(self.certified.penalty(zp, lp, y, u, w, done))
            else:
                parts.append(half_squared_norm([u, w], leading=1))
            at = stop
        if at < size:
            parts.append(ce.new_zeros(size - at))
        return ce, parts[0] if len(parts) == 1 else torch.cat(parts)

    def __call__(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        input_scale: torch.Tensor | None = None,
        hidden_scale: torch.Tensor | None = None,
        fractions: torch.Tensor | None = None,
    ) -> None:
        """Forward, backward and update of every grid point on the batch ``(x, y)``; with
        ``fractions`` (m,), the first m points of ``x`` (n, d) are first replaced by each
        grid point's one-step samples (:meth:`one_step_inputs`).

        The penalties read their grid points' weights as leaves of their own (views of
        the stack's, without a graph to it), whose gradients are then added to those
        slices of the stack's gradients in place: a penalty of a few grid points costs no
        gradient of the whole stack's size (as differentiating a slice would)."""
        stack = self.stack
        if fractions is not None:
            x = self.one_step_inputs(x, fractions)
        pieces = [
            (stack.U[a:b].detach().requires_grad_(), stack.W[a:b].detach().requires_grad_())
            for a, b, _ in self.pieces
        ]
        ce, penalty = self.objective(x, y, input_scale, hidden_scale, pieces)
        loss = ce + self.lam * penalty
        self.alive.logical_and_(torch.isfinite(loss))
        params = list(stack.parameters())
        grads = torch.autograd.grad(loss.sum(), [*params, *(t for uw in pieces for t in uw)])
        with torch.no_grad():
            grads, extra = list(grads[: len(params)]), grads[len(params) :]
            for i, (a, b, _) in enumerate(self.pieces):
                grads[0][a:b].add_(extra[2 * i])
                grads[1][a:b].add_(extra[2 * i + 1])
            stopped = ~self.alive
            for param, grad in zip(params, grads, strict=True):
                view = (-1,) + (1,) * (param.dim() - 1)
                param.addcmul_(grad.masked_fill_(stopped.view(view), 0.0), self.neg_lr.view(view))
            self.updates.add_(self.alive)
            terms = torch.stack([loss.detach(), penalty.detach()])
            self.sums.add_(terms.masked_fill(stopped, 0).double(), alpha=y.shape[0])

    def one_step_inputs(self, x: torch.Tensor, fractions: torch.Tensor) -> torch.Tensor:
        """The batch of every grid point, (G, n, d): ``x`` (n, d) with its first m =
        len(fractions) points replaced by that grid point's one-step samples in the norm
        ``adv_norm`` (no dropout; fixed shapes, nothing read back to the host)."""
        if self.adv_norm is None:
            raise ValueError("this step makes no adversarial samples (adv_norm is None)")
        size, (n, d), m = self.stack.size, x.shape, fractions.shape[0]
        first = one_step_stacked(self.stack, x[:m], fractions, self.adv_norm)
        return torch.cat([first, x[m:].expand(size, n - m, d)], dim=1)

    def state(self) -> list[torch.Tensor]:
        """Every tensor a step changes: the weights and the bookkeeping."""
        return [*self.stack.parameters(), self.alive, self.updates, self.sums]

    def set_learning_rates(self, lrs: Sequence[float]) -> None:
        """Set every grid point's learning rate (host values, copied into the step)."""
        lr = self.neg_lr
        lr.copy_(torch.tensor([-v for v in lrs], dtype=lr.dtype, device=lr.device))

    def reset_sums(self) -> None:
        self.sums.zero_()


def release_default_generator(device: torch.device) -> None:
    """Give ``device``'s default generator a fresh state with the same seed and offset.

    A capture marks that generator as capturing and unmarks it only when the capture ends
    well; after a failed one, every later random draw on the device (a network's
    initialisation, an attack's restarts) raises "Offset increment outside graph capture
    encountered unexpectedly" (seen on an H200, torch 2.11). The cloned state is not marked,
    so the draws go on where they were."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    gen = torch.cuda.default_generators[index]
    gen.graphsafe_set_state(gen.clone_state())


class RecordedStep:
    """A :class:`GridStep` on CUDA recorded once as a CUDA graph and replayed for every
    full batch: one launch per step instead of one per operation (a step of a 784-1024-10
    network is a few dozen small kernels, each costing more to launch than to run at batch
    64). The batch (and dropout scales) are copied into the graph's own input buffers
    before each replay; the last, shorter batch of an epoch runs the step directly.

    Everything happens on the device of the inputs (``cuda:N``, whatever the current
    device): recording runs the step twice on a side stream first (to set up cuBLAS and the
    allocator), with every tensor the step changes saved before and restored after (also
    when a run fails), then captures it on that stream, so the training is exactly as if
    the step had only ever been replayed. A failure leaves the step's state and the current
    stream as they were and raises."""

    def __init__(self, step: GridStep, *inputs: torch.Tensor | None) -> None:
        self.step = step
        self.device = inputs[0].device
        with torch.cuda.device(self.device):
            main = torch.cuda.current_stream(self.device)
            self.inputs = [None if t is None else t.clone() for t in inputs]
            saved = [t.detach().clone() for t in step.state()]
            side = torch.cuda.Stream(device=self.device)
            side.wait_stream(main)
            try:
                with torch.cuda.stream(side):
                    for _ in range(2):
                        step(*self.inputs)
            finally:
                main.wait_stream(side)
                with torch.no_grad():
                    for t, value in zip(step.state(), saved, strict=True):
                        t.copy_(value)
            self.graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(self.graph, stream=side):
                    step(*self.inputs)
            except BaseException:
                release_default_generator(self.device)
                raise
            finally:  # a failed capture can leave its stream current
                torch.cuda.set_stream(main)

    def __call__(self, *inputs: torch.Tensor | None) -> None:
        for buffer, t in zip(self.inputs, inputs, strict=True):
            if buffer is not None:
                buffer.copy_(t)
        self.graph.replay()  # on the graph's device (the replay guards it)


def record_step(step: GridStep, *inputs: torch.Tensor | None) -> RecordedStep | None:
    """The step as a :class:`RecordedStep`, or None (logged, with the error's cause: a
    capture reports "operation failed due to a previous error during capture" and the
    operation that failed as its cause) where recording fails: the training then runs the
    step directly, as on the CPU, from the same state."""
    try:
        return RecordedStep(step, *inputs)
    except RuntimeError as exc:
        causes = dict.fromkeys(c for c in (exc, exc.__cause__, exc.__context__) if c is not None)
        LOG.warning(
            "train: the step could not be recorded as a CUDA graph (%s); it runs op by op",
            "; ".join(str(c).strip().splitlines()[0] for c in causes if str(c).strip()),
        )
        return None


@torch.no_grad()
def grid_errors(stack: StackedSoftplusNet, x: torch.Tensor, y: torch.Tensor) -> list[float]:
    """Fraction of misclassified points of ``(x, y)`` for every network of ``stack`` (no
    dropout), in chunks of about :data:`EVAL_ELEMENTS` hidden activations."""
    size, h = stack.size, stack.U.shape[1]
    rows = max(1, EVAL_ELEMENTS // (size * h))
    wrong = torch.zeros(size, dtype=torch.int64, device=stack.U.device)
    for i in range(0, len(x), rows):
        logits = stack(x[i : i + rows])
        wrong += (logits.argmax(2) != y[i : i + rows]).sum(1)
    return [w / max(len(x), 1) for w in wrong.tolist()]


def _networks(
    specs: Sequence[TrainConfig], shared: dict[str, Any], in_dim: int, num_classes: int
) -> list[SoftplusNet]:
    """A copy per grid point (with its dropout) of the seed's initial network, drawn as
    :func:`crosslip.training.single.train` draws it (the global RNG freshly seeded)."""
    shape = (in_dim, num_classes, shared["hidden"], shared["alpha"], shared["bias"])
    template = SoftplusNet(*shape, init=shared["init"])
    nets = []
    for cfg in specs:
        net = SoftplusNet(*shape, keep_hidden=cfg.keep_hidden, keep_input=cfg.keep_input)
        net.load_state_dict(template.state_dict())
        nets.append(net)
    return nets


@in_tf32(lambda cfgs, *args, **kwargs: shared_settings(cfgs)["tf32"])
def train_grid(
    cfgs: Sequence[TrainConfig],
    data: Dataset,
    device: torch.device | str = "cpu",
    masks: type[DropoutMasks] = DropoutMasks,
    tags: Sequence[str] | None = None,
    cuda_graph: bool = True,
    on_epoch: Callable[[int, list[SoftplusNet]], None] | None = None,
) -> list[TrainResult]:
    """Train the networks ``cfgs`` (which share everything but :data:`PER_NETWORK`) on
    ``data`` as one batched model on ``device``. Read from ``data`` as by
    :func:`crosslip.training.single.train`: ``x_train`` (n, d), ``y_train`` (n,), ``x_test``
    (n_test, d), ``y_test`` (n_test,), ``num_classes``, and the image shape ``shape``, which
    the augment setting needs as (h, w, c). Returns one
    :class:`crosslip.training.core.TrainResult` per spec,
    in the order given, each model on the CPU with the metrics of
    :func:`crosslip.training.single.train` (``seconds`` is the whole batch's) and ``grid_networks``
    (G). ``masks``: the class of the dropout masks (:class:`DropoutMasks`: a generator on
    ``device`` per dropout network); ``tags``: one name per network for its
    progress lines (:data:`crosslip.progress.TAG`). ``cuda_graph``: on CUDA, replay the
    full batches' step as a CUDA graph (:class:`RecordedStep`); the metrics say whether it
    did (``cuda_graph``). ``on_epoch``: called after every epoch as ``on_epoch(epoch,
    networks)`` with the epochs done (1-based) and a copy of every network (on the CPU, in
    eval mode, in the order of ``cfgs``; a diverged one holds its last weights), for
    checkpoints or diagnostics along the way; it must not change the training's state.
    The shared ``tf32``: on CUDA, float32 products may use TF32 (:func:`crosslip.device.tf32`;
    off: IEEE float32)."""
    shared = shared_settings(cfgs)
    order = sorted(range(len(cfgs)), key=lambda i: REGULARIZER_ORDER.index(cfgs[i].regularizer))
    specs = [cfgs[i] for i in order]
    names = [tags[i] if tags else f"network {i}" for i in order]
    size = len(specs)
    device = torch.device(device)
    seed, epochs, batch_size = shared["seed"], shared["epochs"], shared["batch_size"]
    setting = shared["setting"]
    td = core.setup_data(specs[0], data, device)

    torch.manual_seed(seed)  # the initialisation of a training of its own: the same draws
    with torch.device("cpu"):
        nets = _networks(specs, shared, td.in_dim, data.num_classes)
    stack = StackedSoftplusNet(nets).to(device)
    gens = core.generators(seed)
    one_step = makes_one_step_samples(specs[0])
    dropout = masks(specs, device)
    n, batches = td.n, td.batches
    schedule = core.Schedule(specs, epochs * batches)
    certified = None
    cm = _span([c.regularizer for c in specs], "certified_margin")
    if cm is not None:
        warm = warmup_updates(shared["certified_warmup"], epochs * batches)
        radius = shared["certified_radius"]
        certified = CertifiedMargin(
            stack.U[cm], stack.W[cm], stack.alpha, radius, warm, gens.certified
        )
    adv_norm = norm_p(shared["adv_norm"]) if one_step else None
    step = GridStep(stack, specs, adv_norm, certified)
    curves: list[list[dict[str, float]]] = [[] for _ in specs]
    status = ["ok"] * size
    progress = Progress(
        f"train {size} networks", epochs, "epochs", every=1 / max(epochs, 1), fractional=True
    )
    lines = [
        Progress("train", epochs, "epochs", every=1 / max(epochs, 1), tag=names[g], bar=False)
        for g in range(size)
    ]
    LOG.info(
        "train: %d networks as one batched model on %s: %s",
        size,
        device,
        ", ".join(names),
    )
    graphs = cuda_graph and device.type == "cuda"
    recorded: RecordedStep | None = None
    t0 = time.perf_counter()
    updates = 0
    for epoch in range(epochs):
        t_epoch = time.perf_counter()
        stack.train()
        alive_before = step.alive.tolist()
        perm = torch.randperm(n, generator=gens.batches, device="cpu").to(device)
        xperm, yperm = td.x[perm], td.y[perm]
        fractions = adversarial_fractions(specs[0], batches, gens.adversarial)
        if fractions is not None:  # one copy per epoch
            fractions = fractions.to(device, td.x.dtype)
        for b, i in enumerate(range(0, n, batch_size)):
            xb, yb = xperm[i : i + batch_size], yperm[i : i + batch_size]
            if td.augmenting:
                colour = data.shape[2] == 3
                xb = augment(xb, data.shape, gens.augment, size=shared["crop"], colour=colour)
            elif setting == "adversarial" and not one_step:
                xb = adversarial_inputs(stack, xb, specs[0])
            input_scale, hidden_scale = dropout.scales(len(yb), xb.shape[-1], stack.U.shape[1], xb)
            inputs: tuple[torch.Tensor | None, ...] = (xb, yb, input_scale, hidden_scale)
            if fractions is not None:  # the samples are made inside the step
                inputs += (fractions[b, : adversarial_rows(specs[0], len(yb))],)
            if graphs and len(yb) == batch_size and recorded is None:
                recorded = record_step(step, *inputs)
                graphs = recorded is not None
            (recorded if recorded is not None and len(yb) == batch_size else step)(*inputs)
            updates += 1
            if schedule.after_update(updates):
                step.set_learning_rates(schedule.lrs)
            progress.advance_bar(1 / batches)
        alive, done = step.alive.tolist(), step.updates.tolist()
        loss_sum, penalty_sum = step.sums.tolist()
        step.reset_sums()
        train_errors = grid_errors(stack, td.x_eval, td.y) if any(alive) else []
        seconds = time.perf_counter() - t_epoch
        for g in range(size):
            if not alive_before[g]:
                continue
            if not alive[g]:
                status[g] = "diverged"
                core.log_diverged(epoch + 1, done[g] + 1, extra={"crosslip_model": names[g]})
                lines[g].close()
                continue
            sums = (loss_sum[g], penalty_sum[g])
            core.record_epoch(
                curves[g], lines[g], sums, n, train_errors[g], schedule.lrs[g], seconds
            )
        progress.update(1, networks_training=sum(alive))
        if on_epoch is not None:
            copies = [stack.network(g).cpu().eval() for g in range(size)]
            on_epoch(epoch + 1, [copies[order.index(i)] for i in range(size)])
        if not any(alive):
            break
    progress.close()
    for line in lines:
        line.close()
    seconds = time.perf_counter() - t0
    results: list[TrainResult | None] = [None] * size
    for g, cfg in enumerate(specs):
        net = stack.network(g).cpu().eval()
        metrics = core.metrics(cfg, net, status[g], curves[g], td, data.y_test, seconds, device)
        metrics.update(grid_networks=size, cuda_graph=recorded is not None)
        results[order[g]] = TrainResult(net, metrics)
    return [r for r in results if r is not None]
