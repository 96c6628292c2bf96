"""Pieces shared by the stage configs: the argument syntax, `runlocal`, and common blocks.

Config argument syntax. A config file is selected with one string, `path:arg`, where `arg` is a
comma-separated list of `key=value` pairs and bare `key`s (booleans set to True):

    configs/finetune.py:dataset=cifar10,model=B/16
    configs/pretrain.py:dataset=imagenet21k,model=L/16,loss=softmax,runlocal

Each config declares its keys with their defaults (`parse_arg(arg, dataset='cifar10', ...)`);
values are converted to the default's type, an unknown key is an error. After selection, any
field is overridden on the command line with `--config.<field>=<value>`; the configs are locked
(config_flags does it), so a misspelt field is an error too.

`runlocal` shrinks any config (model 'testing', 16px images, batch 16, 6 steps, tiny evals) so
2 CPU cores run it in seconds, without changing what code it exercises; a run given a
`model_init` keeps that checkpoint's architecture instead of 'testing'.

Used by configs/pretrain.py, configs/finetune.py and configs/linear_probe.py; the functions and
their signatures are a stable interface between them.
"""

import difflib
from typing import Any

import ml_collections

from vit_jax import models
from vit_jax.train import optim


def did_you_mean(value: str, known: Any) -> str:
  """'; did you mean 'x'?' for the closest of `known` to `value`, or ''."""
  close = difflib.get_close_matches(str(value), [str(k) for k in known], n=1)
  return f"; did you mean {close[0]!r}?" if close else ""


def check_choice(config: str, key: str, value: str, known: Any) -> None:
  """Raises ValueError naming `config`'s argument `key`=`value` unless it is one of `known`."""
  if value not in known:
    raise ValueError(
      f"{config} {key}={value!r} is not one of {sorted(known)}{did_you_mean(value, known)}"
    )


def parse_arg(arg: str | None, **defaults: Any) -> ml_collections.ConfigDict:
  """Parses 'key=value,flag,...' against typed defaults.

  Args:
    arg: the part after ':' of `--config=configs/x.py:<arg>`; None or '' gives the defaults.
    **defaults: every accepted key with its default; the default's type (bool, int, float, str)
      is the key's type. A bare `key` sets a bool to True.

  Returns:
    A locked-shape ConfigDict with one field per key.

  Raises:
    ValueError: unknown key, bare non-bool key, or a value of the wrong type.
  """
  values = dict(defaults)
  for item in filter(None, (s.strip() for s in (arg or "").split(","))):
    key, has_value, value = item.partition("=")
    key = key.strip()
    if key not in defaults:
      raise ValueError(
        f"unknown config argument {key!r}{did_you_mean(key, defaults)} (known: "
        f"{', '.join(sorted(defaults))})"
      )
    default = defaults[key]
    if not has_value:
      if not isinstance(default, bool):
        raise ValueError(f"config argument {key!r} needs a value ({key}=...)")
      values[key] = True
    elif isinstance(default, bool):
      if value.lower() not in ("true", "false", "1", "0"):
        raise ValueError(f"config argument {key}={value!r} is not a bool")
      values[key] = value.lower() in ("true", "1")
    elif isinstance(default, int):
      values[key] = int(value)
    elif isinstance(default, float):
      values[key] = float(value)
    else:
      values[key] = value
  return ml_collections.ConfigDict(values)


def model_config(name: str, **overrides: Any) -> ml_collections.ConfigDict:
  """The preset `name` of vit_jax.models (e.g. 'B/16'), with training-time overrides.

  Args:
    name: preset name or alias.
    **overrides: e.g. dropout_rate, dtype, remat, scan, representation_size, head_bias_init.
  """
  config = models.get_model_config(name)
  for key, value in overrides.items():
    if key not in config:
      raise KeyError(f"model field {key!r} does not exist; fields: {sorted(config)}")
    config[key] = value
  return config


def adam_config(weight_decay: float) -> ml_collections.ConfigDict:
  """Adam of the paper's pretraining (β1=0.9, β2=0.999), decoupled decay on `decay_patterns`;
  `mu_dtype` is the dtype of its first moment (float32; 'bfloat16' halves it, as big_vision's
  recipes keep it)."""
  return ml_collections.ConfigDict(
    dict(
      name="adam",
      b1=0.9,
      b2=0.999,
      mu_dtype="float32",
      weight_decay=weight_decay,
      decay_patterns=optim.DEFAULT_DECAY_PATTERNS,
    )
  )


