"""Render ``docs/reproduction.md`` from the committed run folders ``docs/reproduction/*/``.

The record puts the paper's numbers (:mod:`crosslip.reproduction.paper`) beside ours for
every table, figure and claim of Section 5, with a verdict per claim and run
(:mod:`crosslip.reproduction.claims`; pooled runs evaluated as one), the settings, scale,
device and command of each run, every evaluated network's numbers, how they move with the
epochs, the runs not yet made with their command and estimated GPU time
(:mod:`crosslip.reproduction.estimates`), a section "Where we differ from the paper and
why" built from the measured gaps and from the runs' settings compared with the paper's, and
the studies made to explain a gap (:mod:`crosslip.reproduction.studies`).
Every table is generated (``DataFrame.to_markdown``); the output depends on the run folders
and the configs they name for the runs not yet made (``config/``), so rendering twice gives
the same bytes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from ..results_schema import L2_UPPER_METHODS
from .claims import (
    CRITERIA,
    KERNEL_ORDER,
    LABEL,
    NET_ORDER,
    NOT_REPRODUCED,
    NOT_RUN,
    REPRODUCED,
    Run,
    Verdict,
    duration,
    evaluate,
    num,
    pct,
    pool_runs,
)
from .estimates import Estimate, Measured, estimates
from .export import RUN_FILE
from .paper import (
    AUTHORS_EPOCHS,
    AUTHORS_LR_DECAY,
    CLAIMS,
    FIGURES,
    KERNEL,
    KERNEL_COMMENTED_OUT,
    PAPER_DATASET,
    SETTINGS,
    TABLE1,
    TEX_NAME,
)
from .studies import STUDIES_DIR, guarantee_gap_tables, load_studies, provenance

RECORD_NAME = "reproduction.md"
RUNS_DIR = "reproduction"
#: Optional notes written with a run (not generated), shown under "Where we differ".
NOTES_FILE = "notes.md"


def table(df: pd.DataFrame) -> str:
    """A generated Markdown table (cells as formatted, no number re-parsing)."""
    return df.to_markdown(index=False, disable_numparse=True)


def load_runs(docs: Path) -> list[Run]:
    """Every run folder ``docs/reproduction/*/`` with a ``run.yaml``, by name."""
    base = docs / RUNS_DIR
    folders = sorted(p.parent for p in base.glob(f"*/{RUN_FILE}")) if base.is_dir() else []
    return [Run.load(f) for f in folders]


def machine_text(machine: Any) -> str:
    """The ``machine`` of a run.yaml as one line."""
    if not isinstance(machine, dict):
        return str(machine)
    text = f"{machine.get('cpu') or 'unknown CPU'}"
    extra = [
        f"{machine['logical_cpus']} logical CPUs" if machine.get("logical_cpus") else "",
        f"{machine['memory_gib']} GiB" if machine.get("memory_gib") else "",
    ]
    extra = [e for e in extra if e]
    if extra:
        text += f" ({', '.join(extra)})"
    text += f", GPU {machine['gpu']}" if machine.get("gpu") else ", no GPU"
    return text + (f"; {machine['software']}" if machine.get("software") else "")


def _count(n: int, what: str) -> str:
    """``1 file``, ``3 files``."""
    return f"{n} {what}{'' if n == 1 else 's'}"


def short_device(device: str) -> str:
    """A device name for a table header (``NVIDIA H100 80GB HBM3`` -> ``H100 80GB HBM3``)."""
    return device.removeprefix("NVIDIA ")


def unit_scale(unit: Run) -> str:
    """``device, N epochs`` of a run or pooled runs (``kernels`` for no networks)."""
    epochs = f"{unit.epochs} epochs" if unit.epochs else "kernels"
    return f"{short_device(unit.device)}, {epochs}"


def unit_label(unit: Run) -> str:
    """``name (device, N epochs)``: a run, or pooled runs, as a column of the record."""
    return f"{unit.name} ({unit_scale(unit)})"


def run_links(unit: Run) -> str:
    """Links to the run entries of a unit: ``run [`a`](#run-a)`` or ``runs [`a`](#run-a) +
    [`b`](#run-b)``."""
    links = [f"[`{p}`](#run-{p.lower().replace('.', '')})" for p in unit.parts]
    return ("runs " if len(links) > 1 else "run ") + " + ".join(links)


def job_time_text(meta: dict[str, Any]) -> str:
    """Total and per-rule Snakemake job seconds of a run (summed over jobs)."""
    jobs = meta.get("job_seconds") or {}
    if not jobs:
        return "–"
    total = sum(v["seconds"] for v in jobs.values())
    parts = ", ".join(
        f"{rule} {duration(v['seconds'])} ({v['jobs']} jobs)" for rule, v in sorted(jobs.items())
    )
    return f"{duration(total)}: {parts}"


def _grid_text(values: list[float] | tuple[float, ...]) -> str:
    return "{" + ", ".join(f"{float(v):g}" for v in values) + "}"


