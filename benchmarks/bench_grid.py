"""Grid benchmark: networks of the MNIST grid trained as one batched model against one
training per network, side by side.

The networks are those of the MNIST preset's plain setting (``config/presets/mnist.yaml``:
784-1024-10 softplus networks, no weight decay ... Cross-Lipschitz, two learning rates; 26 in
all). For each size G of ``--sizes`` (default 1, 8 and 26: one Cross-Lipschitz network, the
eight Cross-Lipschitz networks, the whole grid) they are trained for ``--epochs`` on
``--points`` real digits (float32, batch 64) in two ways that take turns (``--rounds``):

* **batched**: :func:`crosslip.training.grid.train_grid`, one model of G stacked networks
  (on CUDA its full batches' step replayed as a CUDA graph);
* **separate**: :func:`crosslip.training.single.train` for each network, one after the other: what
one
  process per model computes, without the processes' start-up (about 2 s each here).

Figures per G: the seconds of each (median over the rounds), network-epochs per second (a
network-epoch: one pass of one network over 60,000 digits, the full MNIST training set, at
the measured rate), the speedup of batched over separate, and the *arithmetic bound*: the
step's matrix-product flops (forward ``2 n d H + 2 n H K``, backward ``2 n d H + 4 n H K``
per network, plus for Cross-Lipschitz the cheaper exact form,
``crosslip.training.regularizers.cross_lipschitz_flops``) over the float32 matrix-product rate this
machine gave meanwhile (the fastest of the step's own product shapes); the ratio of the
batched time to it says how far from the arithmetic the training runs (launches, memory
traffic, Python). Also the operations of one step (each a kernel launch on a GPU; views and
allocations not counted), batched against G separate steps. The last line is one JSON
object; ``speedup_batched_vs_separate`` and ``ratio_to_arithmetic_bound`` are those of the
largest G; ``grid_job_trains`` says which way a grid job of the workflow trains on the
device (``batched`` on CUDA, ``separate`` elsewhere: ``crosslip.stages.training.batched_on``,
since the batched model is the slower way on the CPU). ``--tf32``: the networks train with
``train.tf32`` (on CUDA, TF32 products) and the rate is measured with TF32 too, so the bound
is TF32's.
Run: ``.venv/bin/python benchmarks/bench_grid.py [--device auto] [--tf32]``
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import statistics
from functools import partial

import torch

from _harness import ROOT, finish, parser, start, timed
from crosslip.data import Dataset, load_dataset
from crosslip.device import tf32
from crosslip.models import SoftplusNet, StackedSoftplusNet
from crosslip.stages.training import batched_on
from crosslip.training.core import TrainConfig
from crosslip.training.grid import REGULARIZER_ORDER, GridStep, train_grid
from crosslip.training.regularizers import cross_lipschitz_flops
from crosslip.training.single import GradientDescent, objective_terms, train
from flops import matmul_rate
from op_count import OpCount
from presets import preset_networks

PRESET = ROOT / "config" / "presets" / "mnist.yaml"
K = 10
FULL_MNIST = 60000


def step_flops(spec: TrainConfig, n: int, d: int) -> int:
    """Matrix-product flops of one SGD step of one network (module docstring)."""
    h = spec.hidden
    flops = 4 * n * d * h + 6 * n * h * K
    if spec.regularizer == "cross_lipschitz":
        flops += min(cross_lipschitz_flops(n, d, K, h).values())
    return flops


def ops_per_step(specs: list[TrainConfig], x: torch.Tensor, y: torch.Tensor) -> tuple[int, int]:
    """(operations of one batched step of ``specs``, of one separate step of each, summed)."""
    specs = sorted(specs, key=lambda s: REGULARIZER_ORDER.index(s.regularizer))
    d, h = x.shape[1], specs[0].hidden
    nets = [SoftplusNet(d, K, h, keep_hidden=s.keep_hidden, keep_input=s.keep_input) for s in specs]
    nets = [net.to(x.device) for net in nets]
    batched = GridStep(StackedSoftplusNet(nets).to(x.device), specs)
    with OpCount() as one:
        batched(x, y)
    separate = 0
    for spec, net in zip(specs, nets, strict=True):
        opt = GradientDescent(net.parameters(), lr=spec.lr)
        with OpCount() as each:
            ce, pen = objective_terms(net, x, y, spec)
            opt.zero_grad()
            (ce + spec.lam * pen).backward()
            opt.step()
        separate += each.ops
    return one.ops, separate


def train_each(specs: list[TrainConfig], data: Dataset, device: torch.device) -> None:
    """One training per network of ``specs`` on ``data``, one after the other (the
    ``separate`` kind)."""
    for spec in specs:
        train(spec, data, device=device)


def arguments() -> argparse.ArgumentParser:
    """The benchmark's options (module docstring)."""
    ap = parser(__doc__)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 8, 26], help="grid sizes G")
    ap.add_argument("--points", type=int, default=4000, help="training digits per epoch")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2, help="turns of batched and separate")
    ap.add_argument("--hidden", type=int, default=1024, help="hidden units (1024 in the paper)")
    ap.add_argument(
        "--tf32", action="store_true", help="train.tf32: TF32 products on CUDA (rate too)"
    )
    return ap


