"""Render ``docs/reproduction.md`` from the committed run folders ``docs/reproduction/*/``.

The text is the Jinja2 template ``record.md.j2`` beside this module; this module gathers what
it shows: the verdicts (:mod:`~crosslip.reproduction.claims`, pooled runs evaluated as one),
each run's settings beside the paper's (:mod:`~crosslip.reproduction.paper`), every
evaluated network and how the best move with the epochs, the runs not yet made with their
projected GPU time (:mod:`~crosslip.reproduction.targets`), and the studies made to
explain a gap (:mod:`~crosslip.reproduction.studies`). Every table is generated
(``DataFrame.to_markdown``; most from their columns in ``record.yaml``, cells as format
strings over a row, :func:`~crosslip.reproduction.claims.cells`); the output depends on the
run folders and the configs they name for the runs not yet made (``config/``), so rendering
twice gives the same bytes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2
import pandas as pd
import yaml

from ..results_schema import L2_UPPER_METHODS
from . import claims as C
from .export import NOTES_FILE, RUN_FILE
from .field import FIELD, anchors, field_runs
from .paper import (
    AUTHORS_EPOCHS,
    AUTHORS_LR_DECAY,
    CLAIMS,
    FIGURES,
    KERNEL,
    KERNEL_COLUMNS,
    KERNEL_COMMENTED_OUT,
    PAPER_DATASET,
    SETTINGS,
    TABLE1,
    TEX_NAME,
)
from .studies import STUDIES_DIR, load_studies, study_tables
from .targets import Missing, targets

RECORD_NAME = "reproduction.md"
RUNS_DIR = "reproduction"
#: The columns of the record's tables (``record.yaml`` beside this module).
TABLES = yaml.safe_load(Path(__file__).with_name("record.yaml").read_text(encoding="utf-8"))


def table(df: pd.DataFrame) -> str:
    """A generated Markdown table (cells as formatted, no number re-parsing)."""
    return df.to_markdown(index=False, disable_numparse=True)


def load_runs(docs: Path) -> list[C.Run]:
    """Every run folder ``docs/reproduction/*/`` with a ``run.yaml``, by name; hidden
    folders (an export's temporaries, :func:`crosslip.io.atomic_dir`) are not runs."""
    base = docs / RUNS_DIR
    found = base.glob(f"[!.]*/{RUN_FILE}") if base.is_dir() else []
    folders = sorted(p.parent for p in found)
    return [C.Run.load(f) for f in folders]


def short_device(device: str) -> str:
    """A device name for a table header (``NVIDIA H100 80GB HBM3`` -> ``H100 80GB HBM3``)."""
    return device.removeprefix("NVIDIA ")


def unit_scale(unit: C.Run) -> str:
    """``device, N epochs`` of a run or pooled runs (``kernels`` for no networks)."""
    epochs = f"{unit.epochs} epochs" if unit.epochs else "kernels"
    return f"{short_device(unit.device)}, {epochs}"


def unit_label(unit: C.Run) -> str:
    """``name (device, N epochs)``: a run, or pooled runs, as a column of the record."""
    return f"{unit.name} ({unit_scale(unit)})"


def _grid_text(values: list[float] | tuple[float, ...]) -> str:
    return "{" + ", ".join(f"{float(v):g}" for v in values) + "}"


#: The columns of a run's settings table.
SETTINGS_COLUMNS = ["setting", "paper", "this run", "same", "source"]


