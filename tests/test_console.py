"""vit_jax/runtime/console.py: the terminal shows the project's lines, warnings and errors, and a run's
last line is the last thing it shows.

Each case runs in a child process, since `console.setup` redirects the process's stderr.
"""

import subprocess
import sys
import textwrap

import pytest

from tests.helpers import REPO

# After its last line a run's background threads may still log: asyncio reports each of Orbax's
# failed writes ("exception was never retrieved", with a traceback) when its future is collected.
_CHILD = textwrap.dedent(
  """
  import logging, sys, threading
  from absl import app
  from absl import logging as absl_logging
  from vit_jax.runtime import console

  def main(argv):
    console.setup(argv[1])
    absl_logging.warning("a warning before the end")
    if argv[2] == "fail":
      console.fail(OSError("no space left on the device"), "the.log")
    else:
      console.end("vit_jax: stopped by SIGTERM at step 3 of 6")

    def background():
      try:
        raise OSError("RESOURCE_EXHAUSTED: write failed")
      except OSError:
        logging.getLogger("asyncio").error(
          "_GatheringFuture exception was never retrieved", exc_info=True
        )

    thread = threading.Thread(target=background)
    thread.start()
    thread.join()
    absl_logging.error("an error after the end")

  app.run(main)
  """
)


@pytest.mark.parametrize("how", ["fail", "end"])
def test_nothing_reaches_the_terminal_after_the_last_line(tmp_path, how):
  proc = subprocess.run(
    [sys.executable, "-c", _CHILD, str(tmp_path), how],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert proc.returncode == 0, proc.stderr
  lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
  assert lines[0].startswith("vit_jax: full log in "), lines
  assert "WARNING a warning before the end" in lines[1], lines
  last = (
    "vit_jax: error: OSError: no space left on the device (full log: the.log)"
    if how == "fail"
    else "vit_jax: stopped by SIGTERM at step 3 of 6"
  )
  assert lines[2:] == [last], lines
  # The log file has everything, the lines after the end included.
  log = next((tmp_path / "logs").glob("*.log")).read_text()
  assert "exception was never retrieved" in log and "RESOURCE_EXHAUSTED" in log, log
  assert "an error after the end" in log, log


def test_an_errors_line_carries_its_reason():
  """A message whose first line only introduces the next (it ends in a colon) is printed with
  the next line, never as a line ending in a colon."""
  from vit_jax.runtime import console

  error = ValueError("checkpoint x does not fit the model:\n\n  first shape mismatch at 'a'\n  b")
  assert console.error_line(error, "vit_jax") == (
    "vit_jax: error: ValueError: checkpoint x does not fit the model: first shape mismatch at 'a'"
  )
  assert console.error_line(ValueError("one line\nmore"), "t") == "t: error: ValueError: one line"
  assert console.error_line(ValueError(""), "t") == "t: error: ValueError: "


@pytest.mark.parametrize(
  ("command", "line"),
  [
    (["vit_jax.tools.goodput", "--workdir=/nowhere", "extra"], "goodput: error: usage: "),
    (["vit_jax.predict", "--checkpoint=/nowhere", "missing.png"], "predict: error: usage: "),
  ],
)
def test_a_commands_misuse_is_one_line_naming_the_culprit(command, line):
  out = subprocess.run(
    [sys.executable, "-m", *command], capture_output=True, text=True, cwd=REPO, timeout=120
  )
  lines = (out.stdout + out.stderr).splitlines()
  assert out.returncode == 1
  assert len(lines) == 1 and lines[0].startswith(line), lines  # not absl's usage text
  assert command[-1] in lines[0]
