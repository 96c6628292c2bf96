"""What a stage keeps in its workdir besides checkpoints: `config.json`, `final_metrics.json`, and
atomic JSON writes.

Before anything is restored or written, the config is compared with the saved `config.json`; a
difference outside `RESUMABLE_FIELDS` stops the run with one line naming the fields, and nothing
in the workdir is touched. `config.json` is written only after the state was restored or
initialised, through a temporary file and a rename. A `config.json` that is not a JSON object
is refused in one line when there are checkpoints it should guard (it is the one record of what
they were trained with, so it is neither set aside nor overwritten); without checkpoints it is
rewritten.

`final_metrics.json` says a stage finished (vit_jax.tools.transfer reads it to skip finished
runs). One that is not an object of numbers is set aside with a warning and the stage counts as
unfinished: its rerun resumes from its last checkpoint and writes it again.

The lock's names (`lock.json`) are given here too (vit_jax.runtime.workdir_lock).

This file must not import TensorFlow.
"""

import json
import re
import uuid
from collections.abc import Mapping
from typing import Any

import jax
import ml_collections
from absl import logging
from etils import epath

from vit_jax.runtime import json_file
from vit_jax.runtime.workdir_lock import LOCK_FILE, WorkdirLocked, break_lock, lock  # noqa: F401

CONFIG_FILE = "config.json"
# The last value of every metric a finished stage logged (process 0 writes it).
FINAL_METRICS_FILE = "final_metrics.json"

# Fields (dotted paths, regular expressions matched in full) that may change when a run is
# resumed: how long it runs, how often it logs, evaluates and saves (the local checkpoint tier
# included), evaluator settings, profiling, the mesh (checkpoints restore onto any mesh) and
# gradient accumulation (the same trajectory, see vit_jax.train), where the data lives and how
# it is read (the limits on bad data too: a run they stopped continues with them raised), and
# rematerialisation (same parameters and numbers). Everything else is part of what was trained.
RESUMABLE_FIELDS = (
  r"total_steps",
  r"log_every_steps",
  r"accum_steps",
  r"eval_batch_size",
  r"evals(\..*)?",
  r"checkpoint\.(every_steps|keep|asynchronous|local\..*)",
  r"profile\..*",
  r"mesh\..*",
  r"model_init",
  r"init_from_scratch",
  r"dataset\.(data_dir|num_threads|prefetch|max_skipped_fraction|max_image_pixels)",
  r"model\.remat",
)

# Fields added to the configs after runs were started without them, each with the value that
# computes what the run computed before it existed: a workdir whose config.json lacks one resumes
# when the field has that value now (e.g. a run started before label smoothing existed, resumed
# with it off), and refuses otherwise, like any change.
ADDED_FIELDS: dict[str, Any] = {
  "label_smoothing": 0.0,
  "dataset.cutmix_alpha": 0.0,
  "model.posemb": "learn",
  "model.stochastic_depth": 0.0,
  "model.distill_token": False,
  "distill.teacher": "",
  "distill.teacher_model": "",
  "distill.weight": 0.5,
  "model.window_size": 0,
  "model.global_blocks": [],
  "dataset.max_boxes": 100,
}


def write_json(path: str | epath.PathLike, value: Any) -> None:
  """Writes `value` as JSON to `path` atomically (a temporary file renamed over the target)."""
  path = epath.Path(path)
  tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
  text = value if isinstance(value, str) else json.dumps(value, indent=2, sort_keys=True)
  tmp.write_text(text)
  tmp.replace(path)


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
  """A nested mapping as {"a.b.c": leaf} (a config's fields by their dotted names)."""
  if isinstance(tree, Mapping):
    out = {}
    for key, value in tree.items():
      out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out
  return {prefix: tree}


def _comparable(config: ml_collections.ConfigDict | Mapping[str, Any]) -> dict[str, Any]:
  """A config as the flat JSON values `config.json` holds (tuples become lists, ...)."""
  if isinstance(config, ml_collections.ConfigDict):
    config = json.loads(config.to_json_best_effort())
  return flatten(config)


def differences(saved: Mapping[str, Any], config: ml_collections.ConfigDict) -> list[str]:
  """'field: saved -> now' for each field that differs and may not change on resume."""
  old, new = _comparable(saved), _comparable(config)
  allowed = re.compile("|".join(f"(?:{p})" for p in RESUMABLE_FIELDS))
  out = []
  for key in sorted(set(old) | set(new)):
    if allowed.fullmatch(key) or old.get(key, "<absent>") == new.get(key, "<absent>"):
      continue
    if key not in old and key in ADDED_FIELDS and new[key] == ADDED_FIELDS[key]:
      continue  # a field added since the run started, at the value that changes nothing
    out.append(f"{key}: {old.get(key, '<absent>')!r} -> {new.get(key, '<absent>')!r}")
  return out


def read_config(directory: str | epath.PathLike) -> dict[str, Any] | None:
  """The stage config saved in `directory` (its `config.json`) as a mapping; None without one.

  Raises:
    json_file.InvalidFile: the file is not a JSON object (one line naming it and why).
  """
  return json_file.read(epath.Path(directory) / CONFIG_FILE, dict)


def check_config(workdir: str, config: ml_collections.ConfigDict) -> None:
  """Refuses to resume `workdir` with a config that differs from the saved one.

  Raises:
    ValueError: one line naming the workdir and the differing fields.
    json_file.InvalidFile: (a ValueError) the saved config is not one: one line naming the file
      and what to do.
  """
  path = epath.Path(workdir) / CONFIG_FILE
  try:
    saved = read_config(workdir)
  except json_file.InvalidFile as e:
    raise json_file.InvalidFile(
      path,
      f"{e.why}; it should hold the config this workdir's checkpoints were trained with, "
      "which a resume is checked against. Put that run's config.json back, or use a new "
      "--workdir (or remove the file to resume without the check)",
    ) from None
  if saved is None:
    return
  diff = differences(saved, config)
  if diff:
    shown = "; ".join(diff[:6]) + (f"; and {len(diff) - 6} more" if len(diff) > 6 else "")
    raise ValueError(
      f"{workdir} holds a run with another config: {shown}. Use a new --workdir, or the "
      f"saved settings ({path}); what may change on resume: vit_jax.runtime.workdir.RESUMABLE_FIELDS"
    )


def save_config(workdir: str, config: ml_collections.ConfigDict) -> None:
  """Writes `config` as the workdir's `config.json` (atomically)."""
  write_json(epath.Path(workdir) / CONFIG_FILE, config.to_json_best_effort(indent=2))


def read_final_metrics(workdir: str) -> dict[str, float] | None:
  """The finished stage's last metrics, or None: not finished, or its file is not one (set
  aside by process 0, see the module docstring; every process then reads None)."""
  path = epath.Path(workdir) / FINAL_METRICS_FILE
  try:
    return json_file.read(path, {"*": json_file.NUMBER})
  except json_file.InvalidFile as e:
    if jax.process_index() == 0:
      try:
        json_file.set_aside(path, e.why, then="the stage counts as unfinished and runs again")
      except OSError as error:
        logging.warning("%s: %s, and cannot be set aside (%s)", path, e.why, error)
    return None


def save_final_metrics(workdir: str, metrics: dict[str, Any]) -> None:
  """Writes the finished stage's last metrics, atomically, as `final_metrics.json`."""
  values = {k: float(v) for k, v in metrics.items() if isinstance(v, int | float)}
  write_json(epath.Path(workdir) / FINAL_METRICS_FILE, values)