def sgd_config(momentum: float = 0.9, weight_decay: float = 0.0) -> ml_collections.ConfigDict:
  """SGD with momentum of the paper's fine-tuning (no weight decay)."""
  return ml_collections.ConfigDict(
    dict(
      name="sgd",
      momentum=momentum,
      weight_decay=weight_decay,
      decay_patterns=optim.DEFAULT_DECAY_PATTERNS,
    )
  )


def fewshot_eval(
  config: ml_collections.ConfigDict,
  dataset: dict[str, Any],
  every_steps: int,
  shots: tuple[int, ...] = (1, 5, 10, 25),
) -> ml_collections.ConfigDict:
  """A few-shot evaluator entry on a downstream `dataset` (dataset_config fields).

  The images are resized to the stage's resolution: the entry's `image_size` is a reference to
  `config.dataset.image_size`, so `--config.dataset.image_size` and `runlocal` move it too.
  """
  entry = ml_collections.ConfigDict(
    dict(type="fewshot", every_steps=every_steps, dataset=dict(dataset), shots=shots)
  )
  entry.dataset.image_size = config.dataset.get_ref("image_size")
  return entry


def mesh_config(
  data: int = -1, fsdp: int = 1, model: int = 1, slices: int = 1, slice_axis: str = "data"
) -> ml_collections.ConfigDict:
  """The device mesh (vit_jax.sharding.make_mesh).

  Fields:
    data, fsdp, model: sizes of the mesh axes; one may be -1 (all remaining devices).
    slices: TPU slices the devices are in, joined by the data-centre network (Multislice).
    slice_axis: 'data' | 'fsdp', the axis whose outer factor (`slices`) crosses the slices;
      it must be a multiple of `slices`. The other axes stay inside one slice.
  """
  return ml_collections.ConfigDict(
    dict(data=data, fsdp=fsdp, model=model, slices=slices, slice_axis=slice_axis)
  )


def checkpoint_config(
  every_steps: int = 1000, keep: int = 3, asynchronous: bool = True
) -> ml_collections.ConfigDict:
  """Orbax checkpointing: save every N steps and at the end, keep the latest K, async writes.

  `local`: the local tier (vit_jax.checkpoint.state.local_tier), off while `local.dir` is '': each
  process also saves its own shards to `<local.dir>/process_<i>` (local SSD or /dev/shm) every
  `local.every_steps` steps or `local.every_minutes` minutes (0: not by that), keeping
  `local.keep` steps.
  """
  local = dict(dir="", every_steps=0, every_minutes=0.0, keep=2)
  return ml_collections.ConfigDict(
    dict(every_steps=every_steps, keep=keep, asynchronous=asynchronous, local=local)
  )


def profile_config() -> ml_collections.ConfigDict:
  """Traces of chosen steps (vit_jax.runtime.profiling): `num_steps` steps from `first_step`
  (0: none) on the processes `processes` ('0', '0,3' or 'all'); a request file in the workdir
  traces a running run."""
  return ml_collections.ConfigDict(dict(first_step=0, num_steps=3, processes="0"))


def distill_config() -> ml_collections.ConfigDict:
  """DeiT's hard-label distillation (vit_jax.objectives.distill), off while `teacher` is ''.

  Fields:
    teacher: '' or the teacher's checkpoint: anything the loader reads (an Orbax workdir or step
      directory, e.g. a BiT ResNet trained by this trainer, or an `.npz`). It runs in eval
      mode on the step's images; its top class is the hard label. Reloaded from here on resume.
    teacher_model: '' (the architecture saved with the checkpoint, else the one its parameter
      shapes imply) or a preset name for a checkpoint that carries no config.
    weight: w in (1 - w)·CE(class head, label) + w·CE(distillation head, teacher's label); the
      distillation head is `model.distill_token`'s, else both terms use the class head.
  """
  return ml_collections.ConfigDict(dict(teacher="", teacher_model="", weight=0.5))


def dataset_config(**overrides: Any) -> ml_collections.ConfigDict:
  """`vit_jax.input_pipeline.dataset_config(**overrides)` (the data layer owns the fields)."""
  from vit_jax import input_pipeline  # imports TensorFlow; configs are built once per run

  return input_pipeline.dataset_config(**overrides)