def settings_rows(meta: dict[str, Any]) -> list[dict[str, str]]:
    """The run's settings beside the paper's (Section 5), one row per setting: ``setting``,
    ``paper``, ``this run``, ``same`` (yes/no/–) and ``source`` (tex line)."""
    cfg = meta["config"]
    train = cfg["train"]
    grid = train.get("grid") or {}
    kgrid = cfg.get("kernel", {}).get("grid") or {}
    rows: list[dict[str, str]] = []

    def add(what: str, paper: str, ours: Any, same: bool | None, stated: Any = None) -> None:
        """A row; ``stated``: the paper's setting that states it (none: the authors' code)."""
        source = "authors' code" if stated is None else f"tex line {stated.line}"
        same_text = {True: "yes", False: "**no**", None: "–"}[same]
        row = [what, paper, str(ours), same_text, source]
        rows.append(dict(zip(SETTINGS_COLUMNS, row, strict=True)))

    def add_grid(what: str, s: Any, ours: list[float] | None, missing: str = "–") -> None:
        same = bool(ours) and {float(x) for x in ours} == set(s.values)
        add(what, _grid_text(s.values), _grid_text(ours) if ours else missing, same, s)

    points = meta.get("evaluated_points_per_model") or []
    for ds in cfg["datasets"]:
        pds = PAPER_DATASET.get(ds, ds)
        if s := SETTINGS.get((pds, "n_train")):
            add(f"{ds}: dataset", f"full MNIST ({s.text})", ds, ds == pds, s)
        if s := SETTINGS.get((pds, "n_test")):
            ours = ", ".join(map(str, points)) or "–"
            fits = bool(points) and min(points) >= s.values[0]
            paper = f"{s.values[0]:g} (the test set)"
            add(f"{ds}: evaluated points per model", paper, ours, fits, s)
    if grid:
        epochs = train["epochs"]
        paper = f"not stated (the authors' code: {AUTHORS_EPOCHS})"
        add("epochs", paper, epochs, epochs == AUTHORS_EPOCHS)
        size, b = train["batch_size"], SETTINGS[("all", "batch_size")]
        add("batch size", f"{b.values[0]:g}", size, size == b.values[0], b)
        if cfg.get("model", {}).get("arch", "mlp") == "mlp":
            hidden, h = cfg["model"]["hidden"], SETTINGS[("all", "hidden")]
            add("hidden units", f"{h.values[0]:g}", hidden, hidden == h.values[0], h)
        both = set(train["settings"]) == {"plain", "augment", "adversarial"}
        ours = ", ".join(train["settings"])
        add("settings", "plain, augment, adversarial", ours, both, SETTINGS[("all", "settings")])
        decay = "none"
        if train.get("lr_decay_at"):
            at = ", ".join(f"{x:.0%}" for x in train["lr_decay_at"])
            decay = f"×{train['lr_decay']:g} at {at} of the updates"
        factor, at = AUTHORS_LR_DECAY
        authors = ", ".join(f"×{factor ** (i + 1):g} at {f:.0%}" for i, f in enumerate(at))
        add("learning-rate decay", f"not stated (the authors' code: {authors})", decay, None)
        for ds in cfg["datasets"]:
            pds = PAPER_DATASET.get(ds, ds)
            if (pds, "lr") not in SETTINGS:
                continue
            lrs = sorted({float(x) for g in grid.values() for x in g["lr"]})
            add_grid(f"{ds}: learning rates", SETTINGS[(pds, "lr")], lrs)
            for reg in ["weight_decay", "cross_lipschitz", "dropout"]:
                if s := SETTINGS.get((pds, reg)):
                    ours = grid.get(reg, {}).get("keep_hidden" if reg == "dropout" else "lambda")
                    add_grid(f"{ds}: {s.what}", s, ours, "not trained")
    if kgrid:
        n = cfg["kernel"].get("n_centers", 0)
        s = SETTINGS[("mnist", "n_train")]
        add("kernel: expansion points", "all 60000 training points", n or "all", n == 0, s)
        a = sorted({float(x) for g in kgrid.values() for x in g["a"]})
        add_grid("kernel: a (γ = a/ρ²)", SETTINGS[("mnist", "kernel_a")], a)
        for reg in ["kernel_logreg", "kernel_cl"]:
            s = SETTINGS[("mnist", reg)]
            lams = [x for x in kgrid.get(reg, {}).get("lambda", []) if x > 0]
            add_grid(f"kernel: {s.what}", s, lams)
    networks = "networks: every model; kernels: the best per method"
    certified = cfg["certify"].get("models", "all")
    add("models certified", networks, certified, None, SETTINGS[("all", "kernel_certified")])
    return rows


def _combined(vs: list[C.Verdict]) -> tuple[str, int, int]:
    """One verdict for a claim's verdicts on one unit (several datasets or settings):
    not reproduced if any is, else reproduced if any is; with the parts that hold and the
    parts checked."""
    statuses = {v.status for v in vs}
    status = next((s for s in (C.NOT_REPRODUCED, C.REPRODUCED) if s in statuses), C.NOT_RUN)
    checked = [p.ok for v in vs for p in v.parts if p.ok is not None]
    return status, sum(checked), len(checked)


