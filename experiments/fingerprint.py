"""Whether a committed results file is one that today's code would write.

An experiment's full run, when it writes the committed copy of its results
(experiments/results/<name>/), also runs its `--quick` profile and keeps that run's numbers in
results.json under `fingerprint`: the full results and the fingerprint come from the same code in
the same run. The test that runs `--quick` (tests/test_demo.py for the demo) compares the numbers
it gets today with them (`check`): a change of what the experiment computes (a preprocessing op,
an initialisation, a default of a config) moves them, and the test fails naming the command that
regenerates the results; a change that computes the same (a refactor) passes untouched.

The fingerprint has two parts, compared with the tolerance each needs:
- `inputs`: what the training stages' input pipelines give (`data`: the first training and
  evaluation batch of each, summed, squared and projected in float64). TensorFlow's CPU kernels
  are compiled into its wheel, the same instructions on every x86-64 machine, so these agree to
  float64 rounding anywhere, and any change of the data path (a split, a preprocessing op, the
  resize filter) moves them;
- the run's metrics: losses, accuracies, gradient norms. XLA:CPU, the C++ kernels and the pixel
  baselines' BLAS may round differently on another CPU class and training carries that along;
  `TOLERANCE` allows for it, and a change of the model, objective or optimizer of any
  consequence moves them further.
"""

import math
from typing import Any

# Keys (their last part) whose numbers are the machine's, not the code's: never compared; nor
# is any key that ends in "seconds".
_MACHINE = ("images_per_sec", "total")
# Counts: the same on every machine, compared exactly.
_COUNTS = (
  "step", "steps", "examples", "num_examples", "train_examples", "test_examples", "batch_size",
  "finetune_test_examples", "probe_train_examples", "skipped_examples_this_host",
)  # fmt: skip

TOLERANCE = dict(
  # The inputs' sums: float64 rounding of the same float32 batches.
  inputs=1e-9,
  # An accuracy, a fraction of the (200) test images: 3 images may flip between CPU classes.
  accuracy=0.015,
  # Anything else (losses, gradient norms, learning rates): relative.
  relative=1e-3,
)
# Measured on one 2-core AMD EPYC (AVX-512), the demo's --quick profile: XLA capped at AVX2
# (`--xla_cpu_max_isa=AVX2`) with the C++ kernels built for `-march=x86-64-v3` computed every
# number bitwise equal to the AVX-512 run, so the bounds above are a margin for machines not
# seen, not a measured spread; the resize filter of before a8be51a (antialiased when
# enlarging: 0.5% of pixels one level apart) moved the pretraining loss by 5.5e-6, its gradient
# norm by 5.0e-4, two few-shot accuracies by 0.5 and 1 point: below the bounds of the metrics,
# so it is the inputs' part that catches such a change.


def _machine(key: str) -> bool:
  return key in _MACHINE or key.endswith("seconds")


def numbers(results: dict[str, Any]) -> dict[str, float]:
  """The experiment's numbers, flattened to 'a/b/c' keys: every int, float and bool of `results`
  but the machine's own (wall times, throughput) and its provenance."""
  flat: dict[str, float] = {}

  def walk(value, path):
    if isinstance(value, dict):
      for key, item in value.items():
        if path or key not in ("provenance", "fingerprint", "seconds", "quick", "configs"):
          walk(item, [*path, str(key)])
    elif isinstance(value, bool | int | float) and not _machine(path[-1]):
      flat["/".join(path)] = float(value)

  walk(results, [])
  return flat


def _config(stage):
  """A stage's config: built from its flags (a list), or the config itself."""
  from vit_jax.runtime import config_files

  return config_files.from_flags(stage) if isinstance(stage, list) else stage


def data(stage) -> dict[str, float]:
  """The input of a training stage (its flags, or its config): for its first training batch
  (the config's batch size and seed) and its first evaluation batch, the float64 sum and sum
  of squares of the images, their projection on a fixed random direction, and the sums of the
  labels and the mask (weighted by position, so that an order change shows)."""
  import numpy as np

  from vit_jax import input_pipeline

  config = _config(stage)
  one_host = dict(process_index=0, process_count=1)
  train = input_pipeline.make_train_iterator(
    config.dataset, global_batch_size=config.batch_size, seed=config.seed, **one_host
  )
  try:
    batches = dict(train=next(train))
  finally:
    train.close()
  evaluation = input_pipeline.make_eval_iterator(
    config.dataset, global_batch_size=config.eval_batch_size, **one_host
  )
  batches["eval"] = next(iter(evaluation))
  out = {}
  for split, batch in batches.items():
    image = np.asarray(batch["image"], np.float64)
    direction = np.random.default_rng(0).standard_normal(image.shape)
    position = np.arange(1, len(image) + 1)
    out |= {
      f"{split}/image_sum": image.sum(),
      f"{split}/image_sumsq": np.square(image).sum(),
      f"{split}/image_projection": (image * direction).sum(),
      f"{split}/label_sum": float(
        np.sum(np.asarray(batch["label"]).reshape(len(image), -1).T * position)
      ),
      f"{split}/mask_sum": float(np.sum(np.asarray(batch["mask"]) * position)),
    }
  return out


