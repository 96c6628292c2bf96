"""Loading the stage configs of `configs/` by file, wherever the command runs from.

The files of `configs/` share code (`common.py`) and build on each other (`pretrain_mpp.py` on
`pretrain.py`). They are not an installed package: a top-level package named `configs` would
collide with anything else a user has installed. Instead each file loads its siblings from its
own directory with `sibling(__file__, name)`, so `--config=/any/path/configs/finetune.py:...`
works from any working directory.
"""

import importlib.util
import os
import sys
import types


def sibling(path: str, name: str) -> types.ModuleType:
  """The module `<directory of path>/<name>.py`, loaded once per file (cached by its path)."""
  file = os.path.join(os.path.dirname(os.path.abspath(path)), f"{name}.py")
  key = f"_vit_jax_config_file:{file}"
  if key not in sys.modules:
    spec = importlib.util.spec_from_file_location(key, file)
    if spec is None or not os.path.exists(file):
      raise FileNotFoundError(f"config file {file} (imported by {path}) does not exist")
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    try:
      spec.loader.exec_module(module)
    except BaseException:
      del sys.modules[key]
      raise
  return sys.modules[key]