def full_data(unit: C.Run) -> bool:
    """Whether every dataset of ``unit`` is one of the paper's own (full MNIST, not the
    embedded 5,000 digits)."""
    return all(d in set(PAPER_DATASET.values()) for d in unit.datasets())


def headline(vs: list[C.Verdict], units: list[C.Run]) -> C.Verdict | None:
    """The verdict of a claim from the unit with data for it at the largest scale: on the
    paper's full datasets rather than a subset, then trained longest (kernel-only units
    count as 0 epochs), then evaluated the most models."""
    rank = {
        u.name: (full_data(u), u.epochs or 0, len(u.evaluated), -i) for i, u in enumerate(units)
    }
    with_data = [v for v in vs if v.status != C.NOT_RUN]
    if not with_data:
        return None
    return max(with_data, key=lambda v: (rank[v.run], v.status == C.NOT_REPRODUCED))


#: The glance table's column of each claim's verdict at the largest scale we ran.
BEST_RUN = "at the largest scale we ran"


def _glance(claims: list[dict[str, Any]], units: list[C.Run]) -> pd.DataFrame:
    """The verdict of every claim at the largest scale we ran (:func:`headline`, with its
    unit) and on every unit, with the checks that hold."""
    rows = []
    for c in claims:
        row = {"claim": c["paper"].title}
        best = c["headline"]
        per = {u.name: _combined([v for v in c["verdicts"] if v.run == u.name]) for u in units}
        if best is not None:
            status, ok, n = per[best.run]
            row[BEST_RUN] = f"**{status}** ({ok}/{n}, {best.run})"
        else:
            row[BEST_RUN] = f"**{C.NOT_RUN}**"
        for u in units:
            status, ok, n = per[u.name]
            row[unit_label(u)] = f"**{status}**" + (f" ({ok}/{n})" if n else "")
        rows.append(row if units else {**row, "verdict": f"**{C.NOT_RUN}**"})
    return pd.DataFrame(rows)


def _runs_table(runs: list[C.Run], unit_of: dict[str, C.Run]) -> pd.DataFrame:
    """The committed runs, one row each (``record.yaml``: ``runs``)."""
    rows = [
        {
            **run.meta,
            "run": run,
            "families": sorted(set(run.summary["family"])),
            "settings": run.meta["config"]["train"]["settings"] if run.epochs else ["plain"],
            "epochs": run.epochs,
            "job_s": sum(v["seconds"] for v in (run.meta.get("job_seconds") or {}).values()),
            "commit": ((run.meta.get("git") or {}).get("commit") or "–")[:10],
            "unit": unit_of[run.name],
        }
        for run in runs
    ]
    return C.cells(rows, TABLES["runs"])


def _ratio_text(ratio: float, paper_ds: str | None, method: str, setting: str) -> str:
    """A Table 1 ratio with the paper's beside it where Table 1 has it (plain only)."""
    paper = TABLE1.get((paper_ds, method)) if setting == "plain" else None
    return C.num(ratio, 2) + (f" (paper {paper.text})" if paper else "")


def network_rows(unit: C.Run, ds: str, setting: str) -> pd.DataFrame:
    """Every evaluated network of ``unit`` on ``ds`` in ``setting``, by regularizer then
    model id: the record's per-run network tables (``record.yaml``: ``networks``)."""
    s = unit.models(ds, "mlp", setting)
    order = {m: i for i, m in enumerate(C.NET_ORDER)}
    s = s.assign(_o=s["method"].map(order)).sort_values(["_o", "model_id"])
    shares = [C.column(s, f"share_best_l2_{m}") for m in L2_UPPER_METHODS]
    rows = s.assign(
        all_points=s["mean_guarantee_local"] * s["n_correct"] / s["n_eval"],
        ratio=[
            _ratio_text(r, PAPER_DATASET.get(ds), m, setting)
            for r, m in zip(s["mean_ratio_global_local"], s["method"], strict=True)
        ],
        refinement=C.ratio_of(C.column(s, "mean_upper_bound_l2_refined"), s["mean_upper_bound"]),
        shares=[
            "–" if any(pd.isna(v) for v in row) else " / ".join(f"{100 * v:.0f}%" for v in row)
            for row in zip(*shares, strict=True)
        ],
    )
    return C.cells(rows.to_dict("records"), TABLES["networks"])


