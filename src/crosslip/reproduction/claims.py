"""Verdicts on the claims of Section 5 from an exported run's ``summary.csv``.

Every check compares the *best model per method* (the lowest test error among the models
that were evaluated, ties broken by model id: the paper reports "the parameters leading to
best test performance") and reads only per-model means over correctly classified points:
``mean_guarantee_local`` (the L2 guarantee of Theorem 2.1 with Proposition 2.3 or 2.2),
``mean_upper_bound`` (the L2 adversarial samples of Section 4), ``mean_ratio_global_local``
and ``n_global_above_local``. A check is a list of :class:`Part` (a comparison with its
numbers and whether it holds); the verdict is *reproduced* when every part that could be
checked holds, *not reproduced* when one fails, and *not run at this scale* when the run has
no data for any part.

The claims are one table, ``claims.yaml`` beside this module, read into :data:`CRITERIA` (a
:class:`Claim` each, in the record's order): the verdicts and the criterion printed in the
record are both made from it, so each threshold is written once. A claim that does not fit
its rows has a check of its own (:data:`CHECKS`).

Runs exported with the same ``pool`` label (the same settings and code, other models: two
runs of one probe) are evaluated as one (:func:`pool_runs`).
"""

from __future__ import annotations

import copy
import functools
import math
import string
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from ..jobs.selection import method_of
from .paper import ILLUSTRATION, ILLUSTRATION_CLASSIFIERS, PAPER_DATASET, TABLE1, PaperNumber

REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced"
NOT_RUN = "not run at this scale"

#: Slack of every threshold comparison, so a ratio printed as the threshold counts as meeting
#: it (2.2 / 2.0 is 1.1000000000000003 in floating point).
EPS = 1e-9

_TABLE = yaml.safe_load(Path(__file__).with_name("claims.yaml").read_text(encoding="utf-8"))
#: The methods of the networks and of the kernel models, in the record's order.
NET_ORDER, KERNEL_ORDER = list(_TABLE["networks"]), list(_TABLE["kernels"])
#: Short names of the methods (the paper's labels).
LABEL: dict[str, str] = {**_TABLE["networks"], **_TABLE["kernels"]}


def num(x: Any, digits: int = 3) -> str:
    """``x`` to ``digits`` significant digits, trailing zeros kept (``2.00``); ``–`` for a
    missing value."""
    return "–" if pd.isna(x) else f"{float(x):#.{digits}g}".rstrip(".")


def pct(x: Any) -> str:
    """A fraction as a percentage with two decimals (``0.0144`` -> ``1.44%``)."""
    return "–" if pd.isna(x) else f"{100 * x:.2f}%"


def duration(seconds: float | None) -> str:
    """Seconds as ``45 s``, ``12 min`` or ``3.1 h``; ``–`` for ``None``."""
    if seconds is None:
        return "–"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def times(x: float) -> str:
    """A ratio as a factor (``×1.05``; ``–`` if NaN)."""
    return "–" if math.isnan(x) else f"×{x:.2f}"


#: The format specs of a table cell besides Python's (:func:`cells`).
FORMATS: dict[str, Callable[[Any], str]] = {
    "num": num,
    "num2": lambda x: num(x, 2),
    "pct": pct,
    "times": times,
    "change": lambda x: "–" if math.isnan(x) else f"{100 * (x - 1):+.0f}%",
    "duration": duration,
    "label": LABEL.__getitem__,
    "list": lambda xs: ", ".join(map(str, xs)),
}


class _Cells(string.Formatter):
    """A cell filled from a row: a field the row lacks (or ``None``) raises ``LookupError``;
    the specs of :data:`FORMATS` format a field as their function does."""

    def get_value(self, key: int | str, args: Any, kwargs: dict[str, Any]) -> Any:
        if kwargs.get(str(key)) is None:
            raise LookupError(key)
        return kwargs[str(key)]

    def format_field(self, value: Any, spec: str) -> str:
        return FORMATS[spec](value) if spec in FORMATS else super().format_field(value, spec)


