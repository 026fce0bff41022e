"""torch.compile benchmark: the batched training step with its objective compiled against the
same step run eagerly, side by side, with what the compilation costs.

The networks are the first G of the MNIST preset's plain grid (``config/presets/mnist.yaml``,
Cross-Lipschitz first: 784-1024-10 softplus networks). One step of
:class:`crosslip.training.grid.GridStep` (forward, Cross-Lipschitz in closed form, backward,
update; batch 64 of real digits, float32) is timed in two kinds that take turns over
``--rounds`` rounds of ``--steps`` steps, each kind on its own copy of the networks:

* **eager**: the step as crosslip trains (on CUDA it is then recorded as a CUDA graph);
* **compiled**: the same step with :meth:`GridStep.objective` (the forward pass and the
  penalties; autograd differentiates the compiled graph) wrapped in ``torch.compile``
  (``--backend``, default inductor, default mode).

Figures per G: seconds per step of each (median over the rounds) and the speedup; the
compilation's seconds (the first compiled step less an eager one) at the first call and
again after ``torch._dynamo.reset()`` (warm: the caches of the first, as every later job on
that machine); and the largest difference of the weights after the timed steps, compiled
against eager (other kernels, other rounding: small, not zero). The first G's first call
starts from an empty inductor cache (``compile_seconds_cold``: a fresh machine's first job);
later sizes reuse what it compiled. crosslip's training does not compile; these figures are
why (docs/scaling.md). The last line is one JSON object; ``speedup_compiled_vs_eager`` and
``compile_seconds_warm`` are those of the largest G.
Run: ``.venv/bin/python benchmarks/bench_compile.py [--device auto]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from collections.abc import Callable
from functools import partial

import torch

from _harness import ROOT, finish, parser, start, timed
from crosslip.data import load_dataset
from crosslip.models import SoftplusNet, StackedSoftplusNet
from crosslip.training.grid import REGULARIZER_ORDER, GridStep
from presets import preset_networks

PRESET = ROOT / "config" / "presets" / "mnist.yaml"
K = 10


def timed_step(step: GridStep, xb: torch.Tensor, yb: torch.Tensor, dev: torch.device) -> float:
    """Seconds of one step on the batch."""
    return timed(partial(step, xb, yb), dev)[1]


def compile_seconds(
    step: GridStep,
    objective: Callable,
    xb: torch.Tensor,
    yb: torch.Tensor,
    dev: torch.device,
    eager: float,
    backend: str,
) -> float:
    """Seconds the first step with ``objective`` (``step``'s eager one) compiled costs
    beyond an eager step."""
    torch._dynamo.reset()
    step.objective = torch.compile(objective, backend=backend)
    return timed_step(step, xb, yb, dev) - eager


def arguments() -> argparse.ArgumentParser:
    """The benchmark's options (module docstring)."""
    ap = parser(__doc__)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 8], help="grid sizes G")
    ap.add_argument("--steps", type=int, default=10, help="steps timed per round and kind")
    ap.add_argument("--rounds", type=int, default=3, help="turns of eager and compiled")
    ap.add_argument("--hidden", type=int, default=1024, help="hidden units (1024 in the paper)")
    ap.add_argument(
        "--backend",
        default="inductor",
        help="torch.compile backend (inductor; aot_eager traces without generating code, "
        "the smoke test's)",
    )
    return ap


def main() -> None:
    bench = start(arguments())
    args, dev = bench.args, bench.device
    ds = load_dataset("mnist5k")
    grid = preset_networks(PRESET, "plain", args.hidden, 1)
    batch = grid[0].batch_size
    xb = torch.as_tensor(ds.x_train[:batch], device=dev)
    yb = torch.as_tensor(ds.y_train[:batch], device=dev)
    res: dict = {
        **bench.header(),
        "torch": torch.__version__,
        "backend": args.backend,
        "hidden": args.hidden,
        "batch": batch,
        "sizes": {},
    }
    cache = tempfile.mkdtemp(prefix="bench-compile-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache  # cold: nothing compiled before
    for size in args.sizes:
        specs = sorted(grid[:size], key=lambda s: REGULARIZER_ORDER.index(s.regularizer))
        torch.manual_seed(0)
        nets = [SoftplusNet(xb.shape[1], K, args.hidden, init="authors") for _ in specs]
        steps = {
            kind: GridStep(StackedSoftplusNet(nets).to(dev), specs)
            for kind in ("eager", "compiled")
        }
        objective = steps["compiled"].objective
        eager = min(timed_step(steps["eager"], xb, yb, dev) for _ in range(3))
        first, warm = (
            compile_seconds(steps["compiled"], objective, xb, yb, dev, eager, args.backend)
            for _ in range(2)
        )
        timed_step(steps["compiled"], xb, yb, dev)  # 3 steps each, as the 3 eager ones
        per_step: dict[str, list[float]] = {"eager": [], "compiled": []}
        for _ in range(args.rounds):
            for kind, step in steps.items():
                total = sum(timed_step(step, xb, yb, dev) for _ in range(args.steps))
                per_step[kind].append(total / args.steps)
        secs = {k: statistics.median(v) for k, v in per_step.items()}
        diff = max(
            float((a - b).detach().abs().max())
            for a, b in zip(
                steps["eager"].stack.parameters(), steps["compiled"].stack.parameters(), strict=True
            )
        )
        res["sizes"][str(size)] = {
            "eager_seconds_per_step": secs["eager"],
            "compiled_seconds_per_step": secs["compiled"],
            "speedup_compiled_vs_eager": secs["eager"] / secs["compiled"],
            "compile_seconds_first_call": first,
            "compile_seconds_warm": warm,
            "max_weight_difference": diff,
        }
    top = res["sizes"][str(max(args.sizes))]
    for key in ("speedup_compiled_vs_eager", "compile_seconds_warm"):
        res[key] = top[key]
    res["compile_seconds_cold"] = res["sizes"][str(args.sizes[0])]["compile_seconds_first_call"]

    print(bench.machine_line())
    print(f"torch {torch.__version__}, backend {args.backend}, hidden {args.hidden}, batch {batch}")
    for size, r in res["sizes"].items():
        print(
            f"G = {size:>2}: eager {1e3 * r['eager_seconds_per_step']:.1f} ms/step, compiled "
            f"{1e3 * r['compiled_seconds_per_step']:.1f} ms/step: "
            f"x{r['speedup_compiled_vs_eager']:.2f}; compiling "
            f"{r['compile_seconds_first_call']:.1f} s at the first call, "
            f"{r['compile_seconds_warm']:.1f} s warm; weights differ by at most "
            f"{r['max_weight_difference']:.1e}"
        )
    finish(res)


if __name__ == "__main__":
    main()
