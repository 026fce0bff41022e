"""The paper's numbers, settings and claims of Section 5, as data, each with its place in the
LaTeX source (``cross-lipschitz-nips2017.tex``, Hein & Andriushchenko, NIPS 2017).

Nothing here is computed: these are the values printed in the paper, read by eye and checked
against the source by ``tests/test_reproduction.py`` (every number is found in its table row,
on the stated line). Test errors are fractions (the paper's ``1.44\\%`` is 0.0144).

* :data:`TABLE1`: Table 1 (``tab:LocalGlobal``), the mean ratio alpha_global / alpha_local of
  the L2 guarantees of Theorem 2.1 (global Cross-Lipschitz constant vs Proposition 2.3), per
  dataset and regularizer, plain setting.
* :data:`KERNEL`: the kernel table beside Figure ``exp:Kernel``: test error, mean L2 norm of
  the adversarial samples (upper bound, Section 4) and mean L2 guarantee (Proposition 2.2) of
  the best model per method. The paper's row "K-SVM" is the kernel model with the standard
  (RKHS-norm) regularization, which its text calls Kernel-LogReg: our ``kernel_logreg``.
* :data:`KERNEL_COMMENTED_OUT`: an older version of that table with an Linf column, which
  the source keeps commented out (``%`` lines); not in the published paper.
* :data:`ILLUSTRATION`: the L2 adversarial samples of Figure ``fig:adv`` and the eight
  further examples after it: per test image, each classifier's prediction and ``||delta||_2``.
* :data:`SETTINGS`: the experimental settings Section 5 states (grids, batch size, ...).
* :data:`CLAIMS`: the sentences of Section 5 that the record checks.
"""

from __future__ import annotations

from dataclasses import dataclass

#: File name of the paper's LaTeX source (in ``shared/paper/`` beside the checkout).
TEX_NAME = "cross-lipschitz-nips2017.tex"


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


# --------------------------------------------------------------------------------------
# Table 1: mean ratio alpha_global / alpha_local (plain setting)
# --------------------------------------------------------------------------------------
_T1 = "Table 1 (tab:LocalGlobal)"
_T1_LINE = 658
#: Column headers of Table 1 (line 656) -> our regularizer names.
TABLE1_HEADERS = {
    "none": "None",
    "dropout": "Dropout",
    "weight_decay": "Weight Dec.",
    "cross_lipschitz": "Cross Lip.",
}
#: Table 1's dataset groups (line 655).
TABLE1_GROUPS = {"mnist": "MNIST (plain)", "cifar10": "CIFAR10 (plain)"}


def _t1(dataset: str, reg: str, text: str) -> PaperNumber:
    return PaperNumber(
        float(text), text, _T1, TABLE1_GROUPS[dataset], TABLE1_HEADERS[reg], _T1_LINE
    )


#: (paper dataset, regularizer) -> the mean ratio alpha_global / alpha_local of Table 1.
TABLE1: dict[tuple[str, str], PaperNumber] = {
    ("mnist", "none"): _t1("mnist", "none", "0.69"),
    ("mnist", "dropout"): _t1("mnist", "dropout", "0.48"),
    ("mnist", "weight_decay"): _t1("mnist", "weight_decay", "0.68"),
    ("mnist", "cross_lipschitz"): _t1("mnist", "cross_lipschitz", "0.21"),
    ("cifar10", "none"): _t1("cifar10", "none", "0.22"),
    ("cifar10", "dropout"): _t1("cifar10", "dropout", "0.13"),
    ("cifar10", "weight_decay"): _t1("cifar10", "weight_decay", "0.24"),
    ("cifar10", "cross_lipschitz"): _t1("cifar10", "cross_lipschitz", "0.17"),
}

# --------------------------------------------------------------------------------------
# The kernel table (MNIST, best parameters per method)
# --------------------------------------------------------------------------------------
#: Our kernel methods (crosslip.selection.method_of) -> the row labels of the kernel table.
KERNEL_ROWS = {"kernel_noreg": "No Reg.", "kernel_logreg": "K-SVM", "kernel_cl": "K-CL"}
#: The kernel table's quantities -> our summary columns.
KERNEL_COLUMNS = {
    "test_error": "test error",
    "mean_upper_bound": "avg. L2 adv. samples",
    "mean_upper_bound_linf": "avg. Linf adv. samples",
    "mean_guarantee_local": "avg. L2 rob. guar.",
}
_KT = "kernel table (beside Figure exp:Kernel)"
_KT_OLD = "older kernel table (before Figure exp:Kernel)"