def cells(
    rows: Iterable[Mapping[str, Any]] | pd.DataFrame, columns: dict[str, str], **headers: str
) -> pd.DataFrame:
    """A table of formatted cells: one per row (a frame's index a column too) and column,
    ``columns`` mapping each header (a format string over ``headers``) to its cell, a format
    string over the row (``'{mean_upper_bound:num}'``; :class:`_Cells`); ``–`` for a cell
    with a missing field."""
    if isinstance(rows, pd.DataFrame):
        rows = rows.reset_index().to_dict("records")

    def cell(fmt: str, row: Mapping[str, Any]) -> str:
        try:
            return _Cells().format(fmt, **row)
        except LookupError:
            return "–"

    table = [[cell(f, r) for f in columns.values()] for r in rows]
    return pd.DataFrame(table, columns=[h.format(**headers) for h in columns])


@dataclass
class Run:
    """An exported run: its ``run.yaml`` (``meta``) and its per-model ``summary``; or runs
    evaluated as one (:func:`pool_runs`): ``parts`` names their folders, ``meta`` is the
    first one's."""

    name: str
    folder: Path
    meta: dict[str, Any]
    summary: pd.DataFrame
    parts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self.parts = self.parts or (self.name,)

    @property
    def epochs(self) -> int | None:
        """Training epochs of the run's networks (``None`` when it trains none)."""
        return self.meta.get("epochs") if self.meta["config"]["train"].get("grid") else None

    @property
    def device(self) -> str:
        """What trained and evaluated the models: the GPU's name when the models' metrics
        name a CUDA device (run.yaml ``devices``) or, for runs exported before that was
        recorded, when the machine had a GPU and the config's ``device`` is not ``cpu``;
        ``CPU`` otherwise; ``–`` when the run.yaml cannot tell."""
        machine = self.meta.get("machine")
        gpu = machine.get("gpu") if isinstance(machine, dict) else None
        devices = self.meta.get("devices")
        if devices:
            return (gpu or "CUDA") if any(d.startswith("cuda") for d in devices) else "CPU"
        if not isinstance(machine, dict):
            return "–"
        wanted = str(self.meta["config"].get("device", "auto"))
        return gpu if gpu and wanted != "cpu" else "CPU"

    @classmethod
    def load(cls, folder: Path) -> Run:
        """Read ``folder/run.yaml`` and ``folder/tables/summary.csv``."""
        meta = yaml.safe_load((folder / "run.yaml").read_text())
        text = ["dataset", "model_id", "family", "regularizer", "setting", "status"]
        summary = pd.read_csv(folder / "tables" / "summary.csv", dtype=dict.fromkeys(text, str))
        summary["method"] = [
            method_of(r) for r in summary[["regularizer", "lam"]].to_dict("records")
        ]
        return cls(folder.name, folder, meta, summary)

    @functools.cached_property
    def evaluated(self) -> pd.DataFrame:
        """Models that trained (``status == "ok"``) and have correctly classified evaluated
        points."""
        s = self.summary
        return s[(s["status"] == "ok") & (s["n_correct"].fillna(0) > 0)]

    def datasets(self, family: str | None = None, paper: str | None = None) -> list[str]:
        """Datasets with evaluated models (of ``family``; of the paper's dataset ``paper``),
        sorted."""
        s = self.evaluated
        found = set(s["dataset"] if family is None else s[s["family"] == family]["dataset"])
        return sorted(d for d in found if paper is None or PAPER_DATASET.get(d) == paper)

    def models(self, dataset: str, family: str, setting: str | None = None) -> pd.DataFrame:
        """The evaluated models of ``family`` on ``dataset`` (in ``setting``, if given)."""
        s = self.evaluated
        s = s[(s["dataset"] == dataset) & (s["family"] == family)]
        return s if setting is None else s[s["setting"] == setting]

    def settings(self, dataset: str, family: str = "mlp") -> list[str]:
        """The settings of the evaluated models of ``family`` on ``dataset``, sorted."""
        return sorted(set(self.models(dataset, family)["setting"]))

    def best(self, dataset: str, family: str, setting: str = "plain") -> pd.DataFrame:
        """The best evaluated model per method (index), lowest test error then model id."""
        s = self.models(dataset, family, setting).sort_values(["test_error", "model_id"])
        return s.groupby("method", sort=True).head(1).set_index("method")