def settings_rows(meta: dict[str, Any]) -> list[dict[str, str]]:
    """The run's settings beside the paper's (Section 5), one row per setting: ``setting``,
    ``paper``, ``this run``, ``same`` (yes/no/–) and ``source`` (tex line)."""
    cfg = meta["config"]
    rows: list[dict[str, str]] = []

    def add(what: str, paper: str, ours: str, same: bool | None, line: int | str) -> None:
        rows.append(
            {
                "setting": what,
                "paper": paper,
                "this run": ours,
                "same": {True: "yes", False: "**no**", None: "–"}[same],
                "source": f"tex line {line}" if isinstance(line, int) else line,
            }
        )

    points = meta.get("evaluated_points_per_model") or []
    for ds in cfg["datasets"]:
        pds = PAPER_DATASET.get(ds, ds)
        if (pds, "n_train") in SETTINGS:
            add(
                f"{ds}: dataset",
                f"full MNIST ({SETTINGS[(pds, 'n_train')].text})",
                ds,
                ds == pds,
                SETTINGS[(pds, "n_train")].line,
            )
        if (pds, "n_test") in SETTINGS:
            n = SETTINGS[(pds, "n_test")].values[0]
            add(
                f"{ds}: evaluated points per model",
                f"{n:g} (the test set)",
                ", ".join(map(str, points)) or "–",
                bool(points) and min(points) >= n,
                SETTINGS[(pds, "n_test")].line,
            )
    train, kernel = cfg["train"], cfg.get("kernel", {})
    grid = train.get("grid") or {}
    if grid:
        add(
            "epochs",
            f"not stated (the authors' code: {AUTHORS_EPOCHS})",
            str(train["epochs"]),
            train["epochs"] == AUTHORS_EPOCHS,
            "authors' code",
        )
        b, h = SETTINGS[("all", "batch_size")], SETTINGS[("all", "hidden")]
        add(
            "batch size",
            f"{b.values[0]:g}",
            str(train["batch_size"]),
            train["batch_size"] == b.values[0],
            b.line,
        )
        if cfg.get("model", {}).get("arch", "mlp") == "mlp":
            add(
                "hidden units",
                f"{h.values[0]:g}",
                str(cfg["model"]["hidden"]),
                cfg["model"]["hidden"] == h.values[0],
                h.line,
            )
        add(
            "settings",
            "plain, augment, adversarial",
            ", ".join(train["settings"]),
            set(train["settings"]) == {"plain", "augment", "adversarial"},
            SETTINGS[("all", "settings")].line,
        )
        decay = (
            f"×{train['lr_decay']:g} at {', '.join(f'{x:.0%}' for x in train['lr_decay_at'])}"
            " of the updates"
            if train.get("lr_decay_at")
            else "none"
        )
        add(
            "learning-rate decay",
            "not stated (the authors' code: "
            + ", ".join(
                f"×{AUTHORS_LR_DECAY[0] ** (i + 1):g} at {f:.0%}"
                for i, f in enumerate(AUTHORS_LR_DECAY[1])
            )
            + ")",
            decay,
            None,
            "authors' code",
        )
        for ds in cfg["datasets"]:
            pds = PAPER_DATASET.get(ds, ds)
            if (pds, "lr") not in SETTINGS:
                continue
            lrs = sorted({float(x) for g in grid.values() for x in g["lr"]})
            s = SETTINGS[(pds, "lr")]
            add(
                f"{ds}: learning rates",
                _grid_text(s.values),
                _grid_text(lrs),
                set(lrs) == set(s.values),
                s.line,
            )
            for reg in ["weight_decay", "cross_lipschitz", "dropout"]:
                if (pds, reg) not in SETTINGS:
                    continue
                s = SETTINGS[(pds, reg)]
                ours = grid.get(reg, {}).get("keep_hidden" if reg == "dropout" else "lambda")
                add(
                    f"{ds}: {s.what}",
                    _grid_text(s.values),
                    _grid_text(ours) if ours else "not trained",
                    bool(ours) and {float(x) for x in ours} == set(s.values),
                    s.line,
                )
    kgrid = kernel.get("grid") or {}
    if kgrid:
        n = kernel.get("n_centers", 0)
        add(
            "kernel: expansion points",
            "all 60000 training points",
            "all" if n == 0 else str(n),
            n == 0,
            SETTINGS[("mnist", "n_train")].line,
        )
        s = SETTINGS[("mnist", "kernel_a")]
        a = sorted({float(x) for g in kgrid.values() for x in g["a"]})
        add(
            "kernel: a (γ = a/ρ²)",
            _grid_text(s.values),
            _grid_text(a),
            set(a) == set(s.values),
            s.line,
        )
        for reg in ["kernel_logreg", "kernel_cl"]:
            s = SETTINGS[("mnist", reg)]
            ours = [x for x in kgrid.get(reg, {}).get("lambda", []) if x > 0]
            add(
                f"kernel: {s.what}",
                _grid_text(s.values),
                _grid_text(ours) if ours else "–",
                bool(ours) and set(map(float, ours)) == set(s.values),
                s.line,
            )
    models = cfg["certify"].get("models", "all")
    add(
        "models certified",
        "networks: every model; kernels: the best per method",
        models,
        None,
        SETTINGS[("all", "kernel_certified")].line,
    )
    return rows


