"""Names and colours that the figures share: of the regularizers, model families, settings
and norms, and a model's name in a legend."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

#: Names of the regularizers (those of the paper's Table 1 / kernel table rows).
REG_LABEL = {
    "none": "None",
    "dropout": "Dropout",
    "weight_decay": "Weight Dec.",
    "cross_lipschitz": "Cross Lip.",
    "certified_margin": "Cert. Margin",
    "kernel_logreg": "K-LogReg",
    "kernel_cl": "K-CL",
}
#: Colour and marker of each regularizer.
REG_STYLE = {
    "none": ("tab:gray", "o"),
    "weight_decay": ("tab:blue", "s"),
    "dropout": ("tab:green", "^"),
    "cross_lipschitz": ("tab:red", "D"),
    "certified_margin": ("tab:cyan", "X"),
    "kernel_logreg": ("tab:purple", "v"),
    "kernel_cl": ("tab:orange", "P"),
}
#: Column titles of the illustration: the methods of the kernel table and of Table 1.
METHOD_LABEL = {**REG_LABEL, "kernel_noreg": "K No Reg."}

#: The model families in titles.
FAMILY_LABEL = {
    "mlp": "one hidden layer, softplus",
    "resnet": "ResNet",
    "kernel": "Gaussian kernel",
    "external": "trained elsewhere",
}

#: The settings in Section 5's order, and in titles.
SETTING_ORDER = ["plain", "augment", "adversarial"]
SETTING_LABEL = {
    "plain": "plain",
    "augment": "data augmentation",
    "adversarial": "adversarial training",
}


def ordered_settings(present: set[str]) -> list[str]:
    """The settings in ``present`` in Section 5's order (others after, sorted); ``["plain"]``
    when there are none."""
    ordered = [s for s in SETTING_ORDER if s in present] + sorted(present - set(SETTING_ORDER))
    return ordered or ["plain"]


#: The norms as axis labels write them.
NORM_TEX = {"l1": "L_1", "l2": "L_2", "linf": "L_\\infty"}


def model_label(row: Mapping) -> str:
    """A model's name in a legend: its regularizer and grid value (lambda, dropout's keep
    probability), or its id for a model trained elsewhere."""
    reg = row["regularizer"]
    if reg == "external":
        return str(row["model_id"])
    if reg == "none" or pd.isna(row.get("lam", np.nan)):
        return REG_LABEL.get(reg, reg)
    tag = "keep" if reg == "dropout" else "λ"
    return f"{REG_LABEL.get(reg, reg)} {tag}={row['lam']:g}"
