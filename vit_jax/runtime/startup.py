"""Importing a stage's modules at a command's start, and keeping Python's cyclic garbage
collector off them afterwards.

Importing `vit_jax.train` brings in TensorFlow (and the Keras, scikit-learn and matplotlib it
imports itself), clu, Flax, Optax and Orbax: about half a million objects that live until the
process ends. The collector walks every one of them again each time it collects its oldest
generation: repeatedly during the import itself (perf: 28% of `import tensorflow` was the
collector's traversal), and then all through the run, where tracing and compiling the train step
fill the young generations fast. `import_module` turns the collector off for the import and then
freezes what exists (`gc.freeze`: moved to a permanent generation the collector does not walk),
the first time each module is imported in the process.

Measured on a 2-core Xeon (Python 3.11, CPU-seconds): `import vit_jax.train` 4.9-6.3 → 4.4-5.5
(including one full collection after it); tracing and compiling the 'testing' ViT's train step,
four times in one process, 21.2 → 19.5 and 26.3 → 23.4 for the whole process (two pairs of
runs). Imports leave next to no garbage; what they do leave stays frozen with the rest.
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