def _runs_section(runs: list[Run], units: list[Run]) -> list[str]:
    out = ["## Runs", ""]
    if not runs:
        return [
            *out,
            "No run is committed under `docs/reproduction/`: every claim below is "
            "*not run at this scale*.",
            "",
        ]
    unit_of = {p: u for u in units for p in u.parts}
    rows = []
    for run in runs:
        m, cfg = run.meta, run.meta["config"]
        families = sorted(set(run.summary["family"]))
        rows.append(
            {
                "run": run.name,
                "device": run.device,
                "datasets": ", ".join(m["datasets"]),
                "models": ", ".join(families),
                "settings": ", ".join(cfg["train"]["settings"])
                if cfg["train"].get("grid")
                else "plain",
                "trained / evaluated": f"{m['models_trained']} / {m['models_evaluated']}",
                "points per model": ", ".join(map(str, m["evaluated_points_per_model"])),
                "epochs": str(m["epochs"]) if cfg["train"].get("grid") else "–",
                "job time": duration(
                    sum(v["seconds"] for v in (m.get("job_seconds") or {}).values())
                ),
                "commit": ((m.get("git") or {}).get("commit") or "–")[:10],
                "evaluated as": unit_of[run.name].name,
            }
        )
    out += [
        "Device: what trained, certified and attacked the models (from their `metrics.json` "
        "where the run recorded it, else the machine). Runs exported with the same pool "
        "label ran the same settings and code on the same machine, for other models; the "
        "claims evaluate them as one (`evaluated as`).",
        "",
        table(pd.DataFrame(rows)),
        "",
    ]
    for run in runs:
        m = run.meta
        git = m.get("git") or {}
        unit = unit_of[run.name]
        out += [
            f"### Run `{run.name}`",
            "",
            f"- device: {run.device}",
            f"- command: `{m['command']}`",
            f"- machine: {machine_text(m.get('machine'))}",
            f"- job time (Snakemake benchmarks, summed over jobs): {job_time_text(m)}",
            f"- elapsed: {duration(m.get('wall_time_s'))}",
            f"- results written {m.get('results_written', '–')}, exported "
            f"{m.get('exported', '–')}"
            + (f" from `{m['exported_from']}`" if m.get("exported_from") else "")
            + f", commit `{git.get('commit') or '–'}`"
            f"{' (with uncommitted changes)' if git.get('dirty') else ''}",
            f"- files: `docs/reproduction/{run.name}/` ({_count(len(m.get('files', [])), 'file')} "
            f"and `{RUN_FILE}`)",
        ]
        if len(unit.parts) > 1:
            out.append(f"- evaluated with the runs of pool `{m['pool']}` as `{unit.name}`")
        out.append("")
        for cf in m.get("config_files", []):
            out += [
                f"<details><summary>config file <code>{cf['path']}</code></summary>",
                "",
                "```yaml",
                cf["content"].rstrip("\n"),
                "```",
                "",
                "</details>",
                "",
            ]
    return out


def _quote(key: str) -> list[str]:
    c = CLAIMS[key]
    out = [f"> {c.quote}", ">", f"> — {TEX_NAME}, line {c.line}"]
    for quote, line in c.more:
        out += ["", f"> {quote}", ">", f"> — {TEX_NAME}, line {line}"]
    return [*out, ""]


def _verdict_lines(v: Verdict, unit: Run) -> list[str]:
    out = [f"**{v.status}**: {run_links(unit)} ({unit_scale(unit)}), {v.scope}", ""]
    out += [f"- {p.line()}" for p in v.parts] + [""]
    if v.details is not None and len(v.details):
        out += [table(v.details), ""]
    return out


def _claims_section(verdicts: dict[str, list[Verdict]], units: list[Run]) -> list[str]:
    by_name = {u.name: u for u in units}
    out = [
        "## Claims of Section 5",
        "",
        "Each claim: the paper's sentence, where the paper shows it, our criterion, and the "
        "verdict of every run (or pool of runs) with data for it, with the numbers behind it; "
        "the runs without data are listed once.",
        "",
    ]
    for i, (key, claim) in enumerate(CRITERIA.items(), start=1):
        out += [f"### {i}. {CLAIMS[key].title}", "", *_quote(key)]
        if CLAIMS[key].evidence:
            out += [f"**In the paper.** {CLAIMS[key].evidence}.", ""]
        out += [f"**Criterion.** {claim.sentence}", ""]
        vs = verdicts[key]
        for v in vs:
            if v.status != NOT_RUN:
                out += _verdict_lines(v, by_name[v.run])
        idle = [v for v in vs if v.status == NOT_RUN]
        if idle:
            out += [
                f"**{NOT_RUN}**: "
                + "; ".join(f"{run_links(by_name[v.run])} ({v.numbers()})" for v in idle)
                + ".",
                "",
            ]
        if not vs:
            out += [f"**{NOT_RUN}**: no run is committed.", ""]
    return out


