"""Why the augment and adversarial settings move the bounds: plain against each setting,
per regularizer, on the test points both networks classify correctly.

The record's claims compare means over each network's own correctly classified points; a
network that is right on more (harder) points averages over more small margins. This study
takes the points both networks get right and reports, per regularizer and setting, the mean
margin ``f_c - f_j`` at the point (the numerator of Theorem 2.1), the mean Proposition 2.3
guarantee and the mean best sound L2 guarantee, the mean best L2 upper bound, and the same
means over each network's own correct points. Augmented networks are evaluated on the
24 x 24 centre crops they were trained on (their input has 576 coordinates, the plain ones'
784), so their radii are distances between crops.

Reads the per-instance results of a finished run (``results/instances/<dataset>/*.parquet``);
prints a table and ends with one JSON line (``--out``: also written with the command, date
and commit). Usage::

    python benchmarks/study_settings.py --results results/mnist5k-200-cpu [--out F.json]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from _harness import finish, parser
from crosslip.device import describe_machine

COLUMNS = {
    "margin": "margin",
    "guarantee": "guarantee_local",
    "best_guarantee": "guarantee_l2_best",
    "upper_bound": "upper_bound_l2_best",
}


def study(results: Path, dataset: str) -> list[dict]:
    """One row per (regularizer, lambda, setting other than plain): the means above."""
    frames = [
        pd.read_parquet(p) for p in sorted((results / "instances" / dataset).glob("*.parquet"))
    ]
    inst = pd.concat(frames, ignore_index=True)
    inst = inst[inst["family"] == "mlp"]
    rows = []
    for (reg, lam), group in inst.groupby(["regularizer", "lam"], sort=True):
        plain = group[group["setting"] == "plain"].set_index("test_index")
        for setting in sorted(set(group["setting"]) - {"plain"}):
            other = group[group["setting"] == setting].set_index("test_index")
            both = plain.index[plain["correct"]].intersection(other.index[other["correct"]])
            row = {
                "regularizer": reg,
                "lam": float(lam),
                "setting": setting,
                "correct_plain": int(plain["correct"].sum()),
                "correct_other": int(other["correct"].sum()),
                "common": len(both),
            }
            for name, col in COLUMNS.items():
                p, o = plain.loc[both, col].mean(), other.loc[both, col].mean()
                row[f"{name}_plain"], row[f"{name}_other"] = float(p), float(o)
                own_p = plain.loc[plain["correct"], col].mean()
                own_o = other.loc[other["correct"], col].mean()
                row[f"{name}_ratio_common"] = float(o / p)
                row[f"{name}_ratio_own"] = float(own_o / own_p)
            rows.append(row)
    return rows


def arguments() -> argparse.ArgumentParser:
    """The study's options (module docstring)."""
    ap = parser(__doc__, torch_options=False)
    ap.add_argument("--results", type=Path, required=True, help="a finished run's results")
    ap.add_argument("--dataset", default="mnist5k", help="the dataset of the networks")
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    return ap


def main() -> None:
    args = arguments().parse_args()
    if not (args.results / "instances" / args.dataset).is_dir():
        raise SystemExit(f"{args.results}: no instances/{args.dataset}/ (a finished run?)")
    rows = study(args.results, args.dataset)
    table = pd.DataFrame(rows)
    shown = ["regularizer", "lam", "setting", "common"] + [
        f"{n}_ratio_{w}" for n in COLUMNS for w in ("common", "own")
    ]
    print(table[shown].to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    res = {"kind": "settings", "machine": describe_machine("cpu"), "results": str(args.results)}
    res["dataset"] = args.dataset
    finish({**res, "rows": rows}, args.out)


if __name__ == "__main__":
    main()
