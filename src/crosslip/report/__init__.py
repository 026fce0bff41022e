"""The tables and figures of the results (Section 5), from the per-instance results and the
models' metrics; torch-free, and matplotlib is imported only when a figure is drawn.

- :mod:`~crosslip.report.tables`: the summary (one row per model) and its columns, Table 1,
  the kernel table, reading the summary back and writing a table;
- :mod:`~crosslip.report.style`: the names and colours that the figures share;
- :mod:`~crosslip.report.figures`: the figures per dataset and model family (bounds against
  test error, the bracket, the certified accuracy) and the helpers every figure uses;
- :mod:`~crosslip.report.illustration`: the illustration of adversarial samples;
- :mod:`~crosslip.report.training_figure`: the training curves and their figure.

Every public name of these modules is also importable from ``crosslip.report``.
"""

from .figures import (
    BRACKET_MEANS,
    FAMILY_FIGURES,
    dodge,
    plot_bounds_vs_error,
    plot_bracket,
    plot_certified_accuracy,
)
from .illustration import (
    ILLUSTRATION_COLUMNS,
    ILLUSTRATION_ORDER,
    common_correct_points,
    illustration_models,
    illustration_record,
    load_examples,
    plot_adversarial_samples,
)
from .style import (
    FAMILY_LABEL,
    METHOD_LABEL,
    NORM_TEX,
    REG_LABEL,
    REG_STYLE,
    SETTING_LABEL,
    SETTING_ORDER,
    model_label,
    ordered_settings,
)
from .tables import (
    KERNEL_TABLE_COLUMNS,
    SUMMARY_COLUMNS,
    TABLE1_COLUMNS,
    add_diverged,
    kernel_table,
    read_summary,
    summarize,
    table1,
    write_tables,
)
from .training_figure import plot_training_curves, training_curves

__all__ = [
    "BRACKET_MEANS",
    "FAMILY_FIGURES",
    "FAMILY_LABEL",
    "ILLUSTRATION_COLUMNS",
    "ILLUSTRATION_ORDER",
    "KERNEL_TABLE_COLUMNS",
    "METHOD_LABEL",
    "NORM_TEX",
    "REG_LABEL",
    "REG_STYLE",
    "SETTING_LABEL",
    "SETTING_ORDER",
    "SUMMARY_COLUMNS",
    "TABLE1_COLUMNS",
    "add_diverged",
    "common_correct_points",
    "dodge",
    "illustration_models",
    "illustration_record",
    "kernel_table",
    "load_examples",
    "model_label",
    "ordered_settings",
    "plot_adversarial_samples",
    "plot_bounds_vs_error",
    "plot_bracket",
    "plot_certified_accuracy",
    "plot_training_curves",
    "read_summary",
    "summarize",
    "table1",
    "training_curves",
    "write_tables",
]
