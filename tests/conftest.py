"""Test setup: eight simulated CPU devices, so sharding code runs as on a pod slice, and one
compilation cache for the run.

The device count is forced whatever XLA_FLAGS the environment already holds (a user's own flags
are kept, a device count of theirs is replaced): the mesh tests need eight devices.
"""

import os
import re

# Must happen before jax is imported anywhere in the test process.
_DEVICES = "--xla_force_host_platform_device_count=8"
_others = re.sub(r"--xla_force_host_platform_device_count=\S*", "", os.environ.get("XLA_FLAGS", ""))
os.environ["XLA_FLAGS"] = " ".join([*_others.split(), _DEVICES])
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


import pytest  # noqa: E402 - after the environment above is set


@pytest.fixture(scope="session")
def local_gcs():
  """A GCS API server and its proxy on loopback (tests/gcs.py), shared by the session's gs://
  tests (each pytest -n worker that runs one starts its own), with the bucket `vit-jax-test`.
  Its `env()` goes into the environment of child processes only."""
  import gcs  # tests/

  with gcs.LocalGCS(buckets=("vit-jax-test",)) as server:
    yield server