#: Config keys that may differ between pooled runs: the results folder and the grids.
POOL_FREE = [("results",), ("train", "grid"), ("train", "grid_by_setting"), ("kernel", "grid")]


def _pool_signature(meta: dict[str, Any]) -> dict[str, Any]:
    """What pooled runs must share: the config without :data:`POOL_FREE`, the epochs, the
    machine, the devices used and the commit."""
    cfg = copy.deepcopy(meta["config"])
    for *path, key in POOL_FREE:
        functools.reduce(lambda node, k: node.get(k, {}), path, cfg).pop(key, None)
    return {
        "config": cfg,
        "epochs": meta.get("epochs"),
        "machine": meta.get("machine"),
        "devices": sorted(meta.get("devices") or {}),
        "commit": (meta.get("git") or {}).get("commit"),
    }


def _pool(members: list[Run]) -> Run:
    """The runs of one pool as one :class:`Run` named ``a + b`` (:func:`pool_runs`)."""
    label = members[0].meta["pool"]
    first = _pool_signature(members[0].meta)
    for other in members[1:]:
        sig = _pool_signature(other.meta)
        diff = sorted(k for k in first if first[k] != sig[k])
        if diff:
            raise ValueError(
                f"runs {members[0].name} and {other.name} share the pool {label!r} but "
                f"differ in {', '.join(diff)}: pool only runs of the same settings"
            )
    summary = pd.concat([m.summary for m in members], ignore_index=True)
    dup = summary["model_id"][summary.duplicated(["dataset", "model_id"])]
    if len(dup):
        raise ValueError(f"pool {label!r}: model {dup.iloc[0]} is in more than one run")
    names = tuple(m.name for m in members)
    return Run(" + ".join(names), members[0].folder, members[0].meta, summary, names)


def pool_runs(runs: list[Run]) -> list[Run]:
    """The units the claims are evaluated on: each run alone, except runs with the same
    ``pool`` label in their run.yaml, which become one :class:`Run` named ``a + b`` (their
    summaries concatenated, at the place of the first). Raises ``ValueError`` when pooled
    runs differ in anything but their results folder and grids (:func:`_pool_signature`),
    or share a model id."""
    units: dict[tuple[str, str], list[Run]] = {}  # a pool's runs at the place of its first
    for run in runs:
        label = run.meta.get("pool")
        units.setdefault(("pool", label) if label else ("run", run.name), []).append(run)
    return [_pool(u) if kind == "pool" else u[0] for (kind, _), u in units.items()]


@dataclass
class Part:
    """One comparison of a check: ``ok`` is None when the run lacks the data for it."""

    what: str
    numbers: str
    ok: bool | None

    def line(self) -> str:
        mark = {True: "holds", False: "fails", None: "not run"}[self.ok]
        return f"{self.what}: {self.numbers} ({mark})"


@dataclass
class Verdict:
    """The verdict of a claim on one run and scope (dataset, setting)."""

    claim: str
    run: str
    scope: str
    parts: list[Part] = field(default_factory=list)
    details: pd.DataFrame | None = None
    missing: str = ""

    @property
    def status(self) -> str:
        checked = [p.ok for p in self.parts if p.ok is not None]
        if not checked:
            return NOT_RUN
        return REPRODUCED if all(checked) else NOT_REPRODUCED

    def numbers(self) -> str:
        """All parts on one line (what the verdict rests on)."""
        if not self.parts or all(p.ok is None for p in self.parts):
            return self.missing or "no data for this claim in the run"
        return "; ".join(p.line() for p in self.parts)

    def gap(self) -> str:
        """The failing parts (the measured gap to the paper's claim)."""
        return "; ".join(p.line() for p in self.parts if p.ok is False)