def main() -> None:
    ap = arguments()
    bench = start(ap)
    args, dev = bench.args, bench.device
    ds = load_dataset("mnist5k")
    if args.points > len(ds.y_train):
        ap.error(f"--points {args.points}: the embedded digits have {len(ds.y_train)}")
    data = ds.head(args.points, 1000)
    x, y = data.x_train, data.y_train
    grid = [
        dataclasses.replace(s, tf32=args.tf32)
        for s in preset_networks(PRESET, "plain", args.hidden, args.epochs)
    ]
    n, d = len(x), x.shape[1]
    batch = grid[0].batch_size
    res: dict = {
        **bench.header(),
        "points": n,
        "epochs": args.epochs,
        "hidden": args.hidden,
        "grid": len(grid),
        "tf32": args.tf32,
        "sizes": {},
    }
    shapes = [(batch * (K - 1), args.hidden, d), (batch, d, args.hidden), (args.hidden, batch, d)]
    rates = []
    for size in args.sizes:
        specs = [copy.deepcopy(s) for s in grid[:size]]
        kinds = {
            "batched": partial(train_grid, specs, data, device=dev),
            "separate": partial(train_each, specs, data, dev),
        }
        times: dict[str, list[float]] = {kind: [] for kind in kinds}
        if dev.type == "cuda":  # untimed: the first call of a shape loads kernels and plans
            for fn in kinds.values():
                fn()
        for _ in range(args.rounds):
            for kind, fn in kinds.items():
                times[kind].append(timed(fn, dev)[1])
            with tf32(args.tf32):
                rates.append(matmul_rate(shapes, dev, torch.float32, 3))
        rate = statistics.median(rates)
        steps = args.epochs * -(-n // batch)
        flops = sum(step_flops(s, batch, d) for s in specs) * steps
        bound = flops / rate
        secs = {k: statistics.median(v) for k, v in times.items()}
        xb = torch.as_tensor(x[:batch], device=dev)
        yb = torch.as_tensor(y[:batch], device=dev)
        ops_batched, ops_separate = ops_per_step(specs, xb, yb)
        network_epochs = size * args.epochs * n / FULL_MNIST
        res["sizes"][str(size)] = {
            "networks": [f"{s.regularizer} lr {s.lr:g} lam {s.lam:g}" for s in specs][:3]
            + (["..."] if size > 3 else []),
            "batched_seconds": secs["batched"],
            "separate_seconds": secs["separate"],
            "speedup_batched_vs_separate": secs["separate"] / secs["batched"],
            "network_epochs_per_second_batched": network_epochs / secs["batched"],
            "network_epochs_per_second_separate": network_epochs / secs["separate"],
            "arithmetic_bound_seconds": bound,
            "ratio_to_arithmetic_bound": secs["batched"] / bound,
            "ratio_to_arithmetic_bound_separate": secs["separate"] / bound,
            "ops_per_step_batched": ops_batched,
            "ops_per_step_separate": ops_separate,
        }
    res["gemm_gflops_float32"] = statistics.median(rates) / 1e9
    largest = res["sizes"][str(max(args.sizes))]
    res["speedup_batched_vs_separate"] = largest["speedup_batched_vs_separate"]
    res["ratio_to_arithmetic_bound"] = largest["ratio_to_arithmetic_bound"]
    # the way a grid job of the workflow takes on this device
    batched = batched_on(dev)
    res["grid_job_trains"] = "batched" if batched else "separate"

    print(bench.machine_line())
    print(
        f"{n} digits x {args.epochs} epoch(s), hidden {args.hidden}, batch {batch}; "
        f"float32 matrix products{' (TF32)' if args.tf32 else ''} meanwhile: "
        f"{res['gemm_gflops_float32']:.0f} GFLOP/s"
    )
    for size, r in res["sizes"].items():
        print(
            f"G = {size:>2}: batched {r['batched_seconds']:.2f} s "
            f"({r['network_epochs_per_second_batched']:.3g} network-epochs/s), separate "
            f"{r['separate_seconds']:.2f} s ({r['network_epochs_per_second_separate']:.3g}/s): "
            f"x{r['speedup_batched_vs_separate']:.2f}; arithmetic bound "
            f"{r['arithmetic_bound_seconds']:.2f} s, batched x{r['ratio_to_arithmetic_bound']:.2f}"
            f" of it (separate x{r['ratio_to_arithmetic_bound_separate']:.2f}); operations per "
            f"step {r['ops_per_step_batched']} batched, {r['ops_per_step_separate']} separate"
        )
    way = "as one batched model" if batched else "one network after another"
    print(f"a grid job trains {way} on {dev.type} (crosslip.stages.training.batched_on)")
    finish(res)


if __name__ == "__main__":
    main()