def configs(stages: dict[str, Any]) -> dict[str, Any]:
  """Each stage's config as its flags (or the experiment's code) build it today, flattened to
  'stage/field': value.

  The --quick profile overrides budgets (steps, batch, splits), so a change of a default it
  overrides (the demo's `total_steps`) would not move its numbers; the full profile's configs,
  kept in results.json as `configs` and compared exactly (`check_configs`), catch it.
  """
  import json

  from vit_jax.runtime import workdir

  out = {}
  for stage, args in stages.items():
    config = json.loads(_config(args).to_json_best_effort())
    out |= {f"{stage}/{k}": v for k, v in workdir.flatten(config).items()}
  return out


def check_configs(committed_results: dict[str, Any], today: dict[str, Any], command: str) -> None:
  """Raises AssertionError, naming `command`, where the full profile's configs built today are not
  the ones the committed results were made with. A field added since, at the value that changes
  nothing (vit_jax.runtime.workdir.ADDED_FIELDS, what a resume allows too), is no difference."""
  from vit_jax.runtime import workdir

  committed = committed_results.get("configs")
  if committed is None:
    raise AssertionError(f"the committed results keep no configs: regenerate them ({command})")

  def added(key: str) -> bool:
    field = key.rsplit("/", 1)[-1]
    neutral = workdir.ADDED_FIELDS.get(field, "<none>")
    return key not in committed and key in today and today[key] == neutral

  lines = [
    f"{key}: committed {committed.get(key, '<absent>')!r}, today {today.get(key, '<absent>')!r}"
    for key in sorted(committed.keys() | today.keys())
    if committed.get(key, "<absent>") != today.get(key, "<absent>") and not added(key)
  ]
  if lines:
    raise AssertionError(
      "the committed results were made with other configs than today's code builds for the "
      f"full run: regenerate them with `{command}` on a quiet machine.\n  " + "\n  ".join(lines)
    )


def attach(results: dict[str, Any], quick_results: dict[str, Any], full_stages: dict) -> None:
  """What a full run that writes the committed results keeps beside its numbers: the --quick
  profile's numbers, computed by the same code in the same process, as `fingerprint` (their
  seconds as seconds/fingerprint), and the full profile's stages' configs as `configs`.
  `full_stages` are built with the experiment's default workdir, so that the paths in them
  compare."""
  results["fingerprint"] = numbers(quick_results)
  results["seconds"]["fingerprint"] = quick_results["seconds"]["total"]
  results["configs"] = configs(full_stages)


def kind(key: str) -> str:
  """'count' (compared exactly), 'inputs', 'accuracy' (absolute) or 'relative' (TOLERANCE):
  how `key` is compared."""
  last = key.split("/")[-1]
  if key.startswith("inputs/"):
    return "inputs"
  if last in _COUNTS:
    return "count"
  if last.endswith("loss") or last in ("grad_norm", "learning_rate"):
    return "relative"
  return "accuracy"


def differences(committed: dict[str, float], today: dict[str, float]) -> list[str]:
  """One line per number of `today` that its committed value does not match (within
  TOLERANCE), or that only one of the two has."""
  lines = []
  for key in sorted(committed.keys() | today.keys()):
    if key not in committed or key not in today:
      where = "today's run" if key in today else "the committed fingerprint"
      lines.append(f"{key}: only in {where}")
      continue
    a, b = committed[key], today[key]
    how = kind(key)
    if how == "count":
      same = a == b
    elif how == "accuracy":
      same = abs(a - b) <= TOLERANCE["accuracy"]
    else:
      same = math.isclose(a, b, rel_tol=TOLERANCE[how], abs_tol=1e-12)
    if not same:
      lines.append(f"{key}: committed {a:.6g}, today {b:.6g}")
  return lines


def check(committed_results: dict[str, Any], quick_results: dict[str, Any], command: str) -> None:
  """Raises AssertionError, naming `command`, where today's quick numbers are not the committed
  results' fingerprint."""
  committed = committed_results.get("fingerprint")
  if committed is None:
    raise AssertionError(f"the committed results have no fingerprint: regenerate them ({command})")
  lines = differences(committed, numbers(quick_results))
  if lines:
    raise AssertionError(
      "the committed results are not what today's code computes (their fingerprint, the --quick "
      f"profile's numbers, moved): regenerate them with `{command}` on a quiet machine and "
      "commit them with the docs figures they back.\n  " + "\n  ".join(lines)
    )