def column(frame: pd.DataFrame, name: str) -> pd.Series:
    """``frame[name]``, or missing values where the run was exported before it existed."""
    return frame[name] if name in frame else pd.Series(math.nan, index=frame.index)


def ordered(best: pd.DataFrame, order: list[str]) -> pd.DataFrame:
    """The rows of ``best`` (best models by method) in the methods' ``order``."""
    return best.loc[[m for m in order if m in best.index]]


def ratio_of(a: Any, b: Any) -> Any:
    """``a / b`` (numbers or columns), NaN where ``b`` is 0 or either is NaN."""
    if isinstance(b, pd.Series):
        return (a / b).where(b != 0)
    return a / b if b and not math.isnan(a) and not math.isnan(b) else float("nan")


#: The comparisons of :class:`Comparison`: op -> (whether ``a`` against ``b`` holds, given
#: their ratio ``r`` and the threshold ``t``; what a part needs, as ``Comparison.needs``).
OPS: dict[str, tuple[Callable[[float, float, float, float], bool], str]] = {
    "at_least": (lambda a, b, r, t: r >= t - EPS, "≥ {t}"),
    "at_most": (lambda a, b, r, t: r <= t + EPS, "≤ {t}"),
    "above": (lambda a, b, r, t: r > t, "> {t}"),
    "within": (lambda a, b, r, t: abs(r - 1) <= t + EPS, "×{lo:.2f} to ×{hi:.2f}"),
    "near": (lambda a, b, r, t: abs(a - b) <= t + EPS, "{t}"),
    "points_above": (lambda a, b, r, t: a <= b + t + EPS, "≤ {b} + {t} points"),
    "points_below": (lambda a, b, r, t: a <= b - t + EPS, "{t} points lower"),
    "gt": (lambda a, b, r, t: a > b, ""),
}


@dataclass(frozen=True)
class Comparison:
    """A comparison ``op`` (:data:`OPS`) of ``a`` with ``b`` and its threshold ``t``; a
    missing value (NaN) is not judged."""

    op: str
    t: float = 0.0

    def judge(self, a: float, b: float) -> bool | None:
        if any(x is None or math.isnan(x) for x in (a, b)):
            return None
        return bool(OPS[self.op][0](a, b, ratio_of(a, b), self.t))

    @property
    def ratio(self) -> bool:
        return self.op in ("at_least", "at_most", "above", "within")

    @property
    def text(self) -> str:
        """The threshold as the criterion states it (``×1.05``, ``± 10%``, ``± 0.05``,
        ``0.2`` points)."""
        if self.op in ("within", "near"):
            return f"± {100 * self.t:.0f}%" if self.op == "within" else f"± {self.t}"
        return f"{100 * self.t:.1f}" if self.op.startswith("points") else times(self.t)

    def needs(self, label: str = "") -> str:
        """What a part needs (``≥ ×1.05``); ``label`` names ``b`` (``best``)."""
        return OPS[self.op][1].format(t=self.text, lo=1 - self.t, hi=1 + self.t, b=label)