def _trends(units: list[C.Run]) -> list[tuple[str, pd.DataFrame, list[Any]]]:
    """Per paper dataset with networks from two units or more: the best network per
    regularizer of every unit (plain), by epochs (``record.yaml``: ``trends``), and per
    regularizer how its Table 1 ratio and guarantee move."""
    out = []
    for paper_ds in ["mnist", "cifar10", "gtsrb"]:
        cols = [
            (u, best)
            for u in sorted(units, key=lambda u: (u.epochs or 0, u.name))
            for ds in u.datasets("mlp", paper_ds)
            for best in [u.best(ds, "mlp")]
            if len(best)
        ]
        if len(cols) < 2:
            continue
        rows = [
            {
                **r,
                "method": m,
                "run": u.name,
                "device": short_device(u.device),
                "epochs": u.epochs,
                "ratio": _ratio_text(r["mean_ratio_global_local"], paper_ds, m, "plain"),
            }
            for u, best in cols
            for m, r in C.ordered(best, C.NET_ORDER).iterrows()
        ]
        walks = [  # per regularizer in two units or more: its best model by epochs
            (m, seq, TABLE1.get((paper_ds, m)))
            for m in C.NET_ORDER
            for seq in [[(u, best.loc[m]) for u, best in cols if m in best.index]]
            if len(seq) > 1
        ]
        out.append((paper_ds, C.cells(rows, TABLES["trends"]), walks))
    return out


def _table1(units: list[C.Run]) -> pd.DataFrame:
    """The paper's Table 1 in full (both datasets), whether or not a run has the data, with
    the ratio of our best model per regularizer (plain) of every run beside it."""
    rows = []
    for (ds, reg), number in TABLE1.items():
        row = {
            "dataset": number.row,
            "regularizer": number.column,
            "paper": number.text,
            "source": f"tex line {number.line}",
        }
        for u in [u for u in units if u.datasets("mlp")]:
            bests = [u.best(d, "mlp")["mean_ratio_global_local"] for d in u.datasets("mlp", ds)]
            ours = [C.num(b[reg], 2) for b in bests if reg in b.index]
            row[unit_label(u)] = ", ".join(ours) or C.NOT_RUN
        rows.append(row)
    return pd.DataFrame(rows)


def _kernel_tables(units: list[C.Run]) -> tuple[pd.DataFrame, list[tuple[str, str, pd.DataFrame]]]:
    """The paper's kernel table (and the older one's columns) and, per run and dataset, the
    best kernel model per method beside the paper's (``record.yaml``: ``kernel_paper``,
    ``kernel_runs``; the headers of the paper's quantities from ``paper.yaml``)."""
    printed = {  # method -> "paper" and "older": summary column -> the paper's cell as printed
        m: {
            key: {c: n.text.replace("\\%", "%") for (k, c), n in numbers.items() if k == m}
            for key, numbers in [("paper", KERNEL), ("older", KERNEL_COMMENTED_OUT)]
        }
        for m in C.KERNEL_ORDER
    }
    paper = [{"method": m, **printed[m]} for m in C.KERNEL_ORDER]
    ours = []
    for u in units:
        for ds in u.datasets("kernel"):
            best = C.ordered(u.best(ds, "kernel"), C.KERNEL_ORDER)
            linf = C.column(best, "mean_upper_bound_linf")  # NaN in runs made before it existed
            rows = [
                {**r, "mean_upper_bound_linf": linf[m], "method": m, **printed[m]}
                for m, r in best.iterrows()
            ]
            ours.append((u.name, ds, C.cells(rows, TABLES["kernel_runs"], **KERNEL_COLUMNS)))
    return C.cells(paper, TABLES["kernel_paper"], **KERNEL_COLUMNS), ours


