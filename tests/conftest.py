"""Test setup: eight simulated CPU devices, so sharding code runs as on a pod slice, compiled at
XLA's optimisation level 0 (tests/helpers/xla_env.py), and one compilation cache for the run.

The device count is forced whatever XLA_FLAGS the environment already holds (a user's own flags
are kept, a device count of theirs is replaced): the mesh tests need eight devices.
"""

import gc
import os

from tests.helpers import xla_env
from vit_jax.runtime import process

# Collection imports every test module, and with them TensorFlow, JAX and the rest: without the
# cyclic garbage collector walking the growing heap over and over (pytest_collection_finish
# turns it back on and freezes what the imports made, as vit_jax.runtime.startup does for a
# command's stage; measured: docs/process.md).
gc.disable()

# Must happen before jax is imported anywhere in the test process: eight devices, the suite's
# compiler settings and the XLA:CPU flags a command sets (tests/helpers/xla_env.py), which child
# processes inherit. Importing vit_jax sets nothing (vit_jax.runtime.process).
os.environ["XLA_FLAGS"] = xla_env.flags(devices=8)
# Where libtpu is installed without a TPU (the test install), JAX on the CPU as a command's
# configure() puts it: a test process that loaded libtpu would hold its lock for its whole life
# (vit_jax.runtime.libtpu_lock).
if process.libtpu_without_accelerator(os.environ):
  process.quiet_libtpu()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# One BLAS thread per process (numpy's and scipy's OpenBLAS: the float64 references, the pixel
# baselines' scikit-learn fits): `pytest -n 2` already runs one process per core, and OpenBLAS's
# threads spin while they wait, so two of them per worker fight XLA's threads and the other
# worker's for the cores (measured: docs/process.md).
if "OPENBLAS_NUM_THREADS" not in os.environ:
  os.environ["OPENBLAS_NUM_THREADS"] = "1"
  os.environ[xla_env.SUITE_BLAS] = "1"  # the suite's setting, not the user's: see user_env

# One directory for the run, made by the controller and removed at its end, holding
# - one persistent compilation cache: the test processes, every xdist worker and every child
#   process they start (entry points, multi-process launches, float64 references) compile the
#   same small programs again and again. Entries are keyed on the program, the flags and the
#   versions, so sharing them changes no result;
# - the temporary directory (TMPDIR) of the workers and children: tensorflow_datasets leaves an
#   empty directory there whenever it builds an unprepared dataset's info (DatasetInfo.
#   initialize_from_bucket), hundreds per run.
# Workers and children inherit the variables.
_OWN_RUN_DIR = "VIT_JAX_TEST_RUN_DIR" not in os.environ  # made here, removed at the end
if _OWN_RUN_DIR:
  import tempfile

  os.environ["VIT_JAX_TEST_RUN_DIR"] = tempfile.mkdtemp(prefix="vit_jax_test_run-")
  for _sub in ("jax_cache", "tmp"):
    os.makedirs(os.path.join(os.environ["VIT_JAX_TEST_RUN_DIR"], _sub))
  # tempfile has cached this process's own temporary directory: pytest's tmp_path stays there.
  os.environ["TMPDIR"] = os.path.join(os.environ["VIT_JAX_TEST_RUN_DIR"], "tmp")
os.environ.setdefault(
  "JAX_COMPILATION_CACHE_DIR", os.path.join(os.environ["VIT_JAX_TEST_RUN_DIR"], "jax_cache")
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")


def pytest_collection_finish(session):
  gc.enable()
  gc.freeze()


def pytest_unconfigure(config):
  if _OWN_RUN_DIR and not hasattr(config, "workerinput"):  # the process that made it
    import shutil

    shutil.rmtree(os.environ["VIT_JAX_TEST_RUN_DIR"], ignore_errors=True)


import pytest  # noqa: E402 - after the environment above is set


@pytest.fixture
def trainer_on_one_device(monkeypatch):
  """`vit_jax.train.run` (and the stages and experiments that call it) on one device of this
  process, for tests whose subject is not the mesh: over the eight devices above, every compile
  and checkpoint save of a tiny model costs more. A call that passes `devices=` keeps its own."""
  import functools

  import jax

  from vit_jax.train import loop  # what `vit_jax.train.run` and the stages call

  monkeypatch.setattr(loop, "run", functools.partial(loop.run, devices=jax.devices()[:1]))


@pytest.fixture(scope="session")
def local_gcs():
  """A GCS API server and its proxy on loopback (tests/helpers/gcs.py), shared by the session's gs://
  tests (each pytest -n worker that runs one starts its own), with the bucket `vit-jax-test`.
  Its `env()` goes into the environment of child processes only."""
  from tests.helpers import gcs

  with gcs.LocalGCS(buckets=("vit-jax-test",)) as server:
    yield server


def pytest_collection_modifyitems(config, items):
  """The modules holding a test marked `long` first (each keeping its order, so that its shared
  fixtures are made once): under `pytest -n 2` the longest tests then start early, and no core
  idles at the end while the other finishes a test of two or three minutes."""
  long_modules = {item.module for item in items if item.get_closest_marker("long")}
  items.sort(key=lambda item: item.module not in long_modules)


def pytest_terminal_summary(terminalreporter):
  """The docs test's count of the commands it ran and left out (tests/test_docs.py), also when
  a pytest -n worker ran it."""
  for report in terminalreporter.stats.get("passed", []):
    for name, value in getattr(report, "user_properties", ()):
      if name == "docs_summary":
        terminalreporter.write_line(value)