def _kernel(method: str, column: str, text: str, line: int, old: bool = False) -> PaperNumber:
    value = float(text.removesuffix("\\%")) / 100 if text.endswith("\\%") else float(text)
    return PaperNumber(
        value,
        text,
        _KT_OLD if old else _KT,
        KERNEL_ROWS[method],
        KERNEL_COLUMNS[column],
        line,
        commented_out=old,
    )


#: (method, summary column) -> the kernel table of Section 5 (lines 619-622).
KERNEL: dict[tuple[str, str], PaperNumber] = {
    ("kernel_noreg", "test_error"): _kernel("kernel_noreg", "test_error", "2.23\\%", 619),
    ("kernel_noreg", "mean_upper_bound"): _kernel("kernel_noreg", "mean_upper_bound", "2.39", 619),
    ("kernel_noreg", "mean_guarantee_local"): _kernel(
        "kernel_noreg", "mean_guarantee_local", "0.037", 619
    ),
    ("kernel_logreg", "test_error"): _kernel("kernel_logreg", "test_error", "1.48\\%", 621),
    ("kernel_logreg", "mean_upper_bound"): _kernel(
        "kernel_logreg", "mean_upper_bound", "1.91", 621
    ),
    ("kernel_logreg", "mean_guarantee_local"): _kernel(
        "kernel_logreg", "mean_guarantee_local", "0.058", 621
    ),
    ("kernel_cl", "test_error"): _kernel("kernel_cl", "test_error", "1.44\\%", 622),
    ("kernel_cl", "mean_upper_bound"): _kernel("kernel_cl", "mean_upper_bound", "3.12", 622),
    ("kernel_cl", "mean_guarantee_local"): _kernel(
        "kernel_cl", "mean_guarantee_local", "0.045", 622
    ),
}

#: The same table in an older version with an Linf column, commented out in the source
#: (lines 606-609); its L2 upper bounds differ from the published ones.
KERNEL_COMMENTED_OUT: dict[tuple[str, str], PaperNumber] = {
    (m, c): _kernel(m, c, text, line, old=True)
    for m, line, row in [
        ("kernel_noreg", 606, ("2.23\\%", "4.16", "0.41", "0.037")),
        ("kernel_logreg", 608, ("1.48\\%", "4.14", "0.36", "0.058")),
        ("kernel_cl", 609, ("1.44\\%", "5.52", "0.52", "0.045")),
    ]
    for c, text in zip(
        ["test_error", "mean_upper_bound", "mean_upper_bound_linf", "mean_guarantee_local"],
        row,
        strict=True,
    )
}

