"""The linear-probe stage: `run(config, workdir)` (dispatched by `vit_jax.main`).

Freezes a backbone from an earlier stage (workdir, step directory or `.npz`), extracts the
representation (`evaluators.representation_fn`) of a training and a test split, and fits the
probes of vit_jax.evaluators.linear on it. Writes `linear_probe.json` and TensorBoard scalars to
the workdir and returns the metrics.

The architecture comes from, in order: `config.model` when the config has one, the
`config.json` the trainer wrote next to the checkpoint, or the parameter shapes (plain ViTs and
BiT ResNets).
"""

import json
import os
import time
from typing import Any

import jax
import ml_collections
from absl import logging
from etils import epath

from vit_jax import checkpoint, evaluators, sharding
from vit_jax.runtime import workdir as workdir_lib

RESULTS_FILE = "linear_probe.json"


# ---------------------------------------------------------------------------------------------
# The stage.


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
  """Linear-probes `config.model_init` on `config.dataset`; returns (and writes) the metrics.

  Config fields: see configs/linear_probe.py.
  """
  # Setup. (clu's writers import TensorFlow: not at module level, so predict stays TF-free.)
  from vit_jax.runtime import logging_util

  start = time.perf_counter()
  if not config.model_init:
    raise ValueError("config.model_init: the checkpoint to probe (workdir, step dir or .npz)")
  epath.Path(workdir).mkdir(parents=True, exist_ok=True)
  mesh = sharding.make_mesh(config.mesh)
  writer = logging_util.create_writer(workdir)

  # Backbone.
  explicit = config.model if "model" in config and config.model else None
  model_config, params, saved = checkpoint.load_backbone(config.model_init, explicit)
  dataset = config.dataset.to_dict()
  if config.get("image_size_from_checkpoint") and saved is not None and "dataset" in saved:
    dataset["image_size"] = saved.dataset.image_size  # the resolution the backbone was trained at
  model, params = checkpoint.representation_model(
    model_config, params, config.representation, dataset["image_size"]
  )
  params = jax.device_put(params, sharding.tree_shardings(params, mesh))
  if jax.process_index() == 0:  # once the backbone is read: a failed start leaves no config
    workdir_lib.save_config(workdir, config)
  logging.info(
    "linear probe: backbone %s from %s at %s px",
    model_config.get("name"),
    config.model_init,
    dataset["image_size"],
  )

  # Features and probes.
  make_data = evaluators.input_pipeline_data(mesh, sharding.BATCH_AXES)
  probe = config.probe
  evaluator = evaluators.LinearProbeEvaluator(
    evaluators.representation_fn(model, config.representation),
    make_data(dataset, dataset["train_split"], config.batch_size),
    make_data(dataset, dataset["eval_split"], config.batch_size),
    evaluators.num_classes_of(dataset),
    probes=tuple(probe.probes),
    ridge_l2_regs=tuple(probe.ridge_l2_regs),
    logreg_l2_regs=tuple(probe.logreg_l2_regs),
    val_fraction=probe.val_fraction,
    seed=config.seed,
    max_examples=probe.max_examples,
    name="linear_probe",
  )
  t0 = time.perf_counter()
  features = evaluator.features(params)
  t1 = time.perf_counter()
  logging.info(
    "linear probe: features train %s test %s in %.1fs",
    features[0].shape,
    features[2].shape,
    t1 - t0,
  )
  results = evaluator.score(*features)
  results["linear_probe/feature_seconds"] = t1 - t0
  results["linear_probe/fit_seconds"] = time.perf_counter() - t1
  results["linear_probe/total_seconds"] = time.perf_counter() - start
  results["linear_probe/representation_size"] = float(features[0].shape[1])
  for key, value in sorted(results.items()):
    logging.info("%s = %.4f", key, value)

  # Results.
  writer.write_scalars(0, results)
  writer.close()  # its events flushed and the file closed: the process ends without destructors
  if jax.process_index() == 0:
    out = dict(results, model_init=str(config.model_init), dataset=dataset.get("name"))
    workdir_lib.write_json(epath.Path(workdir) / RESULTS_FILE, out)
  return results


def read_results(workdir: str | os.PathLike) -> dict[str, Any]:
  """The metrics a finished `run` wrote to `workdir`."""
  return json.loads((epath.Path(workdir) / RESULTS_FILE).read_text())
