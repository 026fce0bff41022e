"""The paper's numbers, settings and claims of Section 5, as data, each with its place in the
LaTeX source (``cross-lipschitz-nips2017.tex``, Hein & Andriushchenko, NIPS 2017).

Nothing here is computed: these are the values printed in the paper, read by eye into
``paper.yaml`` beside this module (which says what each table holds) and checked against the
source by ``tests/test_reproduction.py`` (every number is found in its table row, on the
stated line). Test errors are fractions (the paper's ``1.44\\%`` is 0.0144). The paper's
kernel row "K-SVM" is the kernel model with the standard (RKHS-norm) regularization, which
its text calls Kernel-LogReg: our ``kernel_logreg``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

_DATA = yaml.safe_load(Path(__file__).with_name("paper.yaml").read_text(encoding="utf-8"))

#: File name of the paper's LaTeX source (not in the repository; its tests read it from the
#: folder ``$CROSSLIP_SHARED/paper/``, docs/architecture.md).
TEX_NAME: str = _DATA["tex"]


@dataclass(frozen=True)
class PaperNumber:
    """One number printed in the paper.

    ``text`` is the cell exactly as in the LaTeX source (``"2.23\\%"``), ``line`` the 1-based
    line of the source that holds it, ``row`` the row's label in the table (its first cell;
    for Table 1 the dataset group) and ``column`` the column's header as printed.
    """

    value: float
    text: str
    table: str
    row: str
    column: str
    line: int
    commented_out: bool = False

    @property
    def source(self) -> str:
        """Where the number is: ``cross-lipschitz-nips2017.tex:658, Table 1 (...)``."""
        note = ", commented out in the source" if self.commented_out else ""
        return (
            f"{TEX_NAME}:{self.line}, {self.table}, row {self.row!r}, column {self.column!r}{note}"
        )


_T1 = _DATA["table1"]
#: Column headers of Table 1 (line 656) -> our regularizer names.
TABLE1_HEADERS: dict[str, str] = _T1["headers"]
#: Table 1's dataset groups (line 655).
TABLE1_GROUPS: dict[str, str] = _T1["groups"]
#: Table 1 (``tab:LocalGlobal``), plain setting: (paper dataset, regularizer) -> the mean ratio
#: alpha_global / alpha_local of the L2 guarantees of Theorem 2.1 (global Cross-Lipschitz
#: constant vs Proposition 2.3).
TABLE1: dict[tuple[str, str], PaperNumber] = {
    (ds, reg): PaperNumber(
        float(text), text, _T1["table"], TABLE1_GROUPS[ds], TABLE1_HEADERS[reg], _T1["line"]
    )
    for ds, row in _T1["values"].items()
    for reg, text in row.items()
}

#: Our kernel methods (crosslip.jobs.selection.method_of) -> the row labels of the kernel table.
KERNEL_ROWS: dict[str, str] = _DATA["kernel"]["rows"]
#: The kernel table's quantities -> our summary columns.
KERNEL_COLUMNS: dict[str, str] = _DATA["kernel"]["columns"]


def _kernel_table(which: str) -> dict[tuple[str, str], PaperNumber]:
    """(method, summary column) -> number of the kernel table (``published``, lines 619-622)
    or of its older version (``commented_out``, lines 606-609)."""
    spec, old = _DATA["kernel"][which], which == "commented_out"
    return {
        (method, col): PaperNumber(
            float(text.removesuffix("\\%")) / 100 if text.endswith("\\%") else float(text),
            text,
            spec["table"],
            KERNEL_ROWS[method],
            KERNEL_COLUMNS[col],
            line,
            commented_out=old,
        )
        for method, (line, *cells) in spec["rows"].items()
        for col, text in zip(spec["columns"], cells, strict=True)
    }


#: The kernel table beside Figure ``exp:Kernel`` (best model per method): test error, mean L2
#: norm of the adversarial samples (upper bound, Section 4), mean L2 guarantee (Prop. 2.2).
KERNEL = _kernel_table("published")
#: An older version with an Linf column, commented out in the source (not in the published
#: paper); its L2 upper bounds differ from the published ones.
KERNEL_COMMENTED_OUT = _kernel_table("commented_out")

#: Classifiers of the illustration -> (our family, our method).
ILLUSTRATION_CLASSIFIERS: dict[str, tuple[str, str]] = {
    clf: tuple(fm) for clf, fm in _DATA["illustration"]["classifiers"].items()
}


@dataclass(frozen=True)
class IllustrationExample:
    """One test image of the illustration: its class, and per classifier the predicted class
    of the L2 adversarial sample and its norm ``||delta||_2``. ``line`` holds the original
    and the kernel models, ``line + 2`` the networks."""

    line: int
    true_class: int
    samples: dict[str, tuple[int, float]]

    def numbers(self) -> dict[str, PaperNumber]:
        """Each classifier's ``||delta||_2`` as a :class:`PaperNumber`."""
        return {
            clf: PaperNumber(
                norm,
                f"{clf}, Pred:{pred}, $\\norm{{\\delta}}_2={norm:.1f}$",
                "illustration (fig:adv)",
                f"Original, Class {self.true_class}",
                clf,
                self.line if clf.startswith("K-") else self.line + 2,
            )
            for clf, (pred, norm) in self.samples.items()
        }