@dataclass(frozen=True)
class Row:
    """One comparison of a claim among the best models per method: method ``a``'s ``col``
    against each method of ``b`` (one part per method present), or with ``pick`` (``min``,
    ``max``) against the lowest or highest of those present (``best``, or ``best other``
    when ``a`` is not among them), judged by ``test``; in ``setting`` (``None``: the
    verdict's). ``what`` names the part, ``{a}`` and ``{b}`` standing for the methods."""

    what: str
    col: str
    a: str
    b: str | tuple[str, ...]
    test: Comparison
    pick: str = ""
    setting: str | None = None

    @property
    def methods(self) -> tuple[str, ...]:
        return (self.b,) if isinstance(self.b, str) else self.b

    def part(self, best: pd.DataFrame, b: str | list[str], labelled: bool) -> Part:
        """The part comparing ``a`` with ``b`` (a method, or the methods to ``pick`` from)."""
        col = column(best, self.col)  # NaN where exported before it existed: no verdict
        x = col[self.a]
        one = isinstance(b, str)
        y = col[b] if one else getattr(col[b], self.pick)()
        label = "" if one else "best " if self.a in b else "best other "
        fmt = pct if self.col == "test_error" else num
        la, lb = (f" ({LABEL[self.a]})", f" ({LABEL[b]})") if labelled else ("", "")
        text = f"{fmt(x)}{la} vs {label}{fmt(y)}{lb}"
        text += f" = {times(ratio_of(x, y))}" if self.test.ratio else ""
        need = self.test.needs(label.strip())
        what = self.what.format(a=LABEL[self.a], b=LABEL[b] if one else "")
        return Part(what, text + (f", needs {need}" if need else ""), self.test.judge(x, y))

    def parts(self, best: pd.DataFrame, labelled: bool = False, absent: str = "") -> list[Part]:
        """Its parts on ``best``; a comparison whose methods are not all there has a part
        saying ``absent``, not judged (none without ``absent``)."""
        have = set(best.index)
        if self.pick:
            there = [m for m in self.methods if m in have]
            if self.a in have and set(there) - {self.a}:
                return [self.part(best, there, labelled)]
            pairs = [""]
        else:
            pairs = list(self.methods)
        return [
            self.part(best, b, labelled)
            if {self.a, b} <= have
            else Part(self.what.format(a=LABEL[self.a], b=LABEL.get(b, "")), absent, None)
            for b in pairs
            if {self.a, b} <= have or absent
        ]


@dataclass(frozen=True)
class Scope:
    """The best models a claim compares: of ``family``, on every dataset with them (the
    paper's dataset ``paper`` only, if given), one verdict per dataset and setting of
    ``settings`` with data, named by ``label``; ``need``: why a verdict has no part."""

    family: str = "mlp"
    paper: str | None = None
    settings: tuple[str, ...] = ("plain",)
    label: str = "{ds}"
    need: str = ""


@dataclass(frozen=True)
class Claim:
    """A claim of Section 5 as the record checks it: the ``criterion`` printed in the record
    (``{0}``, ``{1}``, ... stand for the thresholds of its tests, ``{smallest}`` for Table 1's
    smallest ratios), and either ``rows`` compared among the best models of ``scope``, or a
    ``check`` of its own reading ``test`` (and ``rows``, if any). ``none``: why a run has no
    verdict; ``absent``: the text of a part whose methods the run lacks (default: no part);
    ``labelled``: the numbers name their methods; ``details``: the columns of the table under
    a verdict (:func:`cells`; in ``claims.yaml``, ``bounds`` unless the claim has its own)."""

    key: str
    criterion: str
    none: str
    rows: tuple[Row, ...] = ()
    scope: Scope = Scope()
    check: Callable[[Run, Claim], Iterator[Verdict]] | None = None
    test: Comparison | None = None
    absent: str = ""
    labelled: bool = False
    details: dict[str, str] = field(default_factory=dict)

    @property
    def sentence(self) -> str:
        """The criterion with its thresholds."""
        tests = [self.test] if self.test else [r.test for r in self.rows]
        return self.criterion.format(*(t.text for t in tests), smallest=_smallest_ratios())

    def evaluate(self, run: Run) -> list[Verdict]:
        """The verdicts on ``run``: one per dataset and setting with data, else one saying
        why there is none."""
        out = list(self.check(run, self) if self.check else self._compare(run))
        return out or [Verdict(self.key, run.name, "–", missing=self.none)]

    def _compare(self, run: Run) -> Iterator[Verdict]:
        sc = self.scope
        order = KERNEL_ORDER if sc.family == "kernel" else NET_ORDER
        for ds in run.datasets(sc.family, sc.paper):
            for setting in sc.settings:
                best = run.best(ds, sc.family, setting)
                if not len(best):
                    continue
                scope = sc.label.format(ds=ds, setting=setting)
                details = cells(ordered(best, order), self.details)
                v = Verdict(self.key, run.name, scope, details=details)
                for row in self.rows:
                    there = row.setting in (None, setting)
                    b = best if there else run.best(ds, sc.family, row.setting)
                    v.parts += row.parts(b, self.labelled, self.absent)
                v.missing = "" if v.parts else sc.need.format(ds=ds)
                yield v


