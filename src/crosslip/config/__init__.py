"""The workflow's configuration: validation, defaults and the training grid.

One source states every key: the JSON schema ``schema.yaml`` in this package (type, range,
default and meaning of each key). The package

* reads the schema and words its problems (:mod:`.schema`): every problem on one line that
  names the key path, what is wrong and what is allowed (``config key train.grid.svm: not
  allowed; allowed keys: none, weight_decay, ...``);
* validates a config against it, fills in the defaults and checks what a schema cannot
  express (:func:`.validate.validate`; models trained elsewhere: :mod:`.validate`);
* types a training job's hyperparameters (:mod:`.specs`: :class:`~.specs.NetTrainSpec`,
  :class:`~.specs.KernelTrainSpec`, whose defaults are read from the schema too, and the
  model ids);
* expands the grids into those specs, one per training job (:func:`.grid.training_grid`),
  and lists the datasets and the outputs a config calls for (:mod:`.grid`);
* writes docs/configuration.md from the schema (:mod:`.reference`, ``python -m
  crosslip.config``).

It imports neither torch nor Snakemake, so the Snakefile parses fast and tests call it
directly.
"""
