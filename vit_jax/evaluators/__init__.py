"""Evaluators the trainer runs periodically, and the probes of the linear-probe stage.

An evaluator has `name`, `every_steps` (0: only after the last step) and `run(params) -> dict`
of metrics named `{name}/...`. Kinds (`REGISTRY`), one module each:
- `classification`: top-1 and loss of the logits (`{name}/accuracy|loss|num_examples`).
- `real`: ImageNet ReaL top-1; images with no ReaL label do not count.
- `fewshot`: the paper's k-shot closed-form least squares on the frozen representation
  (`{name}/{k}shot`).
- `linear`: ridge and L-BFGS logistic regression on a whole training split's representation.
- `segmentation`: mean IoU and pixel accuracy, overall and per class.
- `detection`: COCO box AP (pycocotools' COCOeval) of the model's `detections`
  (`{name}/AP|AP50|AP75|APs|APm|APl`), and the conversions to COCO's boxes and result dicts.
`baselines` is not an evaluator of a model: raw-pixel logistic regression and kNN-3.

`build` makes them from `config.evals`, e.g.
`dict(val=dict(type='classification', every_steps=500, split='test'))`. Fields of an entry:
`type`; `every_steps` (negative: not built, its data never read); `dataset` (overrides of
`input_pipeline.dataset_config`, default the stage's; see `downstream_dataset`); `split`
(classification, real, segmentation, detection; '' or None: the dataset's `eval_split`),
`train_split` / `test_split` (fewshot, linear); `batch_size`; `skip_if_missing`; every other
field goes to the evaluator's constructor. Data that is not there stops the run at startup
(docs/data.md).

Each class declares the model output it reads (`reads`: 'logits' or an `out` key of
vit_jax.models), the entry fields naming its splits (`splits`) and what it needs of the
dataset (`needs`). Data is read lazily with `input_pipeline.make_eval_iterator`, so this
package imports without TensorFlow; `_utils` holds what the evaluators share.
"""

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
from absl import logging

from vit_jax.evaluators._utils import ArrayFn, DataSource
from vit_jax.evaluators.classification import ClassificationEvaluator
from vit_jax.evaluators.detection import DetectionEvaluator
from vit_jax.evaluators.fewshot import FewShotEvaluator
from vit_jax.evaluators.linear import LinearProbeEvaluator
from vit_jax.evaluators.real import RealEvaluator
from vit_jax.evaluators.segmentation import SegmentationEvaluator


class Evaluator(Protocol):
  name: str
  every_steps: int

  def run(self, params: Any) -> dict[str, float]: ...


REGISTRY = {
  "classification": ClassificationEvaluator,
  "detection": DetectionEvaluator,
  "fewshot": FewShotEvaluator,
  "linear": LinearProbeEvaluator,
  "real": RealEvaluator,
  "segmentation": SegmentationEvaluator,
}

# make_data(dataset_config_overrides, split (None: the dataset's eval_split), global_batch_size)
DataFactory = Callable[[Mapping[str, Any], str | None, int], DataSource]


def output_fn(model: nn.Module, key: str = "logits") -> ArrayFn:
  """Jitted fn(params, images [B, H, W, 3]) -> the model's `key` output: 'logits' or an `out`
  entry (vit_jax.models), e.g. 'pre_logits' [B, R]; under jit nothing else is computed."""

  def fn(params, images):
    logits, out = model.apply({"params": params}, images, train=False)
    return logits if key == "logits" else out[key]

  return jax.jit(fn)


def predict_fn(model: nn.Module) -> ArrayFn:
  """Jitted fn(params, images [B, H, W, 3]) -> logits [B, K] in float32."""
  return output_fn(model, "logits")


def representation_fn(model: nn.Module, representation: str = "pre_logits") -> ArrayFn:
  """Jitted fn(params, images [B, H, W, 3]) -> representation [B, R] in float32.

  `representation`: 'pre_logits' or 'pooled' is the model's own representation (which of the two
  is the model's choice: `checkpoint.representation_model`); 'blocks' is the spatial mean of
  every block's output map, concatenated in block order (R = the blocks' widths summed: depth x
  hidden size for a ViT): the intermediate features iGPT and MAE probe, which keep what the last
  block's pooled token has specialised away.
  """
  if representation != "blocks":
    return output_fn(model, "pre_logits")

  def blocks_fn(params, images):
    _, out = model.apply({"params": params}, images, train=False)
    return jnp.concatenate([m.mean(axis=(1, 2)) for m in out["blocks"]], axis=-1)

  return jax.jit(blocks_fn)


def input_pipeline_data(mesh: Any = None, data_axes: Any = None) -> DataFactory:
  """The default DataFactory: `input_pipeline.make_eval_iterator` on the given mesh."""

  def make(dataset: Mapping[str, Any], split: str | None, batch_size: int) -> DataSource:
    from vit_jax import input_pipeline  # TensorFlow only when data is read

    cfg = input_pipeline.dataset_config(**dict(dataset))
    kwargs = {} if data_axes is None else {"data_axes": data_axes}
    iterable = None

    # Opened now, not at the first evaluation: a split that is not there stops the run at startup.
    input_pipeline.check_readable(cfg, split or cfg.eval_split)

    def source():
      nonlocal iterable
      if iterable is None:  # built on first use, then re-iterated (one tf.data graph)
        iterable = input_pipeline.make_eval_iterator(
          cfg, split=split, global_batch_size=batch_size, mesh=mesh, **kwargs
        )
      return iterable

    return source

  return make


