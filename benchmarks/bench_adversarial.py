"""Adversarial-training benchmark: a batched step of the MNIST grid with the authors' one-step
samples against the same step with the paper's search, side by side with the plain step.

The networks are those of the MNIST preset's adversarial setting
(``config/presets/mnist.yaml``: 784-1024-10 softplus networks, no weight decay ...
Cross-Lipschitz, two learning rates; 26 in all), first trained together for
``--warm-epochs`` plain epochs on ``--points`` real digits, so that the attacks meet
networks that have learned something (an attack on random weights ends early). For each
size G of ``--sizes`` (the first G networks, Cross-Lipschitz first), one step on a batch of
64 digits (float32; half of it replaced by adversarial samples in Linf) is timed in three
kinds that take turns over ``--rounds`` rounds of ``--steps`` steps each:

* **plain**: :class:`crosslip.training.grid.GridStep` on the batch as it is (the floor);
* **one_step** (``train.adv_attack: one_step``, the default): the step makes each grid
  point's samples itself (:func:`crosslip.attacks.one_step_stacked`), fixed shapes and no
  read back to the host, so on CUDA the whole step is one recorded graph;
* **search** (``train.adv_attack: search``): the paper's attack on every grid point
  (:func:`crosslip.training.adversarial.adversarial_inputs`, rtol 1e-2, at most 10 bisection
  steps), then the step.

Figures per G and kind: seconds per step (median over the rounds), network-epochs per
second (a network-epoch: 60,000 digits, one full MNIST epoch, for one network), the
operations one step dispatches (each a kernel launch on a GPU; views and allocations not
counted) and how many of them read a value back to the host (each one a stall of the GPU,
and none allowed in a recorded graph): :class:`benchmarks.op_count.OpCount`. The last line is
one JSON object; ``speedup_one_step_vs_search`` and the ``ops_per_step_*`` are those of the
largest G.
Run: ``.venv/bin/python benchmarks/bench_adversarial.py [--device auto]``
"""

from __future__ import annotations

import argparse
from functools import partial

import torch

from _harness import ROOT, finish, medians, parser, start
from crosslip.data import Dataset, load_dataset
from crosslip.models import StackedSoftplusNet
from crosslip.training.adversarial import adversarial_inputs, adversarial_rows
from crosslip.training.core import TrainConfig
from crosslip.training.grid import REGULARIZER_ORDER, GridStep, train_grid
from op_count import OpCount
from presets import preset_networks

PRESET = ROOT / "config" / "presets" / "mnist.yaml"
FULL_MNIST = 60000
KINDS = ("plain", "one_step", "search")


def warm_networks(specs: list[TrainConfig], data: Dataset, device: torch.device) -> list:
    """The networks of ``specs`` after their plain epochs on ``data`` (trained as one batched
    model)."""
    plain = [TrainConfig(**{**s.__dict__, "setting": "plain"}) for s in specs]
    return [r.model for r in train_grid(plain, data, device=device)]


def run_kind(
    kind: str,
    step: GridStep,
    stack: StackedSoftplusNet,
    spec: TrainConfig,
    xb: torch.Tensor,
    yb: torch.Tensor,
    fractions: torch.Tensor,
) -> None:
    """One step of ``kind`` on the batch."""
    if kind == "plain":
        step(xb, yb)
    elif kind == "one_step":
        step(xb, yb, fractions=fractions)
    else:
        step(adversarial_inputs(stack, xb, spec), yb)


def run_batches(
    kind: str, step: GridStep, stack: StackedSoftplusNet, spec: TrainConfig, batches: list
) -> None:
    """One step of ``kind`` on each of ``batches`` (the timed unit)."""
    for xb, yb, fractions in batches:
        run_kind(kind, step, stack, spec, xb, yb, fractions)


def arguments() -> argparse.ArgumentParser:
    """The benchmark's options (module docstring)."""
    ap = parser(__doc__)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 26], help="grid sizes G")
    ap.add_argument("--points", type=int, default=2000, help="digits of the warm-up epochs")
    ap.add_argument("--warm-epochs", type=int, default=1, help="plain epochs before timing")
    ap.add_argument("--steps", type=int, default=5, help="steps timed per round and kind")
    ap.add_argument("--rounds", type=int, default=3, help="turns of the three kinds")
    ap.add_argument("--hidden", type=int, default=1024, help="hidden units (1024 in the paper)")
    return ap


