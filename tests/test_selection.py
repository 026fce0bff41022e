"""Model selection (certify.models: best): the lowest test error per method."""

from __future__ import annotations

from crosslip.jobs.selection import method_of, read_selected, select_best, write_selected


def met(model_id, reg, err, ds="mnist", status="ok", **cfg):
    return {
        "dataset": ds,
        "model_id": model_id,
        "status": status,
        "test_error": err,
        "config": {"regularizer": reg, "lam": cfg.pop("lam", 0.1), **cfg},
    }


def test_lowest_test_error_per_dataset_family_setting_and_method(tmp_path):
    metrics = [
        met("cl-a", "cross_lipschitz", 0.020),
        met("cl-b", "cross_lipschitz", 0.015),
        met("cl-diverged", "cross_lipschitz", None, status="diverged"),
        met("cl-adv", "cross_lipschitz", 0.030, setting="adversarial"),
        met("wd-a", "weight_decay", 0.018),
        met("wd-other-ds", "weight_decay", 0.5, ds="cifar10"),
        met("klr-0", "kernel_logreg", 0.03, lam=0.0),
        met("klr-1", "kernel_logreg", 0.02, lam=1e-6),
        met("klr-2", "kernel_logreg", 0.01, lam=1e-5),
        met("kcl-tie-b", "kernel_cl", 0.012),
        met("kcl-tie-a", "kernel_cl", 0.012),
        met("res", "none", 0.1, arch="resnet"),
        met("mlp", "none", 0.2, arch="mlp"),
    ]
    chosen = select_best(metrics)
    assert chosen == sorted(
        [
            ("mnist", "cl-b"),
            ("mnist", "cl-adv"),
            ("mnist", "wd-a"),
            ("cifar10", "wd-other-ds"),
            ("mnist", "klr-0"),
            ("mnist", "klr-2"),
            ("mnist", "kcl-tie-a"),
            ("mnist", "res"),
            ("mnist", "mlp"),
        ]
    )
    write_selected(chosen, tmp_path / "s.json")
    assert read_selected(tmp_path / "s.json") == chosen
    assert method_of({"regularizer": "kernel_logreg", "lam": 0.0}) == "kernel_noreg"


def test_nothing_finished_selects_nothing():
    assert select_best([met("x", "none", None, status="diverged")]) == []
