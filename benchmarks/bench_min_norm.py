"""Minimal-norm attack benchmark: the budget of ``min_norm_attack`` (steps, targets,
restarts, early stopping) against its cost, beside the paper's procedure.

A 784-1024-10 softplus network trained briefly on real digits (by default the one of
``bench_attack.py`` and ``bench_certify.py``: full MNIST from the folder ``--mirror`` of
the official files, else a download, 3 epochs of plain SGD, cached under ``results/bench/``;
``--model`` loads another model file of the workflow instead, e.g. a 200-epoch
Cross-Lipschitz net); the first ``--points`` test points (default all 10,000), L2, all in
one process:

1. the baseline: the paper's procedure (``upper_bound``, all targets), then the refinement
   (``refine_upper_bound``, ``--refine-steps`` re-linearizations), as the attack stage runs
   them, timed;
2. the default (``--steps``, ``--targets``, ``--restarts``, ``--tol``, ``--patience``,
   ``--prune``; the schema's defaults) on all the points and the thorough setting
   (:data:`crosslip.attacks.min_norm.THOROUGH`, the default until the budget was measured:
   200 steps, 9 targets, 8 restarts, no early stopping) on the first ``--thorough-points``
   (default all), both started from the refined samples: times, the ratio of each to the
   baseline's time on the same points, and per point the default's norm over the thorough
   one's (mean, 99th percentile of the excess ``ratio - 1``, share above 1 + 1e-3) and the
   ratio of the means;
3. the table: each of ``--settings`` (``steps:targets:restarts:tol:patience:prune``,
   prune 0: off) on the first ``--table-points`` points, with its time (and its ratio to
   the baseline's time on those points) and the same per-point comparison with the
   thorough setting.

``--dataset mnist5k`` (offline) with ``--hidden`` and ``--epochs`` trains a small network
instead (the smoke tests use it; nothing is cached then). ``--device`` (``auto``: CUDA if
torch sees one) runs everything there; CUDA is synchronised before every clock reading.
Run: ``.venv/bin/python benchmarks/bench_min_norm.py [--device auto] [--points 10000]``;
the last line is one JSON object (``min_norm_vs_paper_seconds``: the default's time over
the baseline's; ``mean_vs_old_default``: the ratio of its mean to the thorough setting's).
"""

from __future__ import annotations

import argparse
import copy

import torch

from _harness import add_mirror_argument, finish, parser, start, timed
from bench_certify import full_mnist, trained_net
from crosslip.attacks import UpperBound, min_norm_attack, refine_upper_bound, upper_bound
from crosslip.attacks.min_norm import THOROUGH
from crosslip.config.schema import default
from crosslip.data import load_dataset
from crosslip.models.checkpoints import load_model
from crosslip.training.core import TrainConfig
from crosslip.training.single import train

#: The table's settings by default, ``steps:targets:restarts:tol:patience:prune``.
SETTINGS = (
    "200:9:8:1e-3:20:0",
    "100:3:2:0:0:0",
    "100:3:0:0:0:0",
    "100:3:0:1e-3:10:1.5",
    "50:3:2:1e-3:10:1.5",
    "100:1:0:1e-3:10:1.5",
)
KEYS = ("steps", "targets", "restarts", "tol", "patience", "prune")


def network(args: argparse.Namespace):
    """The benchmark's network and dataset: ``--model`` on full MNIST, else the cached
    784-1024-10 MNIST net of the other attack benchmarks, else one trained here for
    ``--epochs`` (not cached)."""
    ds = full_mnist(args.mirror) if args.dataset == "mnist" else load_dataset(args.dataset)
    if args.model:
        return load_model(args.model), ds
    if args.dataset == "mnist" and args.hidden == 1024 and args.epochs == 3:
        net, _ = trained_net(ds)
        return net, ds
    cfg = TrainConfig(epochs=args.epochs, lr=0.2, hidden=args.hidden)
    res = train(cfg, ds)
    return res.model, ds


def setting(text: str) -> dict[str, float]:
    """``"steps:targets:restarts:tol:patience:prune"`` -> the attack's keyword arguments."""
    parts = text.split(":")
    if len(parts) != len(KEYS):
        raise argparse.ArgumentTypeError(f"want {':'.join(KEYS)}, got {text!r}")
    kw = dict(zip(KEYS, parts, strict=True))
    return {k: float(v) if k in ("tol", "prune") else int(v) for k, v in kw.items()}


def label(kw: dict[str, float]) -> str:
    return ":".join(f"{kw[k]:g}" for k in KEYS)


def arguments() -> argparse.ArgumentParser:
    """The benchmark's options (module docstring)."""
    ap = parser(__doc__)
    add_mirror_argument(ap)
    ap.add_argument("--dataset", choices=["mnist", "mnist5k"], default="mnist")
    ap.add_argument("--model", default=None, help="a model file to attack instead")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--points", type=int, default=10_000)
    ap.add_argument("--refine-steps", type=int, default=default("attack.refine_steps"))
    ap.add_argument("--steps", type=int, default=default("attack.min_norm_steps"))
    ap.add_argument("--targets", type=int, default=default("attack.min_norm_targets"))
    ap.add_argument("--restarts", type=int, default=default("attack.min_norm_restarts"))
    ap.add_argument("--tol", type=float, default=default("attack.min_norm_tol"))
    ap.add_argument("--patience", type=int, default=default("attack.min_norm_patience"))
    ap.add_argument("--prune", type=float, default=default("attack.min_norm_prune"))
    ap.add_argument("--settings", type=setting, nargs="*", default=list(map(setting, SETTINGS)))
    ap.add_argument("--thorough-points", type=int, default=0, help="0: all --points")
    ap.add_argument("--table-points", type=int, default=1000, help="0: no table")
    return ap


