"""Training benchmark: the cost of one SGD step per regularizer, side by side.

784-1024-10 softplus network (``--hidden`` sets the 1024; the smoke test's is 64), float32,
batches of real MNIST digits (mnist5k): one step (forward, loss, backward, update) for plain
SGD, weight decay, dropout and Cross-Lipschitz in closed form, exactly as
``crosslip.training.single`` computes them, and two baselines:
Cross-Lipschitz by double backpropagation (``cross_lipschitz_autograd``, the generic method)
and the same closed form differentiated by autograd instead of by its hand-written backward.
The kinds take turns in rounds (one untimed step, then ``--block`` timed steps each), so that
load from other processes hits all of them alike; each time is the median of its steps.
Ratios to plain; the same at batch 1024.

The *arithmetic bound* of an exact Cross-Lipschitz step is its flop count divided by this
machine's measured float32 matrix-product rate: the closed form needs the class-centred input
gradients ``Y = A U`` with ``A = s * (Q W)`` of shape (n (K-1), H) (``Q`` the Helmert
contrasts: K - 1 rows carry all of them), i.e. ``2 n (K-1) H d`` flops forward and twice
that backward (``dA = Y U^T``, ``dU = A^T Y``), plus the plain step ``6 n d H``; the
alternative Gram form (``U U^T`` and ``sum_i s_i s_i^T``) needs ``4 H^2 d + 4 n H^2`` with
its backward and is cheaper when ``n K`` is well above ``H``; the bound takes the smaller
(``crosslip.training.regularizers.cross_lipschitz_flops``), at the rate the machine gave while the
steps were timed (the products the bound counts take their turn in each round, and the
fastest of each round counts). Kernel: time
per L-BFGS iteration with 2,000 expansion points on MNIST. ``--device`` (``auto``: CUDA if
torch sees one) runs all of it on that device; CUDA is synchronised before every clock
reading, so the times cover the computation.
Run: ``.venv/bin/python benchmarks/bench_train.py [--device auto]``; the last line is one
JSON object.
"""

from __future__ import annotations

import argparse
import statistics
from functools import partial

import torch
import torch.nn.functional as F

from _harness import finish, parser, start, timed
from crosslip.data import load_dataset
from crosslip.models import SoftplusNet
from crosslip.training.certified_margin import CertifiedMargin
from crosslip.training.core import TrainConfig
from crosslip.training.kernel import KernelTrainConfig, train_kernel
from crosslip.training.regularizers import cross_lipschitz_autograd, cross_lipschitz_flops, helmert
from crosslip.training.single import GradientDescent, objective_terms

HIDDEN, K = 1024, 10
LAM = 1e-3
#: The certified margin's radius (MNIST's L2 1.58), from the first step on.
RADIUS = 1.58


def _closed_form_by_autograd(net: SoftplusNet, x: torch.Tensor) -> torch.Tensor:
    """Baseline: the same closed form (K - 1 contrasts, the form ``auto`` picks for the
    batch) differentiated by autograd instead of the hand-written backward of
    ``cross_lipschitz_softplus``."""
    s = net.sigma_prime(net.preactivation(x))
    q = helmert(K, net.W.dtype, net.W.device) @ net.W
    flops = cross_lipschitz_flops(len(x), x.shape[1], K, net.U.shape[0])
    if flops["gram"] < flops["gradients"]:
        total = ((net.U @ net.U.T) * (q.T @ q) * (s.T @ s)).sum()
    else:
        total = ((s[:, None, :] * q[None]) @ net.U).pow(2).sum()
    return 2.0 * total / (len(x) * K)