def _combined(vs: list[Verdict]) -> tuple[str, int, int]:
    """One verdict for a claim's verdicts on one unit (several datasets or settings):
    not reproduced if any is, else reproduced if any is; with the parts that hold and the
    parts checked."""
    statuses = {v.status for v in vs}
    status = (
        NOT_REPRODUCED
        if NOT_REPRODUCED in statuses
        else REPRODUCED
        if REPRODUCED in statuses
        else NOT_RUN
    )
    checked = [p.ok for v in vs for p in v.parts if p.ok is not None]
    return status, sum(checked), len(checked)


def headline(vs: list[Verdict], units: list[Run]) -> Verdict | None:
    """The verdict of a claim from the unit with data for it that trained longest (then
    evaluated the most models; kernel-only units count as 0 epochs)."""
    rank = {u.name: (u.epochs or 0, len(u.evaluated()), -i) for i, u in enumerate(units)}
    with_data = [v for v in vs if v.status != NOT_RUN]
    if not with_data:
        return None
    return max(with_data, key=lambda v: (rank[v.run], v.status == NOT_REPRODUCED))


def _glance_section(verdicts: dict[str, list[Verdict]], units: list[Run]) -> list[str]:
    """The verdict of every claim on every unit (a matrix), then each claim's verdict at
    the largest scale with its numbers beside the paper's."""
    rows = []
    for key in CRITERIA:
        row = {"claim": CLAIMS[key].title}
        for u in units:
            status, ok, n = _combined([v for v in verdicts[key] if v.run == u.name])
            row[unit_label(u)] = f"**{status}**" + (f" ({ok}/{n})" if n else "")
        rows.append(row)
    if not units:
        rows = [{"claim": CLAIMS[k].title, "verdict": f"**{NOT_RUN}**"} for k in CRITERIA]
    out = [
        "## Verdicts at a glance",
        "",
        "Per claim and run (pooled runs as one; device and epochs in the header): the "
        "verdict, and how many of its checks hold.",
        "",
        table(pd.DataFrame(rows)),
        "",
        "### Each claim at the largest scale we ran",
        "",
        "The verdict from the run with the most epochs that has data for the claim; our "
        "numbers first, the paper's after `paper` where the paper prints them.",
        "",
    ]
    by_name = {u.name: u for u in units}
    for key in CRITERIA:
        c = CLAIMS[key]
        v = headline(verdicts[key], units)
        if v is None:
            out.append(
                f"- **{c.title}**: **{NOT_RUN}** (no committed run has the data; "
                f"paper: {c.evidence})."
            )
            continue
        out.append(
            f"- **{c.title}**: **{v.status}** at {unit_label(by_name[v.run])}, {v.scope}: "
            f"{v.numbers()}. Paper: {c.evidence}."
        )
    return [*out, ""]


def _ratio_text(ratio: float, paper_ds: str | None, method: str, setting: str) -> str:
    """A Table 1 ratio with the paper's beside it where Table 1 has it (plain only)."""
    paper = TABLE1.get((paper_ds, method)) if setting == "plain" else None
    return num(ratio, 2) + (f" (paper {paper.text})" if paper else "")


def network_rows(unit: Run, ds: str, setting: str) -> pd.DataFrame:
    """Every evaluated network of ``unit`` on ``ds`` in ``setting``, by regularizer then
    model id: the columns of the record's per-run network tables."""
    s = unit.evaluated()
    s = s[(s["dataset"] == ds) & (s["family"] == "mlp") & (s["setting"] == setting)]
    order = {m: i for i, m in enumerate(NET_ORDER)}
    s = s.assign(_o=s["method"].map(order)).sort_values(["_o", "model_id"])
    nan = pd.Series(float("nan"), index=s.index)
    refined = s.get("mean_upper_bound_l2_refined", nan)
    shares = [s.get(f"share_best_l2_{m}", nan) for m in L2_UPPER_METHODS]
    all_points = s["mean_guarantee_local"] * s["n_correct"] / s["n_eval"]
    return pd.DataFrame(
        {
            "model": s["model_id"],
            "method": s["method"].map(LABEL),
            "test error": s["test_error"].map(pct),
            "mean L2 guarantee": s["mean_guarantee_local"].map(num),
            "all points, errors 0": all_points.map(num),
            "mean global guarantee": s["mean_guarantee_global"].map(num),
            "Table 1 ratio": [
                _ratio_text(r, PAPER_DATASET.get(ds), m, setting)
                for r, m in zip(s["mean_ratio_global_local"], s["method"], strict=True)
            ],
            "upper bound, paper's procedure": s["mean_upper_bound"].map(num),
            "upper bound, refined": refined.map(num),
            "refinement": [
                "–" if pd.isna(a) or pd.isna(b) or not b else f"{100 * (a / b - 1):+.0f}%"
                for a, b in zip(refined, s["mean_upper_bound"], strict=True)
            ],
            "upper bound, minimal-norm attack": s.get("mean_upper_bound_l2_min_norm", nan).map(num),
            "best upper bound": s.get("mean_upper_bound_l2_best", nan).map(num),
            "best by paper / refined / min-norm": [
                "–" if any(pd.isna(v) for v in row) else " / ".join(f"{100 * v:.0f}%" for v in row)
                for row in zip(*shares, strict=True)
            ],
            "correct points": s["n_correct"].astype(int).map(str),
        }
    )