def compare(new: UpperBound, old: UpperBound) -> dict[str, float]:
    """Per point ``new / old`` where both succeeded: mean, 99th percentile of the excess
    ``ratio - 1``, share above 1 + 1e-3, the ratio of the means; and the success rate."""
    ok = new.success & old.success
    ratio = new.norm[ok] / old.norm[ok]
    return {
        "mean_ratio_per_point": float(ratio.mean()),
        "p99_excess": float(torch.quantile(ratio - 1, 0.99)),
        "max_excess": float((ratio - 1).max()),
        "share_worse_0.1%": float((ratio > 1 + 1e-3).double().mean()),
        "ratio_of_means": float(new.norm[ok].mean() / old.norm[ok].mean()),
        "success_rate": float(new.success.double().mean()),
    }


def head(ub: UpperBound, m: int) -> UpperBound:
    return UpperBound(*(getattr(ub, f)[:m] for f in UpperBound.__annotations__))


def hidden(net: torch.nn.Module, d: int) -> int:
    """The width of the first layer of ``net`` (input dimension ``d``)."""
    w = next(p for p in net.parameters() if p.ndim == 2)
    return int(w.shape[0] if w.shape[1] == d else w.shape[1])


def main() -> None:
    bench = start(arguments())
    args, dev = bench.args, bench.device
    net, ds = network(args)
    x = torch.as_tensor(ds.x_test[: args.points])
    with torch.no_grad():
        err = float((net(x).argmax(1).numpy() != ds.y_test[: args.points]).mean())
    net = copy.deepcopy(net).to(dev)
    x = x.to(dev)
    new = {k: getattr(args, k) for k in KEYS}
    upper_bound(net, x[:64], progress=False)  # warm-up
    min_norm_attack(net, x[:8], steps=2, targets=1, restarts=1, progress=False)

    ub, paper_s = timed(lambda: upper_bound(net, x, p=2, progress=False), dev)
    ref, refine_s = timed(
        lambda: refine_upper_bound(net, x, ub, p=2, steps=args.refine_steps, progress=False), dev
    )
    base_s = paper_s + refine_s

    def attack(kw: dict[str, float], m: int) -> tuple[UpperBound, float]:
        return timed(
            lambda: min_norm_attack(net, x[:m], start=head(ref, m), **kw, progress=False), dev
        )

    n_old = min(args.thorough_points or len(x), len(x))
    mn, mn_s = attack(new, len(x))
    old, old_s = attack(THOROUGH, n_old)
    vs_old = compare(head(mn, n_old), old)
    res: dict = {
        **bench.header(),
        "dataset": args.dataset,
        "model": args.model or f"trained here, {args.epochs} epochs",
        "network": f"{x.shape[1]}-{hidden(net, x.shape[1])}-{ds.num_classes}",
        "test_error": err,
        "points": len(x),
        "refine_steps": args.refine_steps,
        "default": label(new),
        "thorough": label(THOROUGH),
        "paper_seconds": paper_s,
        "refine_seconds": refine_s,
        "thorough_seconds": old_s,
        "min_norm_seconds": mn_s,
        "thorough_points": n_old,
        "thorough_vs_paper_seconds": old_s / (base_s * n_old / len(x)),
        "min_norm_vs_paper_seconds": mn_s / base_s,
        "mean_vs_old_default": vs_old["ratio_of_means"],
        "vs_old_default": vs_old,
        "mean_upper_bound": {
            "paper": float(ub.norm[ub.success].mean()),
            "refined": float(ref.norm[ref.success].mean()),
            "thorough": float(old.norm[old.success].mean()),
            "min_norm": float(mn.norm[mn.success].mean()),
        },
    }
    table = []
    m = min(args.table_points, n_old)
    for kw in args.settings if m > 0 else []:
        out, s = attack(kw, m)
        table.append({"setting": label(kw), "seconds": s, **compare(out, head(old, m))})
    res.update(table_points=m, table=table)

    print(bench.machine_line())
    print(
        f"network: {res['network']} softplus ({res['model']}), {args.dataset}, test error "
        f"{err:.2%}; {len(x)} test points x {x.shape[1]}, L2"
    )
    print(
        f"baseline: paper's procedure {paper_s:.1f} s + refinement ({args.refine_steps} "
        f"re-linearizations) {refine_s:.1f} s = {base_s:.1f} s"
    )
    print(f"settings: {':'.join(KEYS)}; ratios per point against the thorough setting")

    def line(name: str, s: float, base: float, cmp: dict[str, float]) -> str:
        return (
            f"{name:<24} {s:9.1f} s  x{s / base:6.2f} baseline  "
            f"mean x{cmp['mean_ratio_per_point']:.6f}"
            f"  p99 excess {cmp['p99_excess']:.2e}  max {cmp['max_excess']:.2e}  worse >0.1% "
            f"{cmp['share_worse_0.1%']:.2%}  ratio of means x{cmp['ratio_of_means']:.6f}"
        )

    print(
        f"thorough {res['thorough']:<15} {old_s:9.1f} s  "
        f"x{res['thorough_vs_paper_seconds']:6.2f} baseline  (first {n_old} points)"
    )
    print(
        line(f"default {res['default']}", mn_s, base_s, vs_old)
        + f"  (time on {len(x)} points, norms against the thorough on the first {n_old})"
    )
    if table:
        print(
            f"table on the first {m} points (baseline scaled to them: {base_s * m / len(x):.1f} s):"
        )
    for row in table:
        print(line(row["setting"], row["seconds"], base_s * m / len(x), row))
    finish(res)


if __name__ == "__main__":
    main()