def num_classes_of(dataset: Mapping[str, Any]) -> int:
  """num_classes of a dataset config (overrides of `input_pipeline.dataset_config`)."""
  from vit_jax import input_pipeline

  return input_pipeline.get_dataset_info(input_pipeline.dataset_config(**dict(dataset))).num_classes


def _class_names_of(dataset: Mapping[str, Any]) -> list[str] | None:
  from vit_jax import input_pipeline

  cfg = input_pipeline.dataset_config(**dict(dataset))
  return input_pipeline.get_dataset_info(cfg).class_names


def downstream_dataset(stage: Any, entry: Any) -> dict[str, Any]:
  """The stage's dataset config overridden by the entry's; an entry naming another dataset
  never reads the stage's `data_dir`, only its own (None: tfds's default)."""
  stage, entry = _as_dict(stage), _as_dict(entry)
  if entry.get("name", stage.get("name")) != stage.get("name"):
    stage.pop("data_dir", None)
  return {**stage, **entry}


def _as_dict(x: Any) -> dict[str, Any]:
  if x is None:
    return {}
  if isinstance(x, ml_collections.ConfigDict):
    return x.to_dict()
  return dict(x)


def build(
  evals: Mapping[str, Any] | ml_collections.ConfigDict | None,
  *,
  model: nn.Module,
  dataset: Mapping[str, Any] | ml_collections.ConfigDict | None = None,
  batch_size: int = 256,
  mesh: Any = None,
  data_axes: Any = None,
  make_data: DataFactory | None = None,
  num_classes: Callable[[Mapping[str, Any]], int] | None = None,
) -> list[Evaluator]:
  """The evaluators of `config.evals` (name -> entry, see the module docstring), in its order.

  `dataset` is every entry's default, `batch_size` the default global batch; batches are global
  arrays on `mesh`, split over `data_axes`. `make_data` and `num_classes` override how splits
  are read and classes counted (tests pass in-memory data).
  """
  make_data = make_data or input_pipeline_data(mesh, data_axes)
  context = dict(num_classes=num_classes or num_classes_of, class_names=_class_names_of)
  if mesh is not None:
    spec = jax.sharding.PartitionSpec(data_axes if data_axes is not None else mesh.axis_names)
    context["sharding"] = lambda ds: jax.sharding.NamedSharding(mesh, spec)
  fns = {}  # one jitted function per model output read
  out, missing = [], []
  for name, entry in _as_dict(evals).items():
    kwargs = _as_dict(entry)
    kind = kwargs.pop("type", None)
    if kind not in REGISTRY:
      raise ValueError(f"evals.{name}.type={kind!r}; expected one of {sorted(REGISTRY)}")
    skip_if_missing = kwargs.pop("skip_if_missing", False)
    if int(kwargs.get("every_steps", 0)) < 0:
      continue
    ds = downstream_dataset(dataset, kwargs.pop("dataset", None))
    bs = kwargs.pop("batch_size", None) or batch_size
    kwargs.setdefault("name", name)
    cls = REGISTRY[kind]
    try:
      if cls.reads not in fns:
        fns[cls.reads] = output_fn(model, cls.reads)
      # Each split field's default: the dataset's own (`train_split`; None: its `eval_split`).
      for arg, field in cls.splits.items():
        split = kwargs.pop(field, None) or (
          ds.get(field, "train") if field == "train_split" else None
        )
        kwargs[arg] = make_data(ds, split, bs)
      for arg in cls.needs:
        if arg in context and kwargs.get(arg) is None:
          kwargs[arg] = context[arg](ds)
      out.append(cls(fns[cls.reads], **kwargs))
    except ValueError as e:
      from vit_jax.input_pipeline import MissingDataError  # TensorFlow: data was read

      if not isinstance(e, MissingDataError):
        raise
      reason = str(e).strip().splitlines()[0].rstrip(".")
      downstream = ds.get("name") != _as_dict(dataset).get("name")
      if skip_if_missing and downstream:
        logging.warning("runlocal: evals.%s left out, its data is not there: %s", name, reason)
      else:
        missing.append((name, reason, downstream))
  if missing:
    raise _missing_data_error(missing)
  return out


def _missing_data_error(missing: list[tuple[str, str, bool]]) -> Exception:
  """One line for the evaluators (name, reason, downstream) whose data is not there, and the
  ways out: a downstream set's own data_dir, the stage's split, or switching the evaluator off."""
  from vit_jax.input_pipeline import MissingDataError

  def ways_out(name: str, downstream: bool) -> str:
    where = (
      f"--config.evals.{name}.dataset.data_dir=<dir>"
      if downstream
      else ("--config.dataset.eval_split / data_dir")
    )
    return f"give it its data ({where}) or switch it off (--config.evals.{name}.every_steps=-1)"

  (first, reason, downstream), others = missing[0], [f"evals.{m[0]}" for m in missing[1:]]
  also = f" (so have {', '.join(others)})" if others else ""
  return MissingDataError(
    f"evals.{first} has no data{also}: {reason}; {ways_out(first, downstream)}"
  )


__all__ = [
  "REGISTRY",
  "ClassificationEvaluator",
  "DataSource",
  "DetectionEvaluator",
  "Evaluator",
  "FewShotEvaluator",
  "LinearProbeEvaluator",
  "RealEvaluator",
  "SegmentationEvaluator",
  "build",
  "downstream_dataset",
  "output_fn",
  "predict_fn",
  "representation_fn",
]
