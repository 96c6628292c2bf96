"""Tests that compile with libtpu for a TPU topology: each runs in a pytest process of its own.

libtpu allows one process per machine: it locks /tmp/libtpu_lockfile for the life of any process
that loads it, and a second one aborts ("Internal error when accessing libtpu multi-process
lockfile"; vit_jax.runtime.libtpu_lock). The test processes keep JAX on the CPU and never load
it (conftest); the tests that compile for a topology (`libtpu_test`) each run in a pytest
process of their own, one at a time across processes (an flock on LIBTPU_TEST_LOCK), with
ALLOW_MULTIPLE_LIBTPU_LOAD set in it so that another process that loaded libtpu (there is no TPU
here to share) does not stop it.
"""

import fcntl
import functools
import os
import re
import subprocess
import sys
import tempfile

import pytest

from vit_jax.tools import plan as planner

needs_libtpu = pytest.mark.skipif(
  not planner.libtpu_available(),
  reason='libtpu is not installed (optional extra: pip install -e ".[tpu]")',
)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LIBTPU_TEST_LOCK = os.path.join(tempfile.gettempdir(), "vit_jax_libtpu_tests.lock")
_IN_OWN_PROCESS = "VIT_JAX_LIBTPU_TEST_PROCESS"  # set in the process that runs the test's body


def run_with_libtpu(cmd: list[str], timeout: float, **env: str) -> subprocess.CompletedProcess:
  """Runs `cmd` in the repository root once no other test process is using libtpu.

  Its environment: no local accelerator probed, libtpu's one-process check off (see the module
  docstring), no pytest-xdist state or PYTEST_ADDOPTS inherited, and `env`.
  """
  env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")} | env
  env.update(JAX_PLATFORMS="cpu", ALLOW_MULTIPLE_LIBTPU_LOAD="1")
  with open(LIBTPU_TEST_LOCK, "a") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env)


def libtpu_test(fn):
  """A test that compiles with libtpu: its body runs in a pytest process of its own."""

  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    if os.environ.get(_IN_OWN_PROCESS):
      return fn(*args, **kwargs)
    node = os.environ["PYTEST_CURRENT_TEST"].rsplit(" ", 1)[0]  # 'tests/test_plan.py::name[id]'
    out = run_with_libtpu(
      [sys.executable, "-m", "pytest", node, "-q", "-o", "addopts=", "-p", "no:cacheprovider",
       "-p", "no:xdist"],
      timeout=3600,
      **{_IN_OWN_PROCESS: "1"},
    )  # fmt: skip
    report = out.stdout[-6000:] + out.stderr[-3000:]
    # Exactly this test ran and passed (not skipped, not deselected).
    assert out.returncode == 0 and re.search(r"\b1 passed\b", out.stdout), report

  return needs_libtpu(wrapper)