def _networks_section(units: list[Run]) -> list[str]:
    out = [
        "## Our networks, every evaluated model",
        "",
        "Each run's evaluated one-hidden-layer networks, straight from its `summary.csv`: "
        "means over the correctly classified evaluated points, and the mean L2 guarantee "
        "over all evaluated points with 0 for the misclassified ones (`all points, errors "
        "0`: the other way the paper's figure may average). The upper bound by the "
        "paper's procedure (Section 4: linearize at the point, then search the decision "
        "boundary) and refined (re-linearized at the sample, `attack.refine_steps` times; "
        "never larger); `refinement` is the change from the one to the other. The "
        "minimal-norm attack (FMN walks from the refined sample with targets and restarts, "
        "docs/bounds.md) and the mean of the smallest verified bound per point, the true "
        "minimal perturbation lying between the guarantee and it; `best by` says how often "
        "each method gave that smallest bound. Runs made before the minimal-norm attack "
        "existed show `–` there. Table 1's ratio is the mean of α_global/α_local, with the "
        "paper's for the regularizer.",
        "",
    ]
    found = False
    for u in units:
        s = u.evaluated()
        for ds in u.datasets("mlp"):
            for setting in sorted(set(s[(s["dataset"] == ds) & (s["family"] == "mlp")]["setting"])):
                found = True
                out += [
                    f"### `{u.name}`: {ds}, {setting}",
                    "",
                    f"{run_links(u)}; {unit_scale(u)}.",
                    "",
                    table(network_rows(u, ds, setting)),
                    "",
                ]
    if not found:
        out += [f"**{NOT_RUN}**: no committed run evaluated a network.", ""]
    return out


def _trend_section(units: list[Run]) -> list[str]:
    """The best network per regularizer of every run of a paper dataset (plain), by epochs,
    and per regularizer how its Table 1 ratio and guarantee move."""
    out = [
        "## With more epochs",
        "",
        "The paper does not state its epochs (the authors' code trains 200). The best network "
        "per regularizer (lowest test error) of each run in the plain setting, by epochs; "
        "the runs differ in more than epochs (learning rates, grids, device), see `lr` and "
        "the runs' settings.",
        "",
    ]
    found = False
    for paper_ds in ["mnist", "cifar10", "gtsrb"]:
        cols = []
        for u in sorted(units, key=lambda u: (u.epochs or 0, u.name)):
            for ds in u.datasets("mlp"):
                if PAPER_DATASET.get(ds) == paper_ds and len(u.best(ds, "mlp")):
                    cols.append((u, ds, u.best(ds, "mlp")))
        if len(cols) < 2:
            continue
        found = True
        rows = []
        for u, _ds, best in cols:
            for m in [m for m in NET_ORDER if m in best.index]:
                r = best.loc[m]
                rows.append(
                    {
                        "run": u.name,
                        "device": short_device(u.device),
                        "epochs": str(u.epochs),
                        "method": LABEL[m],
                        "model": r["model_id"],
                        "lr": f"{r['lr']:g}",
                        "test error": pct(r["test_error"]),
                        "mean guarantee": num(r["mean_guarantee_local"]),
                        "Table 1 ratio": _ratio_text(
                            r["mean_ratio_global_local"], paper_ds, m, "plain"
                        ),
                        "upper bound": num(r["mean_upper_bound"]),
                        "refined": num(r.get("mean_upper_bound_l2_refined", float("nan"))),
                    }
                )
        out += [f"### {paper_ds}, plain", "", table(pd.DataFrame(rows)), ""]
        for m in NET_ORDER:
            seq = [(u, best.loc[m]) for u, _, best in cols if m in best.index]
            if len(seq) < 2:
                continue

            def walk(col: str, digits: int, seq: list = seq) -> str:
                return " → ".join(f"{num(r[col], digits)} ({u.epochs} ep.)" for u, r in seq)

            paper = TABLE1.get((paper_ds, m))
            out.append(
                f"- {LABEL[m]}: Table 1 ratio {walk('mean_ratio_global_local', 2)}"
                + (f", paper {paper.text}" if paper else "")
                + f"; mean guarantee {walk('mean_guarantee_local', 3)}; upper bound "
                f"{walk('mean_upper_bound', 3)}"
            )
        out.append("")
    if not found:
        out += ["No dataset has networks from two committed runs.", ""]
    return out


