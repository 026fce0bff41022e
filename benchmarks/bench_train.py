"""Training benchmark (issue 5): the cost of one SGD step per regularizer, side by side.

784-1024-10 softplus network, float32, batches of real MNIST digits (mnist5k): one step
(forward, loss, backward, update) for plain SGD, weight decay, dropout, Cross-Lipschitz in
closed form, and Cross-Lipschitz by double backpropagation; ratios to plain; the same at
batch 1024. The *arithmetic bound* of an exact Cross-Lipschitz step is its multiply-add
count divided by this machine's measured float32 matrix-product rate: the closed form needs
the class-centred input gradients ``A U`` with ``A = s * (Q W)`` of shape (n (K-1), H)
(``Q`` the Helmert contrasts: K - 1 rows carry all of them), i.e. ``2 n (K-1) H d`` flops
forward and twice that backward (``dA = dG U^T``, ``dU = A^T dG``), plus
the plain step ``6 n d H``; the alternative Gram form (``U U^T`` and ``sum_i s_i s_i^T``)
needs ``4 H^2 d + 4 n H^2`` with its backward and is cheaper when ``n K`` is well above ``H``;
the bound takes the smaller, at the peak measured rate. Kernel: time per L-BFGS iteration
with 2,000 expansion points on MNIST.
Run: ``.venv/bin/python benchmarks/bench_train.py``; the last line is one JSON object.
"""

from __future__ import annotations

import json
import os
import statistics
import time

import torch
import torch.nn.functional as F

from crosslip.data import load_dataset
from crosslip.device import describe_machine
from crosslip.kernel_train import KernelTrainConfig, train_kernel
from crosslip.models import SoftplusNet
from crosslip.regularizers import (
    cross_lipschitz_autograd,
    cross_lipschitz_softplus,
    weight_decay,
)

H, K = 1024, 10
KINDS = {
    "plain": lambda net, x: x.new_zeros(()),
    "weight_decay": lambda net, x: weight_decay(net),
    "dropout": lambda net, x: x.new_zeros(()),
    "cross_lipschitz": cross_lipschitz_softplus,
    "cross_lipschitz_double_backprop": cross_lipschitz_autograd,
}


def step_seconds(kind: str, x: torch.Tensor, y: torch.Tensor, steps: int) -> float:
    """Median wall time of one SGD step (after warm-up)."""
    torch.manual_seed(0)
    net = SoftplusNet(x.shape[1], K, H, dropout=0.5 if kind == "dropout" else 0.0).train()
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    pen_fn = KINDS[kind]
    times = []
    for i in range(steps + 3):
        t0 = time.perf_counter()
        loss = F.cross_entropy(net(x), y) + 1e-3 * pen_fn(net, x)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if i >= 3:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def gemm_rate() -> float:
    """Peak measured float32 matrix-product rate (flop/s): the best of 9 runs of the
    (n K, H) x (H, d) product of a CL step at batch 64 and of a (H, d) x (d, H) product."""
    best = 0.0
    for a, b in ((torch.randn(64 * K, H), torch.randn(H, 784)),
                 (torch.randn(H, 784), torch.randn(784, H))):  # fmt: skip
        a @ b
        for _ in range(9):
            t0 = time.perf_counter()
            a @ b
            best = max(best, 2 * a.shape[0] * a.shape[1] * b.shape[1] / (time.perf_counter() - t0))
    return best


def cl_bound_flops(n: int, d: int) -> float:
    """Multiply-adds x 2 of an exact CL step: the plain step plus the cheaper exact form,
    forward and backward (module docstring)."""
    plain = 6 * n * d * H
    closed = 6 * n * (K - 1) * H * d
    gram = 4 * H * H * d + 4 * n * H * H
    return plain + min(closed, gram)


def main() -> None:
    torch.set_num_threads(os.cpu_count() or 1)
    ds = load_dataset("mnist5k")
    rate = gemm_rate()
    res: dict = {"machine": describe_machine(), "gemm_gflops_float32": rate / 1e9}
    for batch, steps in ((64, 30), (1024, 8)):
        x = torch.as_tensor(ds.x_train[:batch])
        y = torch.as_tensor(ds.y_train[:batch])
        secs = {k: step_seconds(k, x, y, steps) for k in KINDS}
        bound = cl_bound_flops(batch, x.shape[1]) / rate
        tag = "" if batch == 64 else f"_batch{batch}"
        res[f"step_seconds{tag}"] = secs
        res[f"ratio_cl_to_plain{tag}"] = secs["cross_lipschitz"] / secs["plain"]
        res[f"ratio_cl_to_double_backprop{tag}"] = (
            secs["cross_lipschitz"] / secs["cross_lipschitz_double_backprop"]
        )
        res[f"cl_arithmetic_bound_seconds{tag}"] = bound
        res[f"ratio_cl_to_arithmetic_bound{tag}"] = secs["cross_lipschitz"] / bound
    cfg = KernelTrainConfig(regularizer="kernel_cl", lam=0.1, n_centers=2000, max_iter=20)
    kern = train_kernel(cfg, ds.x_train, ds.y_train, ds.x_test[:10], ds.y_test[:10], 10)
    res["kernel_centers"] = 2000
    res["kernel_setup_and_20_lbfgs_iterations_seconds"] = kern.metrics["seconds"]
    res["kernel_objective_evaluations"] = len(kern.metrics["curve"])

    print(f"machine: {res['machine']}; float32 GEMM {res['gemm_gflops_float32']:.0f} GFLOP/s")
    for batch in (64, 1024):
        tag = "" if batch == 64 else f"_batch{batch}"
        secs = res[f"step_seconds{tag}"]
        parts = [f"{k} {1e3 * v:.1f} ms (x{v / secs['plain']:.2f})" for k, v in secs.items()]
        print(f"batch {batch}: " + ", ".join(parts))
        print(f"  Cross-Lipschitz closed form: x{res['ratio_cl_to_plain' + tag]:.2f} plain, "
              f"x{res['ratio_cl_to_double_backprop' + tag]:.2f} double backprop, "
              f"x{res['ratio_cl_to_arithmetic_bound' + tag]:.2f} the arithmetic bound "
              f"({1e3 * res['cl_arithmetic_bound_seconds' + tag]:.1f} ms)")  # fmt: skip
    print(f"kernel (2000 centres): setup + 20 L-BFGS iterations "
          f"{res['kernel_setup_and_20_lbfgs_iterations_seconds']:.1f} s "
          f"({res['kernel_objective_evaluations']} objective evaluations)")  # fmt: skip
    print(json.dumps(res))


if __name__ == "__main__":
    main()
