"""The `--config` flag of the commands: which file a config path names, and bad overrides.

`--config=<path>:<arg>` names a config file whose `get_config(arg)` builds the config.
`configs/<stage>.py` (or the path of a shipped file itself) is a stage config shipped with the
package, from a checkout or from any directory once the package is installed, and is imported
as `vit_jax.configs.<stage>`, the one way shipped configs are imported everywhere. Any other file
is the user's own, loaded from its path; it builds on the shipped ones by importing them
(docs/training.md, "One entry point").

Every `--config.<field>=<value>` of the command line must name a field of the config (it is
locked): one that does not stops the command with one line naming the flag and the nearest
field.

This file must not import TensorFlow or JAX (the planner sets up JAX's environment first).
"""

import difflib
import importlib
import importlib.util
import os
import re
import sys
import traceback
import types

from absl import flags
from ml_collections import config_flags

from vit_jax import configs as shipped  # the package alone: its __init__ imports nothing

SHIPPED_DIR = os.path.dirname(os.path.realpath(shipped.__file__))
# Fields a user may look for under another name: the metric `learning_rate` is a schedule's.
ALIASES = {"learning_rate": "schedule.base_lr", "lr": "schedule.base_lr"}


class UnknownFieldError(flags.Error):
  """A `--config.<field>` override names no field of the config."""


def stage_names() -> list[str]:
  """The shipped stage configs: 'finetune', 'linear_probe', 'pretrain', ..."""
  return sorted(
    name[: -len(".py")]
    for name in os.listdir(SHIPPED_DIR)
    if name.endswith(".py") and name not in ("__init__.py", "common.py")
  )


def shipped_name(path: str) -> str | None:
  """The name of the shipped config `path` names (`configs/<name>.py` or its file), or None."""
  name, ext = os.path.splitext(os.path.basename(path))
  file = os.path.join(SHIPPED_DIR, f"{name}.py")
  if ext != ".py" or not os.path.isfile(file):
    return None
  if os.path.exists(path):  # e.g. a checkout's configs/ while another copy is installed
    return name if os.path.realpath(path) == os.path.realpath(file) else None
  return name if os.path.normpath(os.path.dirname(path)) == "configs" else None


def load(path: str) -> types.ModuleType:
  """The config module of `path` (the part of `--config` before ':'); see the module docstring."""
  name = shipped_name(path)
  if name is not None:
    return importlib.import_module(f"vit_jax.configs.{name}")
  if not os.path.isfile(path):
    shipped_files = ", ".join(f"configs/{n}.py" for n in stage_names())
    raise FileNotFoundError(f"--config={path}: no such file (shipped: {shipped_files})")
  key = "vit_jax_user_config:" + os.path.realpath(path)
  spec = importlib.util.spec_from_file_location(key, path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[key] = module  # as for any module (dataclasses and pickle look themselves up)
  spec.loader.exec_module(module)
  return module


def override_paths(argv: list[str], name: str = "config") -> list[str]:
  """The fields that `--name.<field>=v`, `--name.<field> v` or `--noname.<field>` set in argv."""
  pattern = re.compile(rf"^--?(?:no)?{re.escape(name)}\.([^=\s]+)")
  return [m.group(1) for m in map(pattern.match, argv) if m]


def _paths(node, prefix: str = "") -> list[str]:
  out = []
  for key in node.keys():
    out.append(prefix + key)
    if hasattr(node[key], "keys"):
      out += _paths(node[key], f"{prefix}{key}.")
  return out


def unknown_field(config, field: str) -> str | None:
  """Why `field` (dotted, e.g. 'model.name') names no field of `config`, or None if it does."""
  node, parts, i = config, re.sub(r"\[[^\]]*\]", "", field).split("."), 0
  while i < len(parts) and hasattr(node, "keys") and parts[i] in node:
    node, i = node[parts[i]], i + 1
  if i == len(parts):
    return None
  missing, part = ".".join(parts[: i + 1]), parts[i]
  siblings = sorted(node.keys()) if hasattr(node, "keys") else []
  known = _paths(config)
  close = difflib.get_close_matches(part, siblings, n=1)
  if close:  # the same place, spelt otherwise
    near = ".".join([*parts[:i], close[0]])
    rest = ".".join([near, *parts[i + 1 :]])
    near = rest if rest in known else near
  else:  # a field of that name elsewhere, or the name a user may know it by
    leaves = {}
    for path in known:
      leaves.setdefault(path.rsplit(".", 1)[-1], path)
    leaves.update({k: v for k, v in ALIASES.items() if v in known})
    match = difflib.get_close_matches(part, list(leaves), n=1)
    near = leaves[match[0]] if match else None
  if near:
    return f"the config has no field {missing!r}; did you mean {near!r}?"
  where = ".".join(parts[:i]) or "the config"
  return f"the config has no field {missing!r} ({where}'s fields: {', '.join(siblings)})"


def check_overrides(config, argv: list[str], name: str = "config") -> None:
  """Raises UnknownFieldError for the first `--name.<field>` in argv that names no field."""
  for field in override_paths(argv, name):
    reason = unknown_field(config, field)
    if reason:
      raise UnknownFieldError(f"--{name}.{field}: {reason}")


class _Parser(flags.ArgumentParser):
  """In place of ml_collections' config file parser: finds the file with `load`, checks the
  command line's overrides (`argv`, default sys.argv), locks the config."""

  def __init__(self, name: str, argv: list[str] | None = None):
    self.name = name
    self.argv = argv

  def flag_type(self) -> str:
    return "config object"

  def parse(self, path: str):
    file, has_arg, arg = path.partition(":")
    module = load(file)
    try:
      config = module.get_config(arg) if has_arg else module.get_config()
    # As ml_collections does: absl reduces these to their message, the traceback says where.
    except (TypeError, ValueError) as e:
      raise type(e)("Error whilst parsing config file:\n\n" + traceback.format_exc()) from e
    # The overrides of the command line, as ml_collections reads them (sys.argv).
    argv = sys.argv if self.argv is None else self.argv
    check_overrides(config, flags.FLAGS.read_flags_from_files(argv, force_gnu=False), self.name)
    config.lock()
    return config


def define_flag(
  name: str = "config", flag_values: flags.FlagValues = flags.FLAGS
) -> flags.FlagHolder:
  """Defines `--<name>` (and its `--<name>.<field>` overrides) with `load` and `check_overrides`
  in `flag_values`."""
  holder = config_flags.DEFINE_config_file(
    name,
    None,
    "Stage config: configs/<stage>.py:<key=value,...>.",
    flag_values=flag_values,
    lock_config=True,
  )
  flag_values[name].parser = _Parser(name)
  return holder


def from_flags(args: list[str], name: str = "config"):
  """The config that a command line's `--config=...` and `--config.<field>=...` flags (`args`,
  nothing else) give, parsed as the commands parse them: for a program that runs stages in its
  own process (experiments/common.run_stage)."""
  argv = ["vit_jax", *args]
  values = flags.FlagValues()
  config_flags.DEFINE_config_file(
    name, None, "Stage config.", flag_values=values, lock_config=True, sys_argv=argv
  )
  values[name].parser = _Parser(name, argv)
  values(argv)
  return values[name].value