def _missing_section(m: Measured | None, ests: list[Estimate | str]) -> list[str]:
    out = [
        "## Runs not yet made",
        "",
        "What the record lacks, the command that would make it, and its GPU time estimated "
        "from the job seconds of the committed GPU runs (`estimates.py`: each network "
        "trains, is certified and is attacked in jobs of its own, as in the measured runs).",
        "",
    ]
    if m is None:
        return [*out, "No committed GPU run measured the jobs: no estimate.", ""]
    rates = ", ".join(
        f"{LABEL[r]} {1000 * m.step_s[r]:.2f} ms ({m.step_jobs[r]} job"
        f"{'s' if m.step_jobs[r] > 1 else ''})"
        for r in NET_ORDER
        if r in m.step_s
    )
    out += [
        f"Measured on {m.device} by runs {', '.join(f'`{r}`' for r in m.runs)} "
        f"({m.epochs} epochs, {m.gpu_jobs} jobs sharing the GPU at most): seconds per SGD "
        f"step of a training job (its seconds over epochs × steps per epoch, start-up "
        f"included) {rates}; per evaluated point {1000 * m.certify_s:.2f} ms to certify and "
        f"{1000 * m.attack_s:.2f} ms to attack ({m.eval_jobs} jobs each). An estimate is "
        f"the sum over the config's networks (job time), divided by the jobs sharing the "
        f"GPU. Only plain-setting steps on MNIST were measured: the augment and adversarial "
        f"settings do more per step (rotations and crops; an L∞ attack on half of each "
        f"batch), so their figures are lower bounds, and other datasets assume MNIST's "
        f"step time. Kernel models and ResNets were not measured by a committed run. "
        f"CIFAR-10 and GTSRB download from their official URLs unless a mirror is given "
        f"(`data.mirrors`).",
        "",
        "Training many networks in one job (grid-batched, being built separately) is not "
        "measured on a GPU: these are the times of today's per-model jobs.",
        "",
    ]
    for e in ests:
        if isinstance(e, str):
            out += [f"- {e}", ""]
            continue
        t = e.target
        out += [
            f"### `{t.key}`: {t.what}",
            "",
            f"Adds: {t.adds}. Models: {e.trained} trained, {e.evaluated} certified and "
            f"attacked. Estimated time on one GPU: **{e.summary}**.",
            "",
            "```sh",
            e.command,
            "```",
            "",
            *[f"- {line}" for line in e.lines],
            *[f"- {line}; no estimate" for line in e.unmeasured],
            "",
        ]
    return out


def _table1_section(units: list[Run]) -> list[str]:
    """The paper's Table 1 in full (both datasets), whether or not a run has the data, with
    the ratio of our best model per regularizer (plain) of every run beside it."""
    claim = list(CRITERIA).index("table1") + 1
    rows = []
    for (ds, reg), number in TABLE1.items():
        row = {
            "dataset": number.row,
            "regularizer": number.column,
            "paper": number.text,
            "source": f"tex line {number.line}",
        }
        for u in units:
            ours = [
                u.best(d, "mlp").loc[reg, "mean_ratio_global_local"]
                for d in u.datasets("mlp")
                if PAPER_DATASET.get(d) == ds and reg in u.best(d, "mlp").index
            ]
            if u.datasets("mlp"):
                row[unit_label(u)] = ", ".join(num(x, 2) for x in ours) or NOT_RUN
        rows.append(row)
    return [
        "## Table 1 of the paper",
        "",
        "The paper's Table 1 in full: the mean ratio α_global/α_local per dataset and "
        "regularizer, beside the ratio of our best model per regularizer (plain) in every "
        f"run with networks; the verdicts are under claim {claim}.",
        "",
        table(pd.DataFrame(rows)),
        "",
    ]


def _kernel_section(runs: list[Run]) -> list[str]:
    out = [
        "## The kernel table",
        "",
        f"The paper's kernel table ({TEX_NAME}, lines 619–622) and an older version with an "
        f"L∞ column that the source keeps commented out (lines 606–609, not in the published "
        f"paper), beside the best kernel model per method of each run (lowest test error). "
        f'The paper\'s "K-SVM" row is the standard RKHS-norm regularization, our '
        f'Kernel-LogReg with λ > 0; "No Reg." is λ = 0.',
        "",
    ]
    paper_rows = []
    for m in KERNEL_ORDER:
        paper_rows.append(
            {
                "method": LABEL[m],
                "test error": KERNEL[(m, "test_error")].text.replace("\\%", "%"),
                "avg. L2 adv. samples": KERNEL[(m, "mean_upper_bound")].text,
                "avg. L2 rob. guar.": KERNEL[(m, "mean_guarantee_local")].text,
                "older: avg. L2 adv. samples": KERNEL_COMMENTED_OUT[(m, "mean_upper_bound")].text,
                "older: avg. L∞ adv. samples": KERNEL_COMMENTED_OUT[
                    (m, "mean_upper_bound_linf")
                ].text,
            }
        )
    out += ["Paper:", "", table(pd.DataFrame(paper_rows)), ""]
    any_kernel = False
    for run in runs:
        for ds in run.datasets("kernel"):
            any_kernel = True
            best = run.best(ds, "kernel")
            rows = []
            for m in KERNEL_ORDER:
                if m not in best.index:
                    continue
                r = best.loc[m]
                linf = r["mean_upper_bound_linf"] if "mean_upper_bound_linf" in r else float("nan")
                rows.append(
                    {
                        "method": LABEL[m],
                        "model": r["model_id"],
                        "test error": f"{pct(r['test_error'])} "
                        f"(paper {KERNEL[(m, 'test_error')].text.replace(chr(92) + '%', '%')})",
                        "avg. L2 adv. samples": f"{num(r['mean_upper_bound'])} "
                        f"(paper {KERNEL[(m, 'mean_upper_bound')].text})",
                        "avg. L2 rob. guar.": f"{num(r['mean_guarantee_local'])} "
                        f"(paper {KERNEL[(m, 'mean_guarantee_local')].text})",
                        "avg. L∞ adv. samples": f"{num(linf)} (older table "
                        f"{KERNEL_COMMENTED_OUT[(m, 'mean_upper_bound_linf')].text})",
                        "correct points": str(int(r["n_correct"])),
                    }
                )
            out += [f"Run `{run.name}`, {ds}:", "", table(pd.DataFrame(rows)), ""]
    if not any_kernel:
        out += [f"Ours: **{NOT_RUN}** (no committed run has kernel models).", ""]
    return out