def main() -> None:
    bench = start(arguments())
    args, dev = bench.args, bench.device
    ds = load_dataset("mnist5k").head(args.points, 500)
    x, y = ds.x_train, ds.y_train
    grid = preset_networks(PRESET, "adversarial", args.hidden, args.warm_epochs)
    largest = max(args.sizes)
    nets = warm_networks(grid[:largest], ds, dev)
    batch = grid[0].batch_size
    m = adversarial_rows(grid[0], batch)
    gen = torch.Generator().manual_seed(0)
    batches = [
        (
            torch.as_tensor(x[i * batch : (i + 1) * batch], device=dev),
            torch.as_tensor(y[i * batch : (i + 1) * batch], device=dev),
            torch.rand(m, generator=gen).to(dev),
        )
        for i in range(args.steps)
    ]
    res: dict = {
        **bench.header(),
        "hidden": args.hidden,
        "batch": batch,
        "adversarial_rows": m,
        "adv_norm": grid[0].adv_norm,
        "warm_epochs": args.warm_epochs,
        "warm_points": len(x),
        "grid": len(grid),
        "sizes": {},
    }
    for size in args.sizes:
        pairs = sorted(
            zip(grid[:size], nets[:size], strict=True),
            key=lambda pair: REGULARIZER_ORDER.index(pair[0].regularizer),
        )  # a step's regularizers in contiguous slices
        specs = [spec for spec, _ in pairs]
        stack = StackedSoftplusNet([net for _, net in pairs]).to(dev)
        step = GridStep(stack, specs, adv_norm=float("inf"))
        for kind in KINDS:  # warm-up: allocator, thread pools, cuBLAS
            run_kind(kind, step, stack, specs[0], *batches[0])
        kinds = {kind: partial(run_batches, kind, step, stack, specs[0], batches) for kind in KINDS}
        per_round = medians(kinds, args.rounds, dev)
        row: dict = {}
        for kind in KINDS:
            with OpCount() as count:
                run_kind(kind, step, stack, specs[0], *batches[0])
            seconds = per_round[kind] / len(batches)
            row[f"{kind}_seconds_per_step"] = seconds
            row[f"{kind}_network_epochs_per_second"] = size * batch / FULL_MNIST / seconds
            row[f"ops_per_step_{kind}"] = count.ops
            row[f"host_reads_per_step_{kind}"] = count.host_reads
        row["speedup_one_step_vs_search"] = (
            row["search_seconds_per_step"] / row["one_step_seconds_per_step"]
        )
        row["one_step_vs_plain"] = row["one_step_seconds_per_step"] / row["plain_seconds_per_step"]
        row["search_vs_plain"] = row["search_seconds_per_step"] / row["plain_seconds_per_step"]
        res["sizes"][str(size)] = row
    top = res["sizes"][str(largest)]
    res["speedup_one_step_vs_search"] = top["speedup_one_step_vs_search"]
    for kind in KINDS:
        res[f"ops_per_step_{kind}"] = top[f"ops_per_step_{kind}"]
        res[f"host_reads_per_step_{kind}"] = top[f"host_reads_per_step_{kind}"]

    print(bench.machine_line())
    print(
        f"batch {batch} ({m} replaced, {res['adv_norm']}), hidden {args.hidden}; networks "
        f"after {args.warm_epochs} plain epoch(s) on {len(x)} digits; "
        f"{args.rounds} rounds x {args.steps} steps"
    )
    for size, r in res["sizes"].items():
        print(
            f"G = {size:>2}: "
            + "; ".join(
                f"{kind} {1e3 * r[f'{kind}_seconds_per_step']:.1f} ms/step "
                f"({r[f'ops_per_step_{kind}']} ops, {r[f'host_reads_per_step_{kind}']} host "
                "reads)"
                for kind in KINDS
            )
        )
        print(
            f"        one_step x{r['speedup_one_step_vs_search']:.2f} faster than search; "
            f"x{r['one_step_vs_plain']:.2f} (one_step) and x{r['search_vs_plain']:.2f} (search) "
            "the plain step"
        )
    finish(res)


if __name__ == "__main__":
    main()