def _figures(runs: list[C.Run], lacking: list[Missing | str]) -> list[tuple[str, str, list, list]]:
    """Per figure of the paper: the runs' matching figures (run, file, settings) and the
    runs not yet made that would draw it."""
    out = []
    for label, (what, patterns) in FIGURES.items():
        found = [
            (run, pattern, ", ".join(t["settings"]) if t.get("grid") else "–")
            for run in runs
            for pattern in patterns
            if (run.folder / "figures" / pattern).is_file()
            for t in [run.meta["config"]["train"]]
        ]
        makers = [e for e in lacking if not isinstance(e, str) and label in e.target.figures]
        out.append((label, what, found, makers))
    return out


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(Path(__file__).parent),
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters.update(
        table=table,
        duration=C.duration,
        frame=pd.DataFrame,
        codes=lambda xs: ", ".join(f"`{x}`" for x in xs),
        pcts=lambda xs: ", ".join(f"{x:.0%}" for x in xs),
        grid=_grid_text,
    )
    helpers = [short_device, unit_scale, unit_label, C.num, study_tables]
    env.globals.update(
        {f.__name__: f for f in helpers},
        NOT_RUN=C.NOT_RUN,
        REPRODUCED=C.REPRODUCED,
        NOT_REPRODUCED=C.NOT_REPRODUCED,
        tex=TEX_NAME,
        runs_dir=RUNS_DIR,
        run_file=RUN_FILE,
        notes_file=NOTES_FILE,
        studies_dir=STUDIES_DIR,
        titles={k: c.title for k, c in CLAIMS.items()},
        labels=C.LABEL,
        net_order=C.NET_ORDER,
    )
    return env


def render(docs: Path | str = "docs", root: Path | str | None = None) -> str:
    """The record's Markdown for the runs committed under ``<docs>/reproduction/``; the
    configs of the runs not yet made are read under ``root`` (default: the folder holding
    ``docs``)."""
    docs = Path(docs)
    root = docs.resolve().parent if root is None else Path(root)
    runs = load_runs(docs)
    units = C.pool_runs(runs)
    verdicts = C.evaluate(units)
    lacking = targets(docs, root)
    kernel_paper, kernel_runs = _kernel_tables(units)
    unit_of = {p: u for u in units for p in u.parts}
    makers = {k: e for e in lacking if not isinstance(e, str) for k in e.target.claims}
    claims = [
        {
            "paper": CLAIMS[key],
            "sentence": C.CRITERIA[key].sentence,
            "verdicts": vs,
            "headline": headline(vs, units),
            "missing": makers.get(key),  # the run not yet made that would have the data
        }
        for key, vs in verdicts.items()
    ]
    statuses = [C.NOT_RUN if c["headline"] is None else c["headline"].status for c in claims]
    text = (
        _environment()
        .get_template("record.md.j2")
        .render(
            claims=claims,
            glance=_glance(claims, units),
            tally={s: statuses.count(s) for s in (C.REPRODUCED, C.NOT_REPRODUCED, C.NOT_RUN)},
            runs=runs,
            unit={u.name: u for u in units},
            unit_of=unit_of,
            runs_table=_runs_table(runs, unit_of),
            networks=[
                (u, ds, setting, network_rows(u, ds, setting))
                for u in units
                for ds in u.datasets("mlp")
                for setting in u.settings(ds)
            ],
            trends=_trends(units),
            table1=_table1(units),
            table1_claim=list(verdicts).index("table1") + 1,
            kernel_paper=kernel_paper,
            kernel_runs=kernel_runs,
            bare=[
                r.name for r in runs if not any(f.startswith("figures/") for f in r.meta["files"])
            ],
            figures=_figures(runs, lacking),
            targets=lacking,
            gaps=[(k, v) for k, vs in verdicts.items() for v in vs if v.status == C.NOT_REPRODUCED],
            settings=[(run, settings_rows(run.meta)) for run in runs],
            studies=load_studies(docs / RUNS_DIR),
            field=FIELD,
            field_anchors=anchors(),
            field_runs=field_runs(units),
        )
    )
    return text.rstrip("\n") + "\n"


def write_record(docs: Path | str = "docs", root: Path | str | None = None) -> Path:
    """Render the record into ``<docs>/reproduction.md``; return its path."""
    path = Path(docs) / RECORD_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(docs, root))
    return path
