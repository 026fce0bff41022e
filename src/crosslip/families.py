"""Model families of the paper's experiments and the regularizers that train each.

Section 5 trains one-hidden-layer softplus networks (``mlp``) and ResNets (``resnet``) by
SGD with one of :data:`NET_REGULARIZERS` (:mod:`crosslip.training.single`), and Gaussian-kernel
models (``kernel``) by L-BFGS with one of :data:`KERNEL_REGULARIZERS`
(:mod:`crosslip.training.kernel`). Models trained elsewhere (:mod:`crosslip.models.external`) form
the family ``external``. These names are shared by training, the results (``family``,
``regularizer`` columns) and the report, so they live here, apart from any maths (no torch).
"""

from __future__ import annotations

from typing import Any

#: Regularizers of the networks: none, Cross-Lipschitz (Section 3), weight decay, dropout,
#: and the certified margin (training for the curvature certificate, beyond the paper).
NET_REGULARIZERS = ("none", "cross_lipschitz", "weight_decay", "dropout", "certified_margin")
#: Regularizers of the Gaussian-kernel models: Kernel-LogReg (RKHS norm) and Kernel-CL.
KERNEL_REGULARIZERS = ("kernel_logreg", "kernel_cl")
#: Network architectures (``arch`` of a training config).
ARCHS = ("mlp", "resnet")
#: The family (and ``regularizer``) of models trained elsewhere (config ``external_models``).
EXTERNAL = "external"
#: Values of the results' ``family`` column.
FAMILIES = (*ARCHS, "kernel", EXTERNAL)


def model_family(cfg: dict[str, Any]) -> str:
    """``kernel`` (Gaussian-kernel model), ``mlp`` (one hidden layer), ``resnet``, or
    ``external`` (trained elsewhere), from the config stored in a model's metrics."""
    if cfg.get("family") == EXTERNAL:
        return EXTERNAL
    if cfg["regularizer"] in KERNEL_REGULARIZERS:
        return "kernel"
    return str(cfg.get("arch", "mlp"))