# --------------------------------------------------------------------------------------
# The illustration of adversarial samples (Figure fig:adv and the further examples)
# --------------------------------------------------------------------------------------
#: Classifiers of the illustration -> (our family, our method).
ILLUSTRATION_CLASSIFIERS = {
    "K-SVM": ("kernel", "kernel_logreg"),
    "K-CL": ("kernel", "kernel_cl"),
    "NN-WD": ("mlp", "weight_decay"),
    "NN-DO": ("mlp", "dropout"),
    "NN-CL": ("mlp", "cross_lipschitz"),
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
        out = {}
        for clf, (pred, norm) in self.samples.items():
            line = self.line if clf.startswith("K-") else self.line + 2
            text = f"{clf}, Pred:{pred}, $\\norm{{\\delta}}_2={norm:.1f}$"
            out[clf] = PaperNumber(
                norm,
                text,
                "illustration (fig:adv)",
                f"Original, Class {self.true_class}",
                clf,
                line,
            )
        return out


def _ex(line: int, cls: int, *samples: tuple[int, float]) -> IllustrationExample:
    return IllustrationExample(line, cls, dict(zip(ILLUSTRATION_CLASSIFIERS, samples, strict=True)))


#: Figure fig:adv (first) and the eight further examples the paper shows after it.
ILLUSTRATION: list[IllustrationExample] = [
    _ex(732, 1, (7, 1.2), (8, 3.5), (8, 1.2), (7, 1.1), (8, 2.6)),
    _ex(744, 6, (0, 3.0), (0, 4.7), (4, 1.4), (4, 1.9), (0, 3.2)),
    _ex(754, 4, (9, 1.4), (9, 2.2), (9, 1.3), (9, 1.5), (9, 2.2)),
    _ex(764, 2, (3, 2.5), (3, 4.4), (3, 1.1), (3, 1.4), (3, 2.0)),
    _ex(774, 8, (3, 2.2), (5, 4.2), (3, 1.4), (5, 1.6), (3, 2.8)),
    _ex(784, 1, (8, 1.2), (2, 3.7), (2, 1.1), (2, 1.1), (8, 2.7)),
    _ex(794, 3, (8, 2.1), (8, 3.3), (8, 1.7), (8, 1.4), (5, 3.2)),
    _ex(804, 8, (9, 2.1), (5, 2.6), (9, 1.4), (9, 1.8), (9, 1.8)),
    _ex(814, 5, (9, 1.5), (9, 2.2), (9, 1.1), (9, 1.0), (9, 1.4)),
]


def all_numbers() -> list[PaperNumber]:
    """Every number of this module (for the test that checks them against the source)."""
    out = [*TABLE1.values(), *KERNEL.values(), *KERNEL_COMMENTED_OUT.values()]
    for ex in ILLUSTRATION:
        out.extend(ex.numbers().values())
    return out


# --------------------------------------------------------------------------------------
# Settings stated in Section 5
# --------------------------------------------------------------------------------------
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
    ("mnist", "lr"): PaperSetting("learning rates", (0.2, 0.5), "$\\{0.2,0.5\\}$", 679),
    ("mnist", "weight_decay"): PaperSetting(
        "weight decay lambda",
        (1e-5, 1e-4, 1e-3, 1e-2),
        "$\\{10^{-5},10^{-4},10^{-3},10^{-2}\\}$",
        680,
    ),
    ("mnist", "cross_lipschitz"): PaperSetting(
        "Cross-Lipschitz lambda",
        (1e-5, 1e-4, 5e-4, 1e-3),
        "$\\{10^{-5},10^{-4},5*10^{-4},10^{-3}\\}$",
        681,
    ),
    ("mnist", "dropout"): PaperSetting(
        "dropout keep_hidden", (0.4, 0.5, 0.6, 0.7), "$\\{0.4,0.5,0.6,0.7\\}$", 681
    ),
    ("mnist", "n_train"): PaperSetting("training points", (60000,), "60000 training", 592),
    ("mnist", "n_test"): PaperSetting("test points", (10000,), "10000 test samples", 592),
    ("mnist", "kernel_a"): PaperSetting(
        "kernel a", (0.5, 1, 2, 4), "$\\alpha \\in \\{0.5,1,2,4\\}$", 592
    ),
    ("mnist", "kernel_logreg"): PaperSetting(
        "K-SVM lambda",
        (1e-5, 1e-6, 1e-7, 1e-8),
        "$\\lambda \\in \\{10^{-k}| k \\in \\{5,6,7,8\\}\\}$ for Kernel-SVM",
        594,
    ),
    ("mnist", "kernel_cl"): PaperSetting(
        "K-CL lambda",
        (1.0, 1e-1, 1e-2, 1e-3),
        "$\\lambda \\in \\{10^{-k}\\,|\\, k \\in \\{0,1,2,3\\}\\}$",
        594,
    ),
    ("cifar10", "lr"): PaperSetting("learning rates", (0.04, 0.1), "$\\{0.04,0.1\\}$", 682),
    ("cifar10", "weight_decay"): PaperSetting(
        "weight decay lambda",
        (1e-5, 1e-4, 5e-4, 1e-3),
        "$\\{10^{-5},10^{-4},5*10^{-4},10^{-3}\\}$",
        683,
    ),
    ("cifar10", "cross_lipschitz"): PaperSetting(
        "Cross-Lipschitz lambda",
        (1e-5, 1e-4, 5e-4, 1e-3),
        "$\\{10^{-5},10^{-4},5*10^{-4},10^{-3}\\}$",
        683,
    ),
    ("cifar10", "dropout"): PaperSetting(
        "dropout keep_hidden", (0.5, 0.6, 0.7, 0.8), "$\\{0.5,0.6,0.7,0.8\\}$", 683
    ),
    ("all", "batch_size"): PaperSetting("batch size", (64,), "batchsize 64", 690),
    ("all", "hidden"): PaperSetting("hidden units", (1024,), "1024 hidden units", 666),
    ("all", "settings"): PaperSetting(
        "settings", (), "in three settings: plain, data augmentation and adversarial training", 669
    ),
    ("all", "kernel_certified"): PaperSetting(
        "kernel models certified", (), "only for the optimal parameters", 596
    ),
}