def check_local_global(run: Run, claim: Claim) -> Iterator[Verdict]:
    """No evaluated point of any one-hidden-layer network has a global guarantee above its
    local one (``n_global_above_local == 0`` for every model)."""
    if "n_global_above_local" not in run.summary:
        why = "summary.csv has no n_global_above_local column (exported before the column existed)"
        yield Verdict(claim.key, run.name, "–", missing=why)
        return
    for ds in run.datasets("mlp"):
        s = run.models(ds, "mlp")
        s = s[s["n_global_above_local"].notna()].sort_values(["setting", "method", "model_id"])
        if not len(s):
            continue
        n_above = int(s["n_global_above_local"].sum())
        part = Part(
            "points where the global guarantee exceeds the local one",
            f"{n_above} of {int(s['n_correct'].sum())} on {len(s)} model(s), largest "
            f"ratio global/local {num(s['max_ratio_global_local'].max())}",
            n_above == 0,
        )
        yield Verdict(claim.key, run.name, ds, [part], cells(s, claim.details))


def check_table1(run: Run, claim: Claim) -> Iterator[Verdict]:
    """Each mean ratio alpha_global / alpha_local of the best model per regularizer (plain)
    near the paper's Table 1 (``claim.test``)."""
    for ds in run.datasets("mlp"):
        paper_ds = PAPER_DATASET.get(ds)
        if (paper_ds, "none") not in TABLE1:
            continue
        best = run.best(ds, "mlp")
        s = run.models(ds, "mlp", "plain")
        v = Verdict(claim.key, run.name, f"{ds}, plain")
        rows = []
        for reg in [r for r in NET_ORDER if (paper_ds, r) in TABLE1]:  # the paper's methods
            paper = TABLE1[(paper_ds, reg)]
            ours = best["mean_ratio_global_local"].get(reg, math.nan)
            ok = claim.test.judge(ours, paper.value)
            rows.append(
                {
                    "paper": paper,
                    "ours": ours,
                    "difference": None if ok is None else ours - paper.value,
                    "mean": s[s["method"] == reg]["mean_ratio_global_local"].mean(),
                    "test_error": best["test_error"].get(reg),
                }
            )
            numbers = f"{num(ours, 2)} vs paper {paper.text}, needs {claim.test.needs()}"
            v.parts.append(Part(paper.column, numbers, ok))
        v.details = cells(rows, claim.details)
        yield v


#: The smallest ratio of Table 1 per paper dataset: the largest factor by which the local
#: guarantee beats the global one.
SMALLEST: dict[str, PaperNumber] = {
    ds: min((n for (d, _), n in TABLE1.items() if d == ds), key=lambda n: n.value)
    for ds, _ in TABLE1
}


def check_local_factor(run: Run, claim: Claim) -> Iterator[Verdict]:
    """The smallest mean ratio alpha_global / alpha_local among the best models per
    regularizer (plain), that is the largest factor by which the local guarantee beats the
    global one, near the smallest ratio of the paper's Table 1 for the dataset."""
    for ds in run.datasets("mlp"):
        low, best = SMALLEST.get(PAPER_DATASET.get(ds)), run.best(ds, "mlp")
        if low is None or not len(best):
            continue
        ratios = best["mean_ratio_global_local"].dropna()
        v = Verdict(claim.key, run.name, f"{ds}, plain")
        if len(ratios):
            m = ratios.idxmin()
            ours = float(ratios[m])
            v.parts.append(
                Part(
                    "smallest ratio",
                    f"{num(ours, 2)} ({LABEL[m]}), local ×{1 / ours:.1f} the global, vs paper "
                    f"{low.text} ({low.column}), ×{1 / low.value:.1f}; needs "
                    f"{claim.test.needs()}",
                    claim.test.judge(ours, low.value),
                )
            )
        yield v