def _objective(kind: str):
    """(net, x, y) -> loss of one training step; the first four are exactly the training
    code's objective (``crosslip.training.single.objective_terms``), the last two are baselines."""
    if kind in ("cross_lipschitz_double_backprop", "cross_lipschitz_autograd_backward"):
        pen = cross_lipschitz_autograd if "double" in kind else _closed_form_by_autograd
        return lambda net, x, y: F.cross_entropy(net(x), y) + LAM * pen(net, x)
    lam = {"plain": 0.0, "dropout": 0.0, "certified_margin": 1.0}.get(kind, LAM)
    keep = {"keep_hidden": 0.5, "keep_input": 0.9} if kind == "dropout" else {}
    cfg = TrainConfig(regularizer="none" if kind == "plain" else kind, lam=lam, **keep)
    state: list[CertifiedMargin] = []

    def loss(net: SoftplusNet, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if kind == "certified_margin" and not state:  # the whole radius from the start
            gen = torch.Generator().manual_seed(0)
            state.append(CertifiedMargin(net.U, net.W, net.alpha, RADIUS, 0, gen))
        ce, pen = objective_terms(net, x, y, cfg, state[0] if state else None)
        return ce + cfg.lam * pen

    return loss


KINDS = (
    "plain",
    "weight_decay",
    "dropout",
    "cross_lipschitz",
    "certified_margin",
    "cross_lipschitz_double_backprop",
    "cross_lipschitz_autograd_backward",
)


def gemm_shapes(h: int) -> tuple[tuple[int, int, int], ...]:
    """(m, k, n) of the products the arithmetic bounds count, for ``h`` hidden units:
    (n (K-1), h) x (h, d) of the gradient form at batch 64; (h, d) x (d, h), (h, h) x (h, d)
    and (h, n) x (n, h) of the Gram form at batch 1024."""
    return (64 * (K - 1), h, 784), (h, 784, h), (h, h, 784), (h, 1024, h)


def sgd_step(net: SoftplusNet, opt: GradientDescent, objective, x, y) -> None:
    """One SGD step of ``net`` on ``objective`` (the timed unit)."""
    loss = objective(net, x, y)
    opt.zero_grad()
    loss.backward()
    opt.step()


def step_seconds(
    x: torch.Tensor, y: torch.Tensor, rounds: int, block: int = 4, hidden: int = HIDDEN
) -> tuple[dict[str, float], float]:
    """Median wall time of one SGD step per kind, and the float32 matrix-product rate
    (flop/s) the machine gave meanwhile.

    The kinds take turns: in each round every kind runs one untimed step (its caches warm
    again after the other kinds ran) and then ``block`` timed steps in a row, as in
    training; then each product of :func:`gemm_shapes` runs ``block + 1`` times. The rate is the
    median over the rounds of the round's fastest product. Everything runs on ``x``'s
    device."""
    dev = x.device
    runs = {}
    for kind in KINDS:
        torch.manual_seed(0)
        keep = (0.5, 0.9) if kind == "dropout" else (1.0, 1.0)
        net = SoftplusNet(x.shape[1], K, hidden, keep_hidden=keep[0], keep_input=keep[1])
        net = net.to(dev).train()
        runs[kind] = (net, GradientDescent(net.parameters(), lr=0.01), _objective(kind))
    mats = [
        (torch.randn(m, k, device=dev), torch.randn(k, n, device=dev))
        for m, k, n in gemm_shapes(hidden)
    ]
    times: dict[str, list[float]] = {kind: [] for kind in KINDS}
    rates: list[float] = []
    for i in range(rounds + 1):
        for kind, (net, opt, objective) in runs.items():
            for j in range(block + 1):
                seconds = timed(partial(sgd_step, net, opt, objective, x, y), dev)[1]
                if i > 0 and j > 0:
                    times[kind].append(seconds)
        best = 0.0
        for a, b in mats:
            for _ in range(block + 1):
                seconds = timed(partial(torch.matmul, a, b), dev)[1]
                best = max(best, 2 * a.numel() * b.shape[1] / seconds)
        if i > 0:
            rates.append(best)
    return {kind: statistics.median(t) for kind, t in times.items()}, statistics.median(rates)


def cl_bound_flops(n: int, d: int, h: int = HIDDEN) -> float:
    """Flops of an exact CL step with ``h`` hidden units: the plain step's three (n, d) x
    (d, h)-sized products plus the cheaper exact form, forward and backward
    (``cross_lipschitz_flops``)."""
    return 6 * n * d * h + min(cross_lipschitz_flops(n, d, K, h).values())


def arguments() -> argparse.ArgumentParser:
    """The benchmark's options (module docstring)."""
    ap = parser(__doc__)
    ap.add_argument("--rounds", type=int, default=8, help="timed rounds at batch 64")
    ap.add_argument("--rounds-1024", type=int, default=2, help="timed rounds at batch 1024")
    ap.add_argument("--block", type=int, default=4, help="timed steps per kind and round")
    ap.add_argument(
        "--hidden", type=int, default=HIDDEN, help="hidden units (the paper's MNIST net: 1024)"
    )
    ap.add_argument("--kernel-centers", type=int, default=2000)
    ap.add_argument("--kernel-iterations", type=int, default=20)
    return ap


def main() -> None:
    bench = start(arguments())
    args, dev = bench.args, bench.device
    ds = load_dataset("mnist5k")
    res: dict = bench.header()
    res["hidden"] = args.hidden
    for batch, rounds in ((64, args.rounds), (1024, args.rounds_1024)):
        x = torch.as_tensor(ds.x_train[:batch]).to(dev)
        y = torch.as_tensor(ds.y_train[:batch]).to(dev)
        secs, rate = step_seconds(x, y, rounds, args.block, args.hidden)
        bound = cl_bound_flops(batch, x.shape[1], args.hidden) / rate
        tag = "" if batch == 64 else f"_batch{batch}"
        res[f"gemm_gflops_float32{tag}"] = rate / 1e9
        res[f"step_seconds{tag}"] = secs
        res[f"ratio_cl_to_plain{tag}"] = secs["cross_lipschitz"] / secs["plain"]
        res[f"ratio_certified_margin_to_cl{tag}"] = (
            secs["certified_margin"] / secs["cross_lipschitz"]
        )
        res[f"ratio_cl_to_double_backprop{tag}"] = (
            secs["cross_lipschitz"] / secs["cross_lipschitz_double_backprop"]
        )
        res[f"cl_arithmetic_bound_seconds{tag}"] = bound
        res[f"ratio_cl_to_arithmetic_bound{tag}"] = secs["cross_lipschitz"] / bound
    cfg = KernelTrainConfig(
        regularizer="kernel_cl",
        lam=0.1,
        n_centers=args.kernel_centers,
        max_iter=args.kernel_iterations,
    )
    kern = train_kernel(cfg, ds.head(test=10), device=dev)
    res["kernel_centers"] = kern.metrics["n_centers"]
    res["kernel_seconds"] = kern.metrics["seconds"]
    res["kernel_setup_seconds"] = kern.metrics["setup_seconds"]
    res["kernel_lbfgs_iterations"] = kern.metrics["lbfgs_iterations"]
    res["kernel_seconds_per_lbfgs_iteration"] = kern.metrics["seconds_per_lbfgs_iteration"]
    res["kernel_objective_evaluations"] = len(kern.metrics["curve"])

    print(bench.machine_line())
    print(f"784-{args.hidden}-{K} softplus network, float32")
    for batch in (64, 1024):
        tag = "" if batch == 64 else f"_batch{batch}"
        secs = res[f"step_seconds{tag}"]
        parts = [f"{k} {1e3 * v:.1f} ms (x{v / secs['plain']:.2f})" for k, v in secs.items()]
        print(f"batch {batch}: " + ", ".join(parts))
        print(
            f"  float32 matrix products meanwhile: {res['gemm_gflops_float32' + tag]:.0f} GFLOP/s"
        )
        print(
            f"  Cross-Lipschitz closed form: x{res['ratio_cl_to_plain' + tag]:.2f} plain, "
            f"x{res['ratio_cl_to_double_backprop' + tag]:.2f} double backprop, "
            f"x{res['ratio_cl_to_arithmetic_bound' + tag]:.2f} the arithmetic bound "
            f"({1e3 * res['cl_arithmetic_bound_seconds' + tag]:.1f} ms)"
        )
        print(
            f"  certified margin: x{res['ratio_certified_margin_to_cl' + tag]:.2f} "
            "Cross-Lipschitz's exact step"
        )
    print(
        f"kernel ({res['kernel_centers']} centres, {len(ds.x_train)} training points): setup "
        f"{res['kernel_setup_seconds']:.2f} s, then "
        f"{1e3 * res['kernel_seconds_per_lbfgs_iteration']:.0f} ms per L-BFGS iteration "
        f"({res['kernel_lbfgs_iterations']} iterations, "
        f"{res['kernel_objective_evaluations']} objective evaluations)"
    )
    finish(res)


if __name__ == "__main__":
    main()
