"""The paper's findings and the project's benchmarks at small scale, one module per experiment.

Each runs from the repository root as `python -m experiments.<name> [--help]`:

  demo, folder_transfer              what pretraining buys (docs/demo.md)
  scale_study, mpp_study, inside_vit the paper's findings in miniature (docs/experiments/,
                                     docs/analysis.md)
  small_data                         AugReg in miniature: the paper's, AugReg's and the 2022
                                     recipes and distillation on 1-100% of Fashion-MNIST
                                     (docs/experiments/small_data.md; small_data_gpu.sh:
                                     with three seeds on a lent GPU)
  segmentation                       semantic segmentation from patch tokens, §5
                                     (docs/segmentation.md)
  pod_plan                           the paper's configs compiled for TPU slices
                                     (docs/pod_planning.md)
  vs_big_vision, big_vision_step     vit_jax's step beside big_vision's, compiled for the
                                     same slices; big_vision's step to its recipe
                                     (docs/pod_planning.md)
  grad_reduce                        summing gradients in bfloat16 instead of float32:
                                     accuracy and bytes on the wire (docs/training.md)
  benchmark_model, ablate_step,      throughput against timm, what each part of the step costs,
  bench_trainer, bench_input_pipeline  the trainer and the input pipeline (docs/benchmarks.md)
  bench_goodput                      what goodput accounting costs the step (docs/training.md)
  bench_export                       file sizes and CPU latency of every export format
                                     (docs/export.md)

Each is a command like the package's (vit_jax.runtime.cli): its process set up first, its absl
flags in `define_flags`, `main(argv, flags)`, `cli.run` under `__main__`; a test or a notebook
runs one with `cli.call(module, argv)` (benchmark_model parses with absl's app.run itself: its
measuring processes import no vit_jax before they know which tree's they run).

What several of them share is in `common` (the demo's model and budgets, running
`python -m vit_jax.main` stages, a train step; the raw-pixel baselines live in vit_jax.baselines);
`fingerprint` ties a committed results file to the code that would write it today (its --quick
profile's numbers, which the experiment's test compares); an experiment imports only
`experiments.common`, `experiments.fingerprint` and vit_jax, never another experiment
(`benchmark_report`, the printed report of `benchmark_model`, is that benchmark's own part). Each
writes its results (results.json, tables, figures) to experiments/results/<name>/ unless told
otherwise (--out; pod_plan: --out_dir), a --quick run to <workdir>/results/ so that tiny budgets
never replace a kept result; the workdirs of its training stages, with their checkpoints, go to
/tmp. The benchmarks print their figures (bench_goodput also writes them to
experiments/results/goodput/); the logs kept under experiments/results/process_settings/ and
gpu_vs_timm/ are such printed output, which the docs cite.
"""
