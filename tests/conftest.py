"""Test setup: eight simulated CPU devices, so sharding code runs as on a pod slice, compiled at
XLA's optimisation level 0 (tests/xla_env.py), and one compilation cache for the run.

The device count is forced whatever XLA_FLAGS the environment already holds (a user's own flags
are kept, a device count of theirs is replaced): the mesh tests need eight devices.
"""

import os

import xla_env  # tests/

# Must happen before jax is imported anywhere in the test process: eight devices, and the
# suite's compiler settings (tests/xla_env.py), which child processes inherit.
os.environ["XLA_FLAGS"] = xla_env.flags(devices=8)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# One persistent compilation cache for the whole run: the test processes, every xdist worker and
# every child process they start (entry points, multi-process launches, float64 references)
# compile the same small programs again and again. The controller makes the directory; workers
# and children inherit the variables. Entries are keyed on the program, the flags and the
# versions, so sharing them changes no result.
_OWN_CACHE = "VIT_JAX_TEST_JAX_CACHE" not in os.environ  # made here, removed at the end
if _OWN_CACHE:
  import tempfile

  os.environ["VIT_JAX_TEST_JAX_CACHE"] = tempfile.mkdtemp(prefix="vit_jax_test_jax_cache-")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.environ["VIT_JAX_TEST_JAX_CACHE"])
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")


def pytest_unconfigure(config):
  if _OWN_CACHE and not hasattr(config, "workerinput"):  # the process that made it
    import shutil

    shutil.rmtree(os.environ["VIT_JAX_TEST_JAX_CACHE"], ignore_errors=True)