#: Our dataset names -> the paper's (``mnist5k`` is a 5,000-digit subset of MNIST).
PAPER_DATASET = {"mnist": "mnist", "mnist5k": "mnist", "cifar10": "cifar10", "gtsrb": "gtsrb"}

# --------------------------------------------------------------------------------------
# Claims of Section 5
# --------------------------------------------------------------------------------------


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


_MNIST_TREND = (
    "For MNIST there is a clear trend that our Cross-Lipschitz regularization improves the "
    "robustness of the resulting classifier while having competitive resp. better test error."
)
_MNIST_CAPTION = (
    (
        "The Cross-Lipschitz regularization leads to better robustness with similar or better "
        "prediction performance.",
        703,
    ),
)
_FIG_MNIST = "Figure exp:NN-MNIST (its images are not in the source: no numbers)"
_FIG_CIFAR = "Figure exp:NN-CIFAR (no numbers in the source)"
_FIG_GTSRB = "Figure exp:NN-GTSB (no numbers in the source)"
_FIG_RESNET = "Figure exp:ResNets-plain-augm (no numbers in the source)"

CLAIMS: dict[str, PaperClaim] = {
    c.key: c
    for c in [
        PaperClaim(
            "cl_mnist_upper",
            "MNIST: Cross-Lipschitz improves the upper bounds",
            _MNIST_TREND,
            672,
            _MNIST_CAPTION,
            _FIG_MNIST + ", left column",
        ),
        PaperClaim(
            "cl_mnist_guarantee",
            "MNIST: Cross-Lipschitz improves the guarantees",
            _MNIST_TREND,
            672,
            _MNIST_CAPTION,
            _FIG_MNIST + ", right column",
        ),
        PaperClaim(
            "cl_mnist_error",
            "MNIST: Cross-Lipschitz has competitive or better test error",
            _MNIST_TREND,
            672,
            _MNIST_CAPTION,
            _FIG_MNIST + ", horizontal axes",
        ),
        PaperClaim(
            "local_global",
            "The local guarantee beats the global one on every point",
            "We want to highlight that the robustness guarantee with the global "
            "Cross-Lipschitz constant was \\emph{always} worse than when using the local "
            "Cross-Lipschitz constant across all regularizers and data sets.",
            650,
            evidence="the text only",
        ),
        PaperClaim(
            "table1",
            "Table 1: mean ratio of the global to the local guarantee",
            "We show the average ratio $\\frac{\\alpha_{\\textrm{global}}}"
            "{\\alpha_{\\textrm{local}}}$ of the robustness guarantees",
            662,
            evidence="Table 1 (tex line 658)",
        ),
        PaperClaim(
            "local_factor",
            "The local guarantee is up to eight times the global one",
            "The guarantees using the local Cross-Lipschitz constant are up to eight times "
            "better than with the global one.",
            663,
            (
                (
                    "Table \\ref{tab:LocalGlobal} shows that the guarantees using the local "
                    "Cross-Lipschitz can be up to eight times better than for the global one.",
                    650,
                ),
            ),
            "Table 1 (tex line 658): its smallest ratio per dataset",
        ),
        PaperClaim(
            "bounds_close",
            "The guarantees and the upper bounds are not too far away",
            "We want to highlight that our guarantees (lower bounds) and the upper bounds from "
            "the adversarial samples are not too far away.",
            675,
            evidence="Figures exp:NN-MNIST and exp:NN-CIFAR (no numbers in the source)",
        ),
        PaperClaim(
            "kernel_order",
            "Kernel table: the ordering of test error, upper bound and guarantee",
            "Cross-Lipschitz regularization achieves both better test error and robustness "
            "against adversarial samples (upper bounds, larger is better) compared to the "
            "standard regularization.",
            633,
            evidence="the kernel table (tex lines 619-622)",
        ),
        PaperClaim(
            "kernel_vs_nets",
            "Kernel models have weaker guarantees than the networks",
            "The robustness guarantee is weaker than for neural networks but this is most "
            "likely due to the relatively loose bound.",
            634,
            evidence="the kernel table (tex lines 619-622) beside Figure exp:NN-MNIST",
        ),
        PaperClaim(
            "adversarial",
            "Adversarial training improves both bounds",
            "However, adversarial training improves the guarantees as well as adversarial "
            "resistance.",
            673,
            (
                (
                    "Adversarial training slightly improves performance compared to the plain "
                    "setting and improves upper and lower bounds in terms of robustness.",
                    674,
                ),
            ),
            _FIG_MNIST + ", bottom row; " + _FIG_CIFAR,
        ),
        PaperClaim(
            "augment",
            "Data augmentation leaves robustness unchanged",
            "It is surprising that data augmentation does not lead to more robust models.",
            673,
            (
                (
                    "Data augmentation leads to better test error but the robustness properties "
                    "(upper and lower bounds) are basically unchanged.",
                    674,
                ),
            ),
            _FIG_MNIST + ", middle row; " + _FIG_CIFAR,
        ),
        PaperClaim(
            "cifar_guarantee",
            "CIFAR10: Cross-Lipschitz is not significantly better in the guarantees",
            "For CIFAR10 the picture is mixed, our CL-Regularization performs well for the "
            "augmented task in test error and upper bounds but is not significantly better "
            "in the robustness guarantees.",
            673,
            evidence=_FIG_CIFAR,
        ),
        PaperClaim(
            "gtsrb",
            "GTSRB: Cross-Lipschitz improves the upper bounds over weight decay; "
            "dropout has the best test error",
            "For this dataset Cross-Lipschitz regularization improves the upper bounds "
            "compared to weight decay but dropout achieves significantly better prediction "
            "performance and has similar upper bounds.",
            826,
            evidence=_FIG_GTSRB,
        ),
        PaperClaim(
            "gtsrb_guarantee",
            "GTSRB: weight decay and Cross-Lipschitz have slightly better guarantees than dropout",
            "The robustness guarantees for weight decay and Cross-Lipschitz are slightly better "
            "than for dropout.",
            827,
            evidence=_FIG_GTSRB,
        ),
        PaperClaim(
            "resnet",
            "ResNets: Cross-Lipschitz improves the upper bounds by a factor of 2 to 3",
            "Cross-Lipschitz regularization improves the upper bounds on the robustness "
            "against adversarial manipulation compare to weight decay and dropout by a "
            "factor of 2 to 3 both in the plain setting (right) and with data augmentation "
            "(left).",
            847,
            evidence=_FIG_RESNET,
        ),
        PaperClaim(
            "resnet_error",
            "ResNets: Cross-Lipschitz pays with a slightly worse test error",
            "This comes at a price of a slightly worse test performance.",
            847,
            evidence=_FIG_RESNET,
        ),
        PaperClaim(
            "illustration",
            "Illustration: Cross-Lipschitz models need the largest modification",
            "This effect is strongest for our Kernel-CL, which also requires the strongest "
            "modification to generate the adversarial sample.",
            727,
            evidence="the nine illustrated samples (Figure fig:adv and after it)",
        ),
    ]
}