def check_bounds_close(run: Run, claim: Claim) -> Iterator[Verdict]:
    """Per dataset and setting, every best network's mean upper bound (the paper's
    procedure) against its mean guarantee (``claim.test``); the refined upper bound
    (re-linearized at the sample, never larger) and the mean of the smallest verified bound
    per point (with the minimal-norm attack, where the run has it) are shown beside it."""
    for ds in run.datasets("mlp"):
        for setting in run.settings(ds):
            b = ordered(run.best(ds, "mlp", setting), NET_ORDER)
            g, ub = b["mean_guarantee_local"], b["mean_upper_bound"]
            refined, best_ub = (column(b, f"mean_upper_bound_l2_{k}") for k in ("refined", "best"))
            rows = b.assign(
                ratio=ratio_of(ub, g),
                refined=refined,
                refined_ratio=ratio_of(refined, g),
                refinement=ratio_of(refined, ub),
                best=best_ub,
                best_ratio=ratio_of(best_ub, g),
            )
            parts = [
                Part(
                    f"upper bound / guarantee of {LABEL[m]}",
                    f"{num(ub[m])} / {num(g[m])} = {times(k)}, needs {claim.test.needs()}",
                    None if math.isnan(k) else claim.test.judge(ub[m], g[m]),
                )
                for m, k in rows["ratio"].items()
            ]
            details = cells(rows, claim.details)
            yield Verdict(claim.key, run.name, f"{ds}, {setting}", parts, details)


def check_kernel_vs_nets(run: Run, claim: Claim) -> Iterator[Verdict]:
    """Per dataset with kernel models and networks (plain): the largest mean guarantee of
    the best kernel models below the smallest of the best networks."""
    for ds in sorted(set(run.datasets("kernel")) & set(run.datasets("mlp"))):
        kern, nets = run.best(ds, "kernel"), run.best(ds, "mlp")
        if not len(kern) or not len(nets):
            continue
        k, n = kern["mean_guarantee_local"].idxmax(), nets["mean_guarantee_local"].idxmin()
        a, b = kern.loc[k, "mean_guarantee_local"], nets.loc[n, "mean_guarantee_local"]
        part = Part(
            "largest kernel guarantee vs smallest network guarantee",
            f"{num(a)} ({LABEL[k]}) vs {num(b)} ({LABEL[n]})",
            bool(a < b),
        )
        both = pd.concat([ordered(kern, KERNEL_ORDER), ordered(nets, NET_ORDER)])
        details = cells(both, claim.details)
        yield Verdict(claim.key, run.name, f"{ds}, plain", [part], details)


def check_setting(run: Run, claim: Claim) -> Iterator[Verdict]:
    """Per regularizer, the best model of the setting ``claim.key`` against the best plain
    one: both mean bounds judged by ``claim.test`` (other / plain); on CIFAR10 also the test
    error, which the paper says improves in both settings (line 674)."""
    setting, test = claim.key, claim.test
    for ds in run.datasets("mlp"):
        plain, other = run.best(ds, "mlp", "plain"), run.best(ds, "mlp", setting)
        if not len(other):
            continue
        v = Verdict(claim.key, run.name, f"{ds}, plain vs {setting}")
        rows = []
        for m in [m for m in NET_ORDER if m in plain.index and m in other.index]:
            p, o = plain.loc[m], other.loc[m]
            row = {"method": m, "plain": p, "other": o}
            for col, what in [
                ("mean_guarantee_local", "guarantee"),
                ("mean_upper_bound", "upper bound"),
            ]:
                r, pair = ratio_of(o[col], p[col]), f"{num(p[col])} plain, {num(o[col])} {setting}"
                row[col] = r  # other / plain
                numbers = f"{pair} = {times(r)}, needs {test.needs()}"
                v.parts.append(Part(f"{what} {LABEL[m]}", numbers, test.judge(o[col], p[col])))
            if PAPER_DATASET.get(ds) == "cifar10":
                v.parts.append(
                    Part(
                        f"test error {LABEL[m]}",
                        f"{pct(p['test_error'])} plain, {pct(o['test_error'])} {setting}, "
                        "needs lower",
                        bool(o["test_error"] < p["test_error"]),
                    )
                )
            rows.append(row)
        v.details = cells(rows, claim.details, setting=setting)
        yield v


