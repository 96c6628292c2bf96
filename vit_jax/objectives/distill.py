"""DeiT's hard-label distillation (Touvron et al., 2021, §5) around the supervised objective.

Chosen by `config.distill.teacher` (configs/common.py `distill_config`; `objectives.get`). The
teacher is any checkpoint vit_jax.checkpoint reads (an Orbax workdir or step directory of this
trainer, e.g. a BiT ResNet, or an `.npz`), with the architecture saved beside it, or the preset
`config.distill.teacher_model`; its position embeddings are fitted to the stage's image size.
Inside the step it runs in eval mode (`train=False`, no dropout) on the student's images, the
augmented and mixed ones, and its top class is the hard label y_t. An example's loss is

    (1 - w) · CE(z_cls, y) + w · CE(z_dist, y_t),     w = `config.distill.weight`,

where z_cls and z_dist are the student's two heads when it has DeiT's distillation token
(`config.model.distill_token`, vit_jax.models.vit), and both the class head otherwise. The first
term is the wrapped supervised objective's loss (`config.loss` on the labels, one-hot or mixed);
the second the same loss on the one-hot y_t, as DeiT's hard distillation. `correct` is top-1
(against the label) of what the student predicts at inference: the average of its two heads.

The teacher's parameters are an argument of the jitted step (`teacher_params`), sharded as the
student's, never a constant of the compiled program, trained or saved: a resumed run reloads them
from `config.distill.teacher`.

This file must not import TensorFlow.
"""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
from etils import epath

from vit_jax import models
from vit_jax.objectives import supervised


@dataclasses.dataclass(frozen=True)
class Teacher:
  """A frozen classifier: its Flax module and its parameters (host numpy arrays)."""

  path: str
  model: Any
  params: Any
  num_classes: int

  def hard_labels(self, params: Any, images: jax.Array) -> jax.Array:
    """int32 [batch]: the teacher's top class for each image [batch, height, width, 3]."""
    logits, _ = self.model.apply({"params": params}, images, train=False)
    return jnp.argmax(jax.lax.stop_gradient(logits), axis=-1).astype(jnp.int32)


def load_teacher(
  config: ml_collections.ConfigDict,
  num_classes: int,
  image_size: int | tuple[int, int],
  mesh: jax.sharding.Mesh | None = None,
) -> Teacher:
  """The teacher of `config.distill` for a dataset of `num_classes` classes at `image_size`.

  Raises:
    ValueError: one line naming `distill.teacher` (missing path, no head, other classes).
  """
  from vit_jax import checkpoint  # noqa: PLC0415 (the objectives import no checkpoint code)

  path = str(config.distill.teacher)
  if not epath.Path(path).exists():
    raise ValueError(f"distill.teacher={path!r}: no such file or directory")
  name = str(config.distill.get("teacher_model", ""))
  loaded = checkpoint.load_model(path, models.get_model_config(name) if name else None)
  classes = loaded.model.num_classes
  if classes is None:
    raise ValueError(f"distill.teacher={path!r} has no classification head to take labels from")
  if classes != num_classes:
    raise ValueError(
      f"distill.teacher={path!r} predicts {classes} classes but the dataset has {num_classes}"
    )
  model = models.get_model(loaded.model_config, classes, mesh=mesh)
  params = checkpoint.fit_posemb(loaded.params, model, loaded.model_config, image_size)
  _check_fit(path, name, model, params, image_size)
  return Teacher(path=path, model=model, params=params, num_classes=classes)


def _check_fit(path: str, name: str, model: Any, params: Any, image_size: tuple[int, int]):
  """One line naming the first parameter of the checkpoint that the teacher's architecture
  (a `teacher_model` preset, or the checkpoint's own) does not have, or has in another shape."""
  from vit_jax import checkpoint  # noqa: PLC0415

  images = jnp.zeros((1, *image_size, 3), jnp.float32)
  shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), images, train=False)["params"])
  want = {k: tuple(v.shape) for k, v in checkpoint.flatten_params(shapes).items()}
  got = {k: tuple(jnp.shape(v)) for k, v in checkpoint.flatten_params(params).items()}
  what = f"teacher_model={name!r}" if name else "its architecture"
  for key in sorted(set(want) | set(got)):
    if want.get(key) != got.get(key):
      there = got.get(key, "missing")
      raise ValueError(
        f"distill.teacher={path!r} does not fit {what}: {key!r} is {there} there, "
        f"{want.get(key, 'absent')} in the model"
      )


@dataclasses.dataclass(frozen=True)
class Distill:
  """`student` (the supervised objective) taught by `teacher` with weight `weight`."""

  student: supervised.Supervised
  teacher: Teacher
  weight: float
  name: str = "distill"
  accepts_model_init: bool = True

  def __post_init__(self):
    if not 0.0 <= self.weight <= 1.0:
      raise ValueError(f"distill.weight={self.weight}; expected a number in [0, 1]")

  def model(self, model_config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh | None):
    return self.student.model(model_config, mesh)

  def per_example(
    self, model: Any, params: Any, batch: dict[str, jax.Array], key: jax.Array, teacher_params: Any
  ) -> tuple[jax.Array, jax.Array]:
    """(loss [B], correct [B]); `teacher_params` is the step's argument (see the module)."""
    logits, out = supervised.forward(model, params, batch, key)
    cls_logits, dist_logits = out.get("class_logits", logits), out.get("dist_logits", logits)
    teacher_labels = self.teacher.hard_labels(teacher_params, batch["image"])
    return self.loss_and_correct(cls_logits, dist_logits, batch["label"], teacher_labels)

  def loss_and_correct(
    self,
    cls_logits: jax.Array,
    dist_logits: jax.Array,
    labels: jax.Array,
    teacher_labels: jax.Array,
  ) -> tuple[jax.Array, jax.Array]:
    """The loss of the module docstring and top-1 of the heads' average, per example, of the
    heads' logits [B, K] (one array twice without the token), labels int [B] or dense [B, K],
    and the teacher's top classes int [B]."""
    label_loss, _ = self.student.loss_and_correct(cls_logits, labels)
    teacher_targets = supervised.dense_targets(teacher_labels, self.student.num_classes)
    teacher_loss = supervised.LOSSES[self.student.loss](dist_logits, teacher_targets)
    w = self.weight
    _, correct = self.student.loss_and_correct((cls_logits + dist_logits) / 2, labels)
    return (1.0 - w) * label_loss + w * teacher_loss, correct


def get(
  config: ml_collections.ConfigDict, num_classes: int, mesh: jax.sharding.Mesh | None = None
) -> Distill:
  """The distillation objective of a stage config whose `distill.teacher` is set."""
  if config.loss not in supervised.LOSSES:
    raise ValueError(
      f"distill.teacher is set with loss={config.loss!r}: distillation needs a classification "
      f"loss, one of {tuple(supervised.LOSSES)}"
    )
  student = supervised.Supervised(
    config.loss,
    num_classes,
    multi_label=bool(config.dataset.get("multi_label", False)),
    label_smoothing=float(config.get("label_smoothing", 0.0)),
  )
  size = config.dataset.image_size
  image_size = (size, size) if isinstance(size, int) else tuple(size)
  teacher = load_teacher(config, num_classes, image_size, mesh)
  return Distill(student, teacher, float(config.distill.weight))
