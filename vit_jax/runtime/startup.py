"""Importing a stage's modules at a command's start without Python's cyclic garbage collector,
and keeping it off them afterwards.

Importing `vit_jax.train` brings in TensorFlow, clu, Flax, Optax and Orbax: about half a million
objects that live until the process ends, which the collector would walk again at every
collection of its oldest generation, during the import and all through the run.
`import_module` turns the collector off for the import, then freezes what exists (`gc.freeze`).
It changes the collector for the whole process, so only commands call it (vit_jax.main,
vit_jax.tools.transfer, the experiments), never the library. Measurements: docs/process.md.
"""

import gc
import importlib
import sys
from types import ModuleType


def import_module(name: str) -> ModuleType:
  """`importlib.import_module(name)`; the first time in this process with the cyclic garbage
  collector off while it runs (left off if it was off already), then everything alive frozen
  out of the collector's reach."""
  if name in sys.modules:
    return sys.modules[name]
  enabled = gc.isenabled()
  gc.disable()
  try:
    module = importlib.import_module(name)
  finally:
    if enabled:
      gc.enable()
  gc.freeze()
  return module
