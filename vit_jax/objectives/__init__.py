"""Training objectives: what the trainer optimises, behind one small interface.

An `Objective` is chosen once from the config (`get(config, num_classes, mesh)`) and gives the
trainer everything that depends on the loss:

    model(model_config, mesh)          the Flax module to train (vit_jax.models)
    per_example(model, params, batch, key) -> (loss [B], correct [B])
                                       `correct` 1/0 top-1 or a fraction; the trainer weights
                                       both with the batch mask. `batch['index']` int [B] and
                                       the step's `key` key each example's random draws
    accepts_model_init                 whether a run may start from a pretrained checkpoint
    teacher                            (distill only) the frozen model; its parameters are a
                                       step argument (`teacher_params`), never trained or saved

  supervised  softmax or sigmoid cross-entropy on labels (`config.loss` 'softmax_xent' |
              'sigmoid_xent'), optionally label-smoothed (`config.label_smoothing`); top-1,
              or precision@1 for multi-label data
  distill     DeiT's hard-label distillation around `supervised` (`config.distill.teacher`,
              `config.model.distill_token`): a teacher's top class is a second label
  mpp         masked patch prediction (§4.6, `config.loss = 'mpp'`, `config.mpp`)
  segmentation  per-pixel softmax cross-entropy with an ignore label (`config.loss =
              'seg_softmax_xent'`, `config.segmentation`); `correct` is pixel accuracy
  detection   FCOS's focal, GIoU and centerness losses on boxes (`config.loss = 'fcos'`,
              `config.detection`); `correct` is the positives' class accuracy

This package must not import TensorFlow.
"""

from typing import Any, Protocol

import jax
import ml_collections


class Objective(Protocol):
  """The interface the trainer sees (see the module docstring)."""

  name: str
  accepts_model_init: bool

  def model(
    self, model_config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh | None
  ) -> Any: ...

  def per_example(
    self, model: Any, params: Any, batch: dict[str, jax.Array], key: jax.Array
  ) -> tuple[jax.Array, jax.Array]: ...


def get(
  config: ml_collections.ConfigDict, num_classes: int, mesh: jax.sharding.Mesh | None = None
) -> Objective:
  """The objective of a stage config: `config.loss`, with `config.mpp` for 'mpp'; distillation
  when `config.distill.teacher` is set (its teacher's modules are built for `mesh`)."""
  from vit_jax.objectives import detection, distill, mpp, segmentation, supervised  # noqa: PLC0415

  label_smoothing = float(config.get("label_smoothing", 0.0))
  if label_smoothing and config.loss in ("mpp", "seg_softmax_xent", "fcos"):
    raise ValueError(
      f"config.label_smoothing={label_smoothing} applies to the supervised losses "
      f"(softmax_xent, sigmoid_xent), not to config.loss={config.loss!r}; set it to 0"
    )
  distill_config = config.get("distill")
  if distill_config is not None and distill_config.teacher:
    return distill.get(config, num_classes, mesh)
  if config.model.get("distill_token"):
    raise ValueError(
      "model.distill_token=True without distill.teacher: the distillation head learns a "
      "teacher's labels; set --config.distill.teacher=<checkpoint>"
    )
  if config.loss == "mpp":
    return mpp.MaskedPatchPrediction(config.mpp)
  if config.loss == "seg_softmax_xent":
    return segmentation.Segmentation(num_classes, config.segmentation)
  if config.loss == "fcos":
    return detection.Detection(num_classes, config.detection)
  return supervised.Supervised(
    config.loss,
    num_classes,
    multi_label=bool(config.dataset.get("multi_label", False)),
    label_smoothing=label_smoothing,
  )
