"""The paper's findings at small scale, one module per experiment; the project's benchmarks in
`benchmarks` (experiments/benchmarks/__init__.py indexes them).

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
  detection                          object detection from patch tokens, §5: ViTDet's
                                     simple pyramid and FCOS, ViT vs BiT vs a non-learned
                                     baseline (configs/detect.py)
  pod_plan                           the paper's configs compiled for TPU slices
                                     (docs/pod_planning.md)
  vs_big_vision, big_vision_step     vit_jax's step beside big_vision's, compiled for the
                                     same slices; big_vision's step to its recipe
                                     (docs/pod_planning.md)
  grad_reduce                        summing gradients in bfloat16 instead of float32:
                                     accuracy and bytes on the wire (docs/training.md)
  benchmarks                         what the code costs: throughput against timm, the step's
                                     parts, the trainer, input pipeline, goodput, export
                                     (docs/benchmarks.md)

Each is a command like the package's (vit_jax.runtime.cli): its process set up first, its absl
flags in `define_flags`, `main(argv, flags)`, `cli.run` under `__main__`; a test or a notebook
runs one with `cli.call(module, argv)` (benchmarks.benchmark_model parses with absl's app.run
itself: its measuring processes import no vit_jax before they know which tree's they run).

What several of them share is in `common` (the demo's model and budgets, running
`python -m vit_jax.main` stages, a train step; the raw-pixel baselines live in vit_jax.evaluators.baselines);
`fingerprint` ties a committed results file to the code that would write it today (its --quick
profile's numbers, which the experiment's test compares); an experiment imports only
`experiments.common`, `experiments.fingerprint`, its own parts (vs_big_vision:
big_vision_step) and vit_jax, never another experiment. Each writes its results (results.json, tables, figures) to experiments/results/<name>/ unless told
otherwise (--out; pod_plan: --out_dir), a --quick run to <workdir>/results/ so that tiny budgets
never replace a kept result; the workdirs of its training stages, with their checkpoints, go to
/tmp. The benchmarks print their figures; the logs kept under experiments/results/ (goodput/,
process_settings/, gpu_vs_timm/, suite_time/) are such printed output, which the docs cite.
"""