def _figures_section(runs: list[Run], ests: list[Estimate | str]) -> list[str]:
    out = [
        "## Figures",
        "",
        "The paper's figures beside ours. The paper's source has no numbers for them (its "
        "images are not in the LaTeX); compare the shapes, and the claims above for the "
        "numbers.",
        "",
    ]
    bare = [r.name for r in runs if not any(f.startswith("figures/") for f in r.meta["files"])]
    if bare:
        out += [
            "Runs without figures (only their tables were kept; their numbers are in the "
            "tables above): " + ", ".join(f"`{r}`" for r in bare) + ".",
            "",
        ]
    for label, (what, patterns) in FIGURES.items():
        out += [f"### Figure `{label}`: {what}", ""]
        found = False
        for run in runs:
            for pattern in patterns:
                path = run.folder / "figures" / pattern
                if path.is_file():
                    found = True
                    rel = f"{RUNS_DIR}/{run.name}/figures/{pattern}"
                    cfg = run.meta["config"]
                    settings = (
                        ", ".join(cfg["train"]["settings"]) if cfg["train"].get("grid") else "–"
                    )
                    out += [
                        f"Run `{run.name}` ({short_device(run.device)}, "
                        f"{run.epochs or 'no'} epochs, settings {settings}): `{pattern}`",
                        "",
                        f"![{run.name}: {pattern}]({rel})",
                        "",
                    ]
        if not found:
            out += [f"**{NOT_RUN}**: no committed run has this figure.", ""]
        makers = [e for e in ests if not isinstance(e, str) and label in e.target.figures]
        if makers:
            out += [
                "Not yet made at the paper's scale; would come from "
                + "; ".join(
                    f"`{e.target.key}` ("
                    + ("no estimate" if e.gpu_s is None else e.summary + " on one GPU")
                    + ")"
                    for e in makers
                )
                + ", see *Runs not yet made*.",
                "",
            ]
    return out


def _differ_section(verdicts: dict[str, list[Verdict]], runs: list[Run]) -> list[str]:
    out = [
        "## Where we differ from the paper and why",
        "",
        "Generated from the verdicts above and from each run's settings; the numbers are "
        "the measured gaps.",
        "",
        "### Measured gaps",
        "",
    ]
    gaps = [(key, v) for key, vs in verdicts.items() for v in vs if v.status == NOT_REPRODUCED]
    if gaps:
        out += [
            f"- **{CLAIMS[key].title}** (run `{v.run}`, {v.scope}): {v.gap()}" for key, v in gaps
        ]
    else:
        out += ["- No claim that a run covers is contradicted by it."]
    out += ["", "### Not run at this scale", ""]
    missing = [
        CLAIMS[key].title for key, vs in verdicts.items() if all(v.status == NOT_RUN for v in vs)
    ]
    out += [f"- {t}" for t in missing] or ["- Every claim has data in at least one run."]
    out += [
        "",
        "The runs that would cover them, with commands and GPU time: *Runs not yet made*.",
        "",
    ]
    for run in runs:
        rows = settings_rows(run.meta)
        differs = [r for r in rows if r["same"] == "**no**"]
        out += [f"### Settings of run `{run.name}` compared with the paper's", ""]
        out += [_settings_paragraph(run), ""]
        if differs:
            out += [
                "Settings that differ from the paper's, candidates for the gaps above: "
                + "; ".join(f"{r['setting']} {r['this run']} (paper {r['paper']})" for r in differs)
                + ".",
                "",
            ]
        out += [table(pd.DataFrame(rows)), ""]
        notes = run.folder / NOTES_FILE
        if notes.is_file():
            out += [
                f"Notes written with run `{run.name}` (`{NOTES_FILE}`, not generated):",
                "",
                notes.read_text().rstrip("\n"),
                "",
            ]
    return out


