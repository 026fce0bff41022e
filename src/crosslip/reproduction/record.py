"""Render ``docs/reproduction.md`` from the committed run folders ``docs/reproduction/*/``.

The record puts the paper's numbers (:mod:`crosslip.reproduction.paper`) beside ours for
every table, figure and claim of Section 5, with a verdict per claim
(:mod:`crosslip.reproduction.claims`), the settings, scale and command of each run, and a
section "Where we differ from the paper and why" built from the measured gaps and from the
runs' settings compared with the paper's. Every table is generated (``DataFrame.to_markdown``);
the output depends on the run folders only, so rendering twice gives the same bytes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from .claims import (
    CRITERIA,
    KERNEL_ORDER,
    LABEL,
    NOT_REPRODUCED,
    NOT_RUN,
    Run,
    Verdict,
    evaluate,
    num,
    pct,
)
from .export import RUN_FILE
from .paper import (
    AUTHORS_EPOCHS,
    CLAIMS,
    FIGURES,
    KERNEL,
    KERNEL_COMMENTED_OUT,
    PAPER_DATASET,
    SETTINGS,
    TABLE1,
    TEX_NAME,
)

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


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


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
    return text + (f", GPU {machine['gpu']}" if machine.get("gpu") else ", no GPU")


def job_time_text(meta: dict[str, Any]) -> str:
    """Total and per-rule Snakemake job seconds of a run (summed over jobs)."""
    jobs = meta.get("job_seconds") or {}
    if not jobs:
        return "–"
    total = sum(v["seconds"] for v in jobs.values())
    parts = ", ".join(
        f"{rule} {_duration(v['seconds'])} ({v['jobs']} jobs)" for rule, v in sorted(jobs.items())
    )
    return f"{_duration(total)}: {parts}"


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
            "not stated (the authors' code: ×0.1 at 72%, ×0.01 at 88%)",
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


def _runs_section(runs: list[Run]) -> list[str]:
    out = ["## Runs", ""]
    if not runs:
        return [
            *out,
            "No run is committed under `docs/reproduction/`: every claim below is "
            "*not run at this scale*.",
            "",
        ]
    rows = []
    for run in runs:
        m, cfg = run.meta, run.meta["config"]
        families = sorted(set(run.summary["family"]))
        rows.append(
            {
                "run": run.name,
                "datasets": ", ".join(m["datasets"]),
                "models": ", ".join(families),
                "settings": ", ".join(cfg["train"]["settings"])
                if cfg["train"].get("grid")
                else "plain",
                "trained / evaluated": f"{m['models_trained']} / {m['models_evaluated']}",
                "points per model": ", ".join(map(str, m["evaluated_points_per_model"])),
                "epochs": str(m["epochs"]) if cfg["train"].get("grid") else "–",
                "job time": _duration(
                    sum(v["seconds"] for v in (m.get("job_seconds") or {}).values())
                ),
                "commit": (m.get("git") or {}).get("commit", "–") or "–",
            }
        )
        rows[-1]["commit"] = rows[-1]["commit"][:10]
    out += [table(pd.DataFrame(rows)), ""]
    for run in runs:
        m = run.meta
        git = m.get("git") or {}
        out += [
            f"### Run `{run.name}`",
            "",
            f"- command: `{m['command']}`",
            f"- machine: {machine_text(m.get('machine'))}",
            f"- job time (Snakemake benchmarks, summed over jobs): {job_time_text(m)}",
            f"- elapsed: {_duration(m.get('wall_time_s'))}",
            f"- results written {m.get('results_written', '–')}, exported "
            f"{m.get('exported', '–')}, commit `{git.get('commit') or '–'}`"
            f"{' (with uncommitted changes)' if git.get('dirty') else ''}",
            f"- files: `docs/reproduction/{run.name}/` ({len(m.get('files', []))} files and "
            f"`{RUN_FILE}`)",
            "",
        ]
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


def _verdict_lines(v: Verdict) -> list[str]:
    link = f"run [`{v.run}`](#run-{v.run.lower().replace('.', '')})"
    if v.status == NOT_RUN:
        why = v.missing or "no data for this claim in the run"
        out = [f"**{v.status}**: {link}{'' if v.scope == '–' else ', ' + v.scope} ({why}).", ""]
    else:
        out = [f"**{v.status}**: {link}, {v.scope}", ""]
        out += [f"- {p.line()}" for p in v.parts] + [""]
    if v.details is not None and len(v.details):
        out += [table(v.details), ""]
    return out


def _claims_section(verdicts: dict[str, list[Verdict]]) -> list[str]:
    out = ["## Claims of Section 5", ""]
    for i, (key, (criterion, _)) in enumerate(CRITERIA.items(), start=1):
        out += [
            f"### {i}. {CLAIMS[key].title}",
            "",
            *_quote(key),
            f"**Criterion.** {criterion}",
            "",
        ]
        vs = verdicts[key]
        if not vs:
            out += [f"**{NOT_RUN}**: no run is committed.", ""]
        for v in vs:
            out += _verdict_lines(v)
    return out


def _table1_section(runs: list[Run]) -> list[str]:
    """The paper's Table 1 in full (both datasets), whether or not a run has the data; our
    ratios per dataset are under claim 3."""
    rows = []
    for (ds, _reg), number in TABLE1.items():
        ran = any(ds in run.datasets("mlp") for run in runs)
        rows.append(
            {
                "dataset": number.row,
                "regularizer": number.column,
                "paper": number.text,
                "ours": "claim 3" if ran else NOT_RUN,
                "source": f"tex line {number.line}",
            }
        )
    return [
        "## Table 1 of the paper",
        "",
        "The paper's Table 1 in full: the mean ratio α_global/α_local per dataset and "
        "regularizer. Our ratios for the datasets a run has are under claim 3.",
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


def _figures_section(runs: list[Run]) -> list[str]:
    out = [
        "## Figures",
        "",
        "The paper's figures beside ours. The paper's source has no numbers for them (its "
        "images are not in the LaTeX); compare the shapes, and the claims above for the "
        "numbers.",
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
                    out += [
                        f"Run `{run.name}`: `{pattern}`",
                        "",
                        f"![{run.name}: {pattern}]({rel})",
                        "",
                    ]
        if not found:
            out += [f"**{NOT_RUN}**: no committed run has this figure.", ""]
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
    out += [""]
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


def render(docs: Path | str = "docs") -> str:
    """The record's Markdown for the runs committed under ``<docs>/reproduction/``."""
    runs = load_runs(Path(docs))
    verdicts = evaluate(runs)
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
        "(docs/reproduction-record.md). Every paper number is quoted from the LaTeX source "
        f"`{TEX_NAME}` with its line, and `tests/test_reproduction.py` checks each against "
        "the source and that this file is what the committed runs render to.",
        "",
        "Verdicts: **reproduced** (the stated criterion holds), **not reproduced** (it fails; "
        "the numbers say by how much), **not run at this scale** (no committed run has the "
        "data). Means are over the correctly classified evaluated points of the best model "
        "per method (lowest test error).",
        "",
        "## Verdicts at a glance",
        "",
    ]
    glance = [
        {"claim": CLAIMS[key].title, "run": v.run, "data": v.scope, "verdict": f"**{v.status}**"}
        for key, vs in verdicts.items()
        for v in vs
    ]
    if not glance:
        glance = [
            {"claim": CLAIMS[key].title, "run": "–", "data": "–", "verdict": f"**{NOT_RUN}**"}
            for key in CRITERIA
        ]
    lines = [
        *head,
        table(pd.DataFrame(glance)),
        "",
        *_runs_section(runs),
        *_claims_section(verdicts),
        *_table1_section(runs),
        *_kernel_section(runs),
        *_figures_section(runs),
        *_differ_section(verdicts, runs),
    ]
    return "\n".join(lines).rstrip("\n") + "\n"


def write_record(docs: Path | str = "docs") -> Path:
    """Render the record into ``<docs>/reproduction.md``; return its path."""
    path = Path(docs) / RECORD_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(docs))
    return path
