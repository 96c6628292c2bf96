"""The project's benchmarks: what the code costs, apart from the paper's experiments.

Each runs from the repository root as `python -m experiments.benchmarks.<name> [--help]` (the
shell scripts with bash), prints its figures, and states them only from a quiet machine:

  benchmark_model        throughput and MFU against timm, each side in its own process, or
                         paired against a baseline revision of vit_jax (docs/benchmarks.md)
  benchmark_report       benchmark_model's printed rows, ratios and their quartiles
  ablate_step            what each part of the training step costs (docs/benchmarks.md)
  bench_trainer          the trainer's whole step against its bare compiled step
  bench_goodput          what goodput accounting costs the step (docs/training.md); writes
                         experiments/results/goodput/
  bench_input_pipeline   images/s of the input pipeline against the step's (docs/data.md)
  bench_export           file sizes and CPU latency of every export format (docs/export.md)
  gpu_vs_timm.sh         benchmark_model on a lent GPU, B/16 and L/16 beside timm
  suite_time.sh          the README's test command from a fresh clone, timed, appended to
                         experiments/results/suite_time/runs.log

They share the experiments' `experiments.common` and are commands of the same form
(experiments/__init__.py); none is imported by an experiment.
"""