def _studies_section(docs: Path) -> list[str]:
    """Every study under ``docs/reproduction/studies/`` (:mod:`.studies`): its hand-written
    notes, then the tables generated from each of its results."""
    studies = load_studies(docs / RUNS_DIR)
    if not studies:
        return []
    out = [
        "## Studies",
        "",
        f"Experiments made to explain a gap, each in `{RUNS_DIR}/{STUDIES_DIR}/<name>/`: the "
        "notes are written by hand, every table is generated from the results (JSON) that "
        "the study's script wrote.",
        "",
    ]
    for study in studies:
        out += [f"### {study.title}", ""]
        if study.notes:
            out += [
                f"Notes of study `{study.name}` (`{STUDIES_DIR}/{study.name}/notes.md`, not "
                "generated):",
                "",
                study.notes,
                "",
            ]
        for file, entry in study.results.items():
            out += [f"#### Result `{file}`", "", provenance(entry) + ".", ""]
            for caption, frame in guarantee_gap_tables(entry["result"]):
                out += [f"{caption}:", "", table(frame), ""]
    return out


def _settings_paragraph(run: Run) -> str:
    m, cfg = run.meta, run.meta["config"]
    train, cert, att = cfg["train"], cfg["certify"], cfg["attack"]
    parts = [f"Run `{run.name}` used {', '.join(m['datasets'])}"]
    if train.get("grid"):
        regs = ", ".join(
            f"{LABEL.get(r, r)} {_grid_text(g.get('lambda', g.get('keep_hidden', [])))}"
            f" at lr {_grid_text(g['lr'])}"
            for r, g in train["grid"].items()
        )
        parts.append(
            f"networks ({cfg['model'].get('arch', 'mlp')}, {cfg['model'].get('hidden')} "
            f"hidden units, bias {cfg['model'].get('bias')}, init "
            f"{cfg['model'].get('init')}) trained {train['epochs']} epochs with batch "
            f"size {train['batch_size']}, learning rate ×{train['lr_decay']:g} at "
            f"{', '.join(f'{x:.0%}' for x in train['lr_decay_at'])} of the updates, in "
            f"the settings {', '.join(train['settings'])}, grids: {regs}"
        )
    kernel = cfg.get("kernel", {})
    if kernel.get("grid"):
        n = kernel.get("n_centers", 0)
        parts.append(
            f"kernel models with {'all training points' if n == 0 else n} as expansion "
            f"points, {kernel.get('max_iter')} L-BFGS iterations"
        )
    parts.append(
        f"certified {cert.get('models', 'all')} models on "
        f"{', '.join(map(str, m['evaluated_points_per_model'])) or 'no'} points each "
        f"(certify.n_points {cert['n_points']}, attack.n_points {att['n_points']})"
    )
    parts.append(f"on {machine_text(m.get('machine'))}; job time {job_time_text(m)}")
    return "; ".join(parts) + "."


def render(docs: Path | str = "docs", root: Path | str | None = None) -> str:
    """The record's Markdown for the runs committed under ``<docs>/reproduction/``; the
    configs of the runs not yet made are read under ``root`` (default: the folder holding
    ``docs``)."""
    docs = Path(docs)
    root = docs.resolve().parent if root is None else Path(root)
    runs = load_runs(docs)
    units = pool_runs(runs)
    verdicts = evaluate(units)
    measured, ests = estimates(runs, root)
    head = [
        "# Reproduction record",
        "",
        "<!-- Generated by `make record` (python -m crosslip.reproduction render) from "
        "docs/reproduction/*/. Do not edit: export a run or change src/crosslip/reproduction/. -->",
        "",
        "The numbers of Hein & Andriushchenko, *Formal Guarantees on the Robustness of a "
        "Classifier against Adversarial Manipulation* (NIPS 2017), Section 5, beside ours. "
        "Generated by `make record` from the runs committed under `docs/reproduction/`, each "
        "exported from a finished workflow run by `python -m crosslip.reproduction export` "
        "(docs/reproduction-record.md), on a CPU or a GPU as each run's device says. Every "
        f"paper number is quoted from the LaTeX source `{TEX_NAME}` with its line, and "
        "`tests/test_reproduction.py` checks each against the source and that this file is "
        "what the committed runs render to.",
        "",
        "Verdicts: **reproduced** (the stated criterion holds), **not reproduced** (it fails; "
        "the numbers say by how much), **not run at this scale** (no committed run has the "
        "data). Means are over the correctly classified evaluated points of the best model "
        "per method (lowest test error).",
        "",
    ]
    lines = [
        *head,
        *_glance_section(verdicts, units),
        *_runs_section(runs, units),
        *_networks_section(units),
        *_trend_section(units),
        *_claims_section(verdicts, units),
        *_table1_section(units),
        *_kernel_section(units),
        *_figures_section(runs, ests),
        *_missing_section(measured, ests),
        *_differ_section(verdicts, runs),
        *_studies_section(docs),
    ]
    return "\n".join(lines).rstrip("\n") + "\n"


def write_record(docs: Path | str = "docs", root: Path | str | None = None) -> Path:
    """Render the record into ``<docs>/reproduction.md``; return its path."""
    path = Path(docs) / RECORD_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(docs, root))
    return path