#: Figure fig:adv (first) and the eight further examples the paper shows after it.
ILLUSTRATION: list[IllustrationExample] = [
    IllustrationExample(
        line, cls, {c: tuple(s) for c, s in zip(ILLUSTRATION_CLASSIFIERS, samples, strict=True)}
    )
    for line, cls, *samples in _DATA["illustration"]["examples"]
]


def all_numbers() -> list[PaperNumber]:
    """Every number of this module (for the test that checks them against the source)."""
    out = [*TABLE1.values(), *KERNEL.values(), *KERNEL_COMMENTED_OUT.values()]
    for ex in ILLUSTRATION:
        out.extend(ex.numbers().values())
    return out


@dataclass(frozen=True)
class PaperSetting:
    """A setting of Section 5: ``values`` as our config would write them, ``text`` the
    LaTeX fragment on ``line`` that states it."""

    what: str
    values: tuple[float, ...]
    text: str
    line: int


#: (paper dataset, what) -> setting. ``what``: ``lr``, a regularizer name (its lambda grid;
#: dropout: keep probabilities), ``batch_size``, ``hidden``, ``n_test``, ``n_train``,
#: ``kernel_a``, ``kernel_logreg``, ``kernel_cl``.
SETTINGS: dict[tuple[str, str], PaperSetting] = {
    (ds, key): PaperSetting(what, tuple(values), text, line)
    for ds, entries in _DATA["settings"].items()
    for key, (what, values, text, line) in entries.items()
}

#: Our dataset names -> the paper's (``mnist5k`` is a 5,000-digit subset of MNIST).
PAPER_DATASET: dict[str, str] = _DATA["paper_dataset"]


@dataclass(frozen=True)
class PaperClaim:
    """A statement of Section 5: ``quote`` is its text as in the source (whitespace
    normalised), starting on ``line``; ``evidence`` says where the paper shows it (its
    numbers, or a figure whose images are not in the source)."""

    key: str
    title: str
    quote: str
    line: int
    more: tuple[tuple[str, int], ...] = ()  # further sentences saying the same: (quote, line)
    evidence: str = ""


#: The sentences of Section 5 that the record checks, in the record's order.
CLAIMS: dict[str, PaperClaim] = {
    key: PaperClaim(key, **{**c, "more": tuple(map(tuple, c.get("more", ())))})
    for key, c in _DATA["claims"].items()
}

#: Figures of Section 5 -> (what they show, our figure files matching them: glob patterns
#: relative to a run's ``figures/`` folder).
FIGURES: dict[str, tuple[str, list[str]]] = {k: tuple(v) for k, v in _DATA["figures"].items()}

#: Not in the paper: the authors' code (max-andr/cross-lipschitz) trains 200 epochs by default.
AUTHORS_EPOCHS: int = _DATA["authors"]["epochs"]
#: Not in the paper: the authors' learning-rate schedule, (factor, fractions of the updates):
#: x0.1 at 72% and again at 88% (the schema's defaults ``train.lr_decay``/``lr_decay_at``).
AUTHORS_LR_DECAY: tuple[float, tuple[float, ...]] = (
    _DATA["authors"]["lr_decay"][0],
    tuple(_DATA["authors"]["lr_decay"][1]),
)
