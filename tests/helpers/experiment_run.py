"""An experiment's command run as a user runs it: `python -m experiments.<name> ARGS` from the
repository root in a child process with XLA's and OpenBLAS's defaults (xla_env.user_env), so
that its --quick numbers are, to the bit, what the full run's fingerprint recorded
(experiments/fingerprint.py)."""

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(name: str, *args: str, timeout: float = 1200, **env: str) -> subprocess.CompletedProcess:
  """Runs the experiment `name` with `args` (and `env` added to the user's environment);
  asserts that it ended with status 0, its output's tail in the message where not."""
  from tests.helpers import xla_env

  proc = subprocess.run(
    [sys.executable, "-m", f"experiments.{name}", *args],
    capture_output=True,
    text=True,
    env=xla_env.user_env(**env),
    cwd=REPO,
    timeout=timeout,
  )
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  return proc
