"""vit_jax: Vision Transformer (Dosovitskiy et al., 2021) in JAX/Flax.

Importing it changes nothing process-wide (allocator, environment, signals, garbage collector).
The commands set their process up first thing; a program of your own opts in with
`vit_jax.runtime.process.configure()` (docs/process.md).

  main            the entry point of every stage: `python -m vit_jax.main --config=... --workdir=...`
  stages          the stages a config names, and running one as a library
  train           the trainer of the pretrain, fine-tune and segment stages: the loop, the step,
                  the starting point, optimizers, EMA, mixup
  linear_probe    the linear-probe stage
  configs         the stage configs, installed with the package
  models          the ViT, its R50 hybrids, BiT ResNets, MPP and segmentation models
  objectives      what the trainer optimises (supervised, masked patch prediction, segmentation)
  sharding        the device mesh and the partition rules
  input_pipeline  sources, per-host split, preprocessing, global batches (tf.data)
  evaluators      the evaluators the trainer runs, the linear probe's probes, raw-pixel baselines
  checkpoint      parameter files in the published layouts, and the trainer's Orbax state
  cost            device peaks, model FLOPs, the compiled step's memory and FLOPs
  kernels         C++ kernels for XLA:CPU, and the XLA:CPU flags and allocator settings
  runtime         a stage's process: command line and --config, terminal, hosts, stops, workdir
  inference       a checkpoint as an image classifier, without TensorFlow
  predict         classifies image files and prints the top-5 classes
  export          a checkpoint for serving: SavedModel, LiteRT, ONNX
  analysis        inside the ViT (paper §4.5): filters, position embeddings, attention
  tools           command-line tools (`python -m vit_jax.tools.<name>`), and every command listed
"""
