"""The workflow's stages as plain functions, one module per stage, so that a job imports
only the code it runs (and :mod:`crosslip.jobs.tracking` reruns it only when that code changes).

* :mod:`.data`: ``prepare_data`` (download or mirror, verify, store as ``.npz``);
* :mod:`.training`: ``train_stage`` (a network by SGD, a kernel model by L-BFGS);
* :mod:`.external`: ``import_model_stage`` (a model trained elsewhere, checked and stored
  in the training stage's place);
* :mod:`.certification`: ``certify_stage`` (Theorem 2.1, per model kind);
* :mod:`.attack`: ``attack_stage`` (Section 4's upper bounds and the refinement);
* :mod:`.instances`: ``instances_stage`` (the per-instance results);
* :mod:`.common`: the evaluation points that certification and attack share;
* :mod:`.parquet`: atomic Parquet files, without torch (the instances job imports only it).

This package's ``__init__`` imports none of them; :mod:`crosslip.pipeline` gathers them all.
"""
