"""What a run shows on the terminal, and the log file that keeps everything else.

`setup(workdir)` sends the process's whole stderr (every library's log lines, native messages,
tracebacks of background threads) to a log file, and puts a filtered stream on the terminal: this
project's own log lines and every warning or error but Orbax's. `fail(error)` ends a failed run
with one line on the terminal, the traceback in the file, and `end(line)` a stopped one; after
that line nothing more reaches the terminal. The log file: `<workdir>/logs/<time>-p<process>.log`
(in the temporary directory for a gs:// workdir), created exclusively by each process (a launch
in the same second gets `-2`, ...), so a launch refused because another run holds the workdir
never writes into that run's log (docs/training.md, "Workdirs and logs").

This file must not import TensorFlow.
"""

import logging
import os
import sys
import tempfile
import time

from absl import logging as absl_logging

# Log records from these source paths reach the terminal below WARNING: the project itself
# (the progress line, evaluation results, checkpoints). clu's metric dump and every library's
# info lines stay in the log file (TensorBoard has the metrics).
_SHOWN_SOURCES = (os.path.dirname(os.path.abspath(__file__)),)
# Libraries whose lines stay in the log file at every level: Orbax warns "Metadata file does not
# exist" when a stage reads another stage's checkpoint, and logs every failure of a background
# save thread (a full disk: dozens of tracebacks) before it reaches the trainer as an exception,
# which `fail` reports in one line.
_QUIET_SOURCES = (os.sep + "orbax" + os.sep,)

_terminal = None  # the filtered stream, once set up
_ended = False  # the run's last line is written: nothing more reaches the terminal
_restore = None  # what `teardown` undoes: (the terminal's fd for stderr, the handler)


class _TerminalFilter(logging.Filter):
  def filter(self, record: logging.LogRecord) -> bool:
    # After the last line, background threads still log (asyncio's "exception was never
    # retrieved" for each of Orbax's writes in flight when a disk filled up): the file has them.
    if _ended:
      return False
    if not getattr(record, "terminal", True):  # logging.info(..., extra={"terminal": False})
      return False
    path = os.path.abspath(record.pathname)
    if any(s in path for s in _QUIET_SOURCES):
      return False
    if record.levelno >= logging.WARNING:
      return True
    return any(s in path for s in _SHOWN_SOURCES)


class _TerminalFormatter(logging.Formatter):
  """'13:21:39 step 15/20 (75%) | loss 2.2505 | ...'; warnings and errors say so."""

  def format(self, record: logging.LogRecord) -> str:
    stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
    level = "" if record.levelno < logging.WARNING else f"{record.levelname} "
    text = f"{stamp} {level}{record.getMessage()}"
    if record.exc_info and record.levelno >= logging.ERROR:
      text += "\n" + self.formatException(record.exc_info)
    return text


def log_path(workdir: str | None, process_index: int = 0) -> str:
  """Where `setup` writes the log of this process (workdir None: the temporary directory), unless
  another process's log is there already (see the module docstring)."""
  name = f"{time.strftime('%Y%m%d-%H%M%S')}-p{process_index}.log"
  if workdir is None or "://" in workdir:
    return os.path.join(tempfile.gettempdir(), f"vit_jax-{name}")
  return os.path.join(workdir, "logs", name)


def _create(path: str) -> tuple[str, int]:
  """Creates a log file of this process's own at `path`, or beside it with `-2`, `-3`, ...
  before `.log` where that exists; (its path, a descriptor open for writing)."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  stem, n = path.removesuffix(".log"), 1
  while True:
    candidate = path if n == 1 else f"{stem}-{n}.log"
    try:
      flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND
      return candidate, os.open(candidate, flags, 0o644)
    except FileExistsError:
      n += 1


def setup(workdir: str | None, process_index: int = 0) -> str:
  """Routes stderr to the log file and filtered lines to the terminal; returns the log's path."""
  global _terminal, _ended, _restore
  if _restore is not None:
    teardown()
  path, log_fd = _create(log_path(workdir, process_index))
  sys.stderr.flush()
  terminal_fd = os.dup(2)
  os.dup2(log_fd, 2)  # native code and every Python stderr writer now write to the file
  os.close(log_fd)
  _terminal = os.fdopen(terminal_fd, "w", buffering=1)
  handler = logging.StreamHandler(_terminal)
  handler.setFormatter(_TerminalFormatter())
  handler.addFilter(_TerminalFilter())
  logging.getLogger().addHandler(handler)
  _ended, _restore = False, (os.dup(terminal_fd), handler)
  print(f"vit_jax: full log in {path}", file=_terminal)
  return path


def teardown() -> None:
  """Undoes `setup`: stderr goes to the terminal again, the log file is closed. For a program
  that runs several stages in one process (experiments/common.run_stage), each with its log."""
  global _terminal, _restore
  if _restore is None:
    return
  fd, handler = _restore
  logging.getLogger().removeHandler(handler)
  sys.stderr.flush()
  os.dup2(fd, 2)
  os.close(fd)
  _terminal.close()
  _terminal, _restore = None, None


def write_line(text: str) -> None:
  """Writes one line to the terminal without taking any lock (safe inside a signal handler)."""
  stream = _terminal or sys.stderr
  try:
    os.write(stream.fileno(), (text + "\n").encode())
  except (OSError, ValueError):
    pass


def end(text: str) -> None:
  """Writes the run's last line; log records after it stay in the log file."""
  global _ended
  write_line(text)
  _ended = True


def fail(
  error: BaseException,
  path: str | None,
  message: str | None = None,
  kind: str | None = None,
  name: str = "vit_jax",
) -> None:
  """Logs `error` with its traceback (file) and prints one line naming it (terminal):
  `error_line`'s, with ` (full log: <path>)`."""
  absl_logging.error("run failed", exc_info=error, extra={"terminal": False})
  where = f" (full log: {path})" if path else ""
  end(error_line(error, name, message, kind) + where)


def first_line(error: BaseException) -> str:
  """The first line of `error`'s message; where that line only introduces the next ones (it ends
  in a colon), joined with the next non-empty line, so that the line printed carries the reason."""
  lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
  if not lines:
    return ""
  if lines[0].endswith(":") and len(lines) > 1:
    return f"{lines[0]} {lines[1]}"
  return lines[0]


def error_line(
  error: BaseException, name: str, message: str | None = None, kind: str | None = None
) -> str:
  """`<name>: error: <kind>: <message>`: `kind` by default the error's type, `message` its
  first line."""
  if message is None:
    message = first_line(error)
  return f"{name}: error: {kind or type(error).__name__}: {message}"