def paper_illustration_means() -> dict[str, float]:
    """The paper's mean ``||delta||_2`` per classifier over its nine illustrated images."""
    norms = pd.DataFrame([{c: norm for c, (_, norm) in ex.samples.items()} for ex in ILLUSTRATION])
    return norms.mean().to_dict()


def check_illustration(run: Run, claim: Claim) -> Iterator[Verdict]:
    """MNIST, plain: per model kind, the CL model's mean L2 upper bound is the largest
    (``claim.rows``: K-CL above K-SVM; NN-CL above NN-WD and NN-DO), over all evaluated
    points rather than the paper's nine images."""
    paper = paper_illustration_means()
    for ds in sorted(set(run.datasets("mlp", "mnist") + run.datasets("kernel", "mnist"))):
        best = {fam: run.best(ds, fam) for fam in ("kernel", "mlp")}
        rows = [
            {"classifier": clf, "paper": paper[clf], "ours": best[fam]["mean_upper_bound"].get(m)}
            for clf, (fam, m) in ILLUSTRATION_CLASSIFIERS.items()
        ]
        family = {m: fam for fam, m in ILLUSTRATION_CLASSIFIERS.values()}
        parts = [p for r in claim.rows for p in r.parts(best[family[r.a]], absent=claim.absent)]
        yield Verdict(claim.key, run.name, f"{ds}, plain", parts, cells(rows, claim.details))


def _smallest_ratios() -> str:
    """The smallest ratio of Table 1 per dataset group, with its factor
    (``MNIST (plain) 0.21, ×4.8; ...``)."""
    return "; ".join(f"{n.row} {n.text}, ×{1 / n.value:.1f}" for n in SMALLEST.values())


#: Each claim's check of its own (claims.yaml: ``check``, default the claim's key).
CHECKS = {
    "local_global": check_local_global,
    "table1": check_table1,
    "local_factor": check_local_factor,
    "bounds_close": check_bounds_close,
    "kernel_vs_nets": check_kernel_vs_nets,
    "setting": check_setting,
    "illustration": check_illustration,
}


def _claims(table: dict[str, Any]) -> dict[str, Claim]:
    """The table of ``claims.yaml`` (beside this module): claim key -> :class:`Claim`."""
    tests = {name: Comparison(op, t) for name, (op, t) in table["tests"].items()}

    def row(what: str, col: str, a: str, b: str | list[str], test: str, *more: str) -> Row:
        b = table["groups"].get(b, b) if isinstance(b, str) else b  # a group: its methods
        return Row(what, col, a, b if isinstance(b, str) else tuple(b), tests[test], *more)

    return {
        key: Claim(
            key,
            c["criterion"],
            c["none"],
            tuple(row(*r) for r in c.get("rows", ())),
            Scope(**table["scopes"].get(c.get("scope"), {})),
            CHECKS.get(c.get("check", key)),
            tests.get(c.get("test")),
            c.get("absent", ""),
            c.get("labelled", False),
            c.get("details", table["bounds"]),
        )
        for key, c in table["claims"].items()
    }


#: The claims of Section 5 in the record's order (module docstring).
CRITERIA = _claims(_TABLE)


def evaluate(runs: list[Run]) -> dict[str, list[Verdict]]:
    """claim key -> the verdicts over all runs (in run order; pool them first with
    :func:`pool_runs` to evaluate pooled runs as one)."""
    return {key: [v for run in runs for v in c.evaluate(run)] for key, c in CRITERIA.items()}
