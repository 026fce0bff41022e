"""The job server, which forks a local run's jobs from one process that has imported torch,
pandas and crosslip's stages once (:mod:`.server`, ``python -m crosslip.jobserver --
snakemake ...``), and a job's side of it, which hands the script to the server
(:mod:`.handoff`, also ``python -m crosslip.jobserver.handoff SCRIPT``).

This package's ``__init__`` imports nothing: every workflow job's process loads the package
on its way to :mod:`.handoff`, before it hands the job off (docs/performance.md)."""