#: Figures of Section 5 -> (what they show, our figure files matching them: glob patterns
#: relative to a run's ``figures/`` folder, ``{ds}`` standing for our dataset names).
FIGURES: dict[str, tuple[str, list[str]]] = {
    "exp:Kernel": (
        "kernel models on MNIST, all parameters: upper bound and guarantee vs test error",
        ["bounds_vs_error/mnist-kernel.png", "bounds_vs_error/mnist5k-kernel.png"],
    ),
    "exp:NN-MNIST": (
        "networks on MNIST, rows plain / augmentation / adversarial training: "
        "upper bound (left) and guarantee (right) vs test error",
        ["bounds_vs_error/mnist-mlp.png", "bounds_vs_error/mnist5k-mlp.png"],
    ),
    "exp:NN-CIFAR": ("networks on CIFAR10, the same layout", ["bounds_vs_error/cifar10-mlp.png"]),
    "exp:NN-GTSB": ("networks on GTSRB, plain setting", ["bounds_vs_error/gtsrb-mlp.png"]),
    "exp:ResNets-plain-augm": (
        "ResNets on CIFAR10: upper bounds, augmentation and plain",
        ["bounds_vs_error/cifar10-resnet.png"],
    ),
    "fig:adv": (
        "L2 adversarial samples of the best model per method on the same MNIST test points",
        ["adversarial_samples.png"],
    ),
}

#: Not in the paper: the authors' code (max-andr/cross-lipschitz) trains 200 epochs by default.
AUTHORS_EPOCHS = 200
#: Not in the paper: the authors' learning-rate schedule, (factor, fractions of the updates):
#: x0.1 at 72% and again at 88% (the schema's defaults ``train.lr_decay``/``lr_decay_at``).
AUTHORS_LR_DECAY = (0.1, (0.72, 0.88))