def training_config(stage: str) -> ml_collections.ConfigDict:
  """Fields every trained stage (pretrain, finetune, segment, detect) has; the stage config fills
  the values.

  Fields:
    stage: 'pretrain' | 'finetune' | 'segment' | 'detect' (vit_jax.main dispatches on it).
    seed: initialisation, data order and dropout; a rerun with the same seed is identical.
    model_init: '' or a checkpoint to start from (`.npz`, or an Orbax workdir / step dir).
    model_from_init: take the architecture from `model_init` (its saved config, else its
      parameter shapes) instead of `model`, keeping `model`'s dropout, dtype and whether it has a
      representation layer; `runlocal` sets it, so that a shrunk run still loads a real checkpoint.
    total_steps, batch_size (global), accum_steps (micro-batches per step).
    loss: 'softmax_xent' | 'sigmoid_xent' | 'mpp' (masked patch prediction, with `config.mpp`).
    label_smoothing: ε in [0, 1) of the supervised losses' training targets, (1 − ε)·t + ε/K
      for K classes, after mixup/cutmix (vit_jax.objectives.supervised); 0 (default) is off.
    optimizer, schedule, grad_clip_norm: see vit_jax.train.optim.
    ema_decay: 0 (off) or the decay of Polyak averaging of the parameters (vit_jax.train.ema); when on,
      the average is what the evaluators see and what the checkpoint exports.
    distill: see distill_config (off by default).
    mesh: see mesh_config; checkpoint: see checkpoint_config; profile: see profile_config.
    log_every_steps: metrics (and the non-finite-loss check) every N steps.
    evals, eval_batch_size: periodic evaluators (see vit_jax.evaluators).
  """
  config = ml_collections.ConfigDict()
  config.stage = stage
  config.seed = 0
  config.model_init = ""
  config.model_from_init = False
  config.total_steps = 10_000
  config.batch_size = 512
  config.accum_steps = 1
  config.loss = "softmax_xent"
  config.label_smoothing = 0.0
  config.grad_clip_norm = 1.0
  config.ema_decay = 0.0
  config.distill = distill_config()
  config.mesh = mesh_config()
  config.checkpoint = checkpoint_config()
  config.profile = profile_config()
  config.log_every_steps = 50
  config.eval_batch_size = 512
  config.evals = ml_collections.ConfigDict()
  return config


def runlocal(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Shrinks `config` in place (and returns it) to run in seconds on 2 CPU cores.

  Keeps the config's code paths (loss, optimizer kind, evaluator kinds, representation layer,
  dtype); only sizes change, and a downstream evaluator whose data is not on the machine is left
  out with a warning (`skip_if_missing`). Fields a config does not have are left alone, so this
  serves the linear-probe config as well.
  """
  if "model" in config:
    old = config.model
    # The family's smallest preset: BiT-R26x1 at 16px is as quick as the 'testing' ViT.
    new = models.get_model_config("R26x1" if models.is_bit(old) else "testing")
    for key in ("dropout_rate", "attention_dropout_rate", "classifier", "head_bias_init", "dtype"):
      if key in old:
        new[key] = old[key]
    if old.get("representation_size") is not None:
      new.representation_size = new.hidden_size
    config.model = new
    if "model_from_init" in config:
      # Given a model_init, the run keeps the checkpoint's architecture (vit_jax.train).
      config.model_from_init = True
  if "dataset" in config:
    for key, value in _RUNLOCAL_DATASET.items():
      if key in config.dataset:
        config.dataset[key] = value
  for key, value in dict(
    total_steps=6, batch_size=16, eval_batch_size=16, log_every_steps=2
  ).items():
    if key in config:
      config[key] = value
  if "accum_steps" in config:
    config.accum_steps = min(config.accum_steps, 2)
  if "schedule" in config:
    config.schedule.warmup_steps = 2
  if "checkpoint" in config:
    config.checkpoint.every_steps = 3
    config.checkpoint.keep = 2
  if "evals" in config:
    stage_dataset = config.dataset.get("name") if "dataset" in config else None
    for entry in config.evals.values():
      entry.every_steps = 3
      entry.update(_RUNLOCAL_EVAL.get(entry.get("type"), {}))
      # A downstream set not on this machine is left out with a warning (vit_jax.evaluators).
      if entry.get("dataset") and entry.dataset.get("name", stage_dataset) != stage_dataset:
        entry.skip_if_missing = True
  return config


# Sizes `runlocal` sets where a dataset config has the field, and per evaluator type.
_RUNLOCAL_DATASET = dict(image_size=16, shuffle_buffer=256)
_RUNLOCAL_EVAL = dict(
  classification=dict(max_examples=64),
  real=dict(max_examples=64),
  fewshot=dict(shots=(1, 2), max_examples=256),
  linear=dict(),
)
