"""Where a run's wall time goes (goodput), accumulated over the reruns of one workdir.

Each run of a workdir (an attempt) splits its wall time into PHASES, from its process's start
for a command's first run, else from the trainer's call; across the attempts, the time lost runs
from the moment the attempt that wrote the step a rerun restores had reached that step (its
record at that save) to the rerun's start. goodput = step / (every phase of every attempt + lost).
The phases, lost time, recomputed steps and what it costs a step: docs/training.md, "The
account (goodput)".

Process 0 keeps `<workdir>/goodput.json` (one entry per attempt), written once the state is
restored or initialised, at every save (in a background thread, so a gs:// write does not block
the step) and at the end. One that is not a ledger (`LEDGER`) is set aside with a warning and
the account starts anew; one that cannot be read at all (a storage error) is left as it is, and
this run keeps no account.

This file must not import TensorFlow.
"""

import concurrent.futures
import contextlib
import json
import os
import re
import socket
import sys
import time
from typing import Any

import jax
from absl import logging
from etils import epath

from vit_jax.runtime import json_file, stopping
from vit_jax.runtime import workdir as workdir_lib

FILE = "goodput.json"
PHASES = ("startup", "restore", "compile", "step", "data_wait", "checkpoint", "eval", "profile")
TRAINING = ("step", "data_wait")  # the phases a training step's pace counts
# The ledger's shape (vit_jax.runtime.json_file): what the readers below index without a check.
_NUMBER = json_file.NUMBER
_SPENT = {"*": _NUMBER}  # seconds per phase
_MARK = {"step": int, "time": _NUMBER, "spent": _SPENT}  # a save's record
_ATTEMPT = {
  "start": _NUMBER,
  "start_step": int,
  "source?": (str, None),
  "host?": str,
  "pid?": int,
  "processes?": int,
  "lost_s?": _NUMBER,
  "recomputed_steps?": int,
  "marks?": [_MARK],
  "end?": {**_MARK, "outcome": str},
  "counted?": _SPENT,
  "counted_to?": (int, None),
}
LEDGER = {"attempts?": [_ATTEMPT]}
_MAX_MARKS = 32  # records of saves kept per attempt (a rerun restores one of the newest)
_started = [False]  # whether an Account of this process already began at the process's start


def process_start_time() -> float:
  """Unix time at which this process started (Linux: from /proc), else now."""
  try:
    with open("/proc/self/stat") as f:
      start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as f:
      uptime = float(f.read().split()[0])
    return time.time() - (uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
  except (OSError, ValueError, IndexError):
    return time.time()


def _is_command(program: str) -> bool:
  """Whether the process runs one of this project's commands (`python -m vit_jax.main`, a tool,
  an experiment), whose imports are part of the run."""
  return bool(re.search(r"(vit_jax|experiments)([./][\w./]*)?$", program.replace(os.sep, "/")))


def _zeros() -> dict[str, float]:
  return dict.fromkeys(PHASES, 0.0)


def read(workdir: str) -> dict[str, Any] | None:
  """The workdir's ledger, or None without one.

  Raises:
    json_file.InvalidFile: the file is not a ledger (one line naming it and why).
    OSError: it could not be read.
  """
  return json_file.read(epath.Path(workdir) / FILE, LEDGER)


def resolve(attempts: list[dict[str, Any]], start: float, step: int | None) -> float:
  """Settles the attempts a rerun starting at unix time `start` from `step` follows: sets the
  phases each one counts (`counted`) and returns the time lost since the restored step.

  Walks back over the attempts not settled yet: the newest one whose end (finished or stopped)
  or save record is at `step` counts its phases up to there and the lost time runs from there;
  those after it committed nothing that was restored and count as lost from their start.
  """
  lost_from = start
  for attempt in reversed(attempts):
    if "counted" in attempt:
      break
    end = attempt.get("end")
    marks = [m for m in attempt.get("marks", []) if m["step"] == step]
    attempt.pop("marks", None)
    if end and end["step"] == step and end["outcome"] in ("finished", "stopped"):
      attempt.update(counted=end["spent"], counted_to=step)
      lost_from = start if end["outcome"] == "finished" else end["time"]
    elif marks:
      attempt.update(counted=marks[-1]["spent"], counted_to=step)
      lost_from = marks[-1]["time"]
    else:  # nothing of it was restored: all its time is lost
      attempt.update(counted=_zeros(), counted_to=None)
      lost_from = attempt["start"]
      continue
    break
  return max(start - lost_from, 0.0)


def _spent_of(attempt: dict[str, Any]) -> dict[str, float]:
  """The phases an attempt counts: settled by a rerun, else as of its end, else its last save."""
  if "counted" in attempt:
    return attempt["counted"]
  if attempt.get("end"):
    return attempt["end"]["spent"]
  marks = attempt.get("marks")
  return marks[-1]["spent"] if marks else _zeros()


def totals(attempts: list[dict[str, Any]]) -> dict[str, float]:
  """Seconds per phase and lost, summed over `attempts`, with `total`, `share` (goodput),
  `recomputed_steps` and `runs`."""
  out = _zeros()
  out["lost"] = 0.0
  recomputed = 0
  for attempt in attempts:
    for phase, seconds in _spent_of(attempt).items():
      out[phase] = out.get(phase, 0.0) + float(seconds)
    out["lost"] += float(attempt.get("lost_s", 0.0))
    recomputed += int(attempt.get("recomputed_steps", 0))
  total = sum(out.values())
  out.update(total=total, share=out["step"] / total if total else 0.0)
  out.update(recomputed_steps=float(recomputed), runs=float(len(attempts)))
  return out


def _seconds(value: float) -> str:
  return f"{value:,.1f} s" if value < 600 else f"{value / 60:,.1f} min"


def table(account: dict[str, float], this_run: dict[str, float] | None = None) -> str:
  """The account as a small table: each phase's seconds (this run's, then all runs') and share."""
  rows = (
    [("phase", "this run", "all runs", "share")] if this_run else [("phase", "seconds", "share")]
  )
  for phase in (*PHASES, "lost"):
    total = account.get(phase, 0.0)
    share = f"{100 * total / account['total']:.1f}%" if account["total"] else "-"
    cells = [phase.replace("_", " "), _seconds(total), share]
    if this_run:
      cells.insert(1, _seconds(this_run.get(phase, 0.0)))
    rows.append(tuple(cells))
  total_row = ["total", _seconds(account["total"]), ""]
  if this_run:
    total_row.insert(1, _seconds(sum(this_run.values())))
  rows.append(tuple(total_row))
  widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
  lines = [
    "  ".join(
      c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
    )
    for r in rows
  ]
  head = (
    f"goodput {100 * account['share']:.1f}% of {_seconds(account['total'])} over "
    f"{int(account['runs'])} run(s); steps recomputed: {int(account['recomputed_steps'])}"
  )
  return "\n".join([head, *lines])


class Account:
  """The goodput account of one run (see the module docstring); a context manager around it.

  Every process keeps its own clock of phases; process 0 writes the ledger. The trainer calls
  `enter(phase)` at phase boundaries of the loop (the hot path: two calls per step), `phase()`
  around the rarer ones, `resumed` once the state exists, `saved` after each save, and
  `scalars` at log steps.
  """

  def __init__(self, workdir: str):
    self.workdir = workdir
    self._writer = jax.process_index() == 0
    # A command's first run counts from its process's start (its imports and jax.distributed);
    # any other run (a later stage of the same process, a notebook, a test) from here.
    command = not _started[0] and _is_command(sys.argv[0] if sys.argv else "")
    self._start = process_start_time() if command else time.time()
    _started[0] = True
    self._spent = _zeros()
    self._spent["startup"] = max(time.time() - self._start, 0.0)
    self._phase, self._t = "startup", time.perf_counter()
    self._attempt: dict[str, Any] | None = None
    self._ledger: dict[str, Any] | None = None
    self._before: dict[str, float] = {}  # the settled attempts' totals
    self._step = 0
    self._pool: concurrent.futures.ThreadPoolExecutor | None = None
    self._pending: list[concurrent.futures.Future] = []

  def __enter__(self) -> "Account":
    return self

  def __exit__(self, kind, error, traceback) -> None:
    outcome = (
      "finished" if kind is None else "stopped" if issubclass(kind, stopping.Stopped) else "failed"
    )
    self.finish(outcome)

  def enter(self, phase: str) -> None:
    """From now on, time goes to `phase`."""
    now = time.perf_counter()
    self._spent[self._phase] += now - self._t
    self._phase, self._t = phase, now

  @contextlib.contextmanager
  def phase(self, phase: str, pending: Any = None):
    """The `with` body's time goes to `phase`, then back to the phase before. `pending`
    (arrays) is waited for first, so steps still running on the devices stay in this phase."""
    if pending is not None:
      jax.block_until_ready(pending)
    previous = self._phase
    self.enter(phase)
    try:
      yield
    finally:
      self.enter(previous)

  def spent(self) -> dict[str, float]:
    """This run's seconds per phase so far."""
    spent = dict(self._spent)
    spent[self._phase] += time.perf_counter() - self._t
    return spent

  def training_seconds(self) -> float:
    """This run's seconds so far in the phases that train (TRAINING), the clock of the
    trainer's images/s and MFU (vit_jax.runtime.logging_util.Throughput)."""
    spent = self.spent()
    return sum(spent[phase] for phase in TRAINING)

  def resumed(self, step: int, source: str | None, newest_committed: int | None) -> None:
    """The state exists at `step` (restored from the `source` tier, or initialised): settles
    the earlier attempts and starts this one's record."""
    self._step = step
    if not self._writer:
      return
    ledger = self._read()
    if ledger is None:
      return
    attempts = ledger.setdefault("attempts", [])
    restored = step if source is not None else None
    lost = resolve(attempts, self._start, restored) if attempts else 0.0
    recomputed = max((newest_committed or 0) - step, 0)
    self._before = totals(attempts)
    self._attempt = dict(
      start=self._start,
      host=socket.gethostname(),
      pid=os.getpid(),
      processes=jax.process_count(),
      start_step=step,
      source=source,
      lost_s=lost,
      recomputed_steps=recomputed,
      marks=[],
    )
    attempts.append(self._attempt)
    self._ledger = ledger
    if lost or recomputed:
      logging.info(
        "goodput: %.1f s lost since step %d was reached; %d committed steps to train again",
        lost,
        step,
        recomputed,
      )
    self._write()

  def _read(self) -> dict[str, Any] | None:
    """The ledger to continue (see the module docstring); None: keep none this run."""
    path = epath.Path(self.workdir) / FILE
    try:
      return read(self.workdir) or {}
    except json_file.InvalidFile as e:
      why = f"not a goodput account ({e.why})"
      try:
        json_file.set_aside(path, why, then="the account starts anew")
      except OSError as error:
        logging.warning("goodput: %s: %s, and cannot be set aside (%s)", path, why, error)
        return None
      return {}
    except OSError as e:
      logging.warning("goodput: cannot read %s (%s); this run keeps no account", path, e)
      return None

  def saved(self, step: int) -> None:
    """A checkpoint of `step` was started (either tier): a record a rerun can resume from."""
    self._step = step
    if self._attempt is None:
      return
    marks = self._attempt["marks"]
    marks.append(dict(step=step, time=time.time(), spent=_rounded(self.spent())))
    del marks[:-_MAX_MARKS]
    self._write()

  def totals(self) -> dict[str, float]:
    """The workdir's account so far: the settled attempts and this one."""
    spent = self.spent()
    out = {k: self._before.get(k, 0.0) + spent.get(k, 0.0) for k in PHASES}
    lost = self._before.get("lost", 0.0) + (self._attempt or {}).get("lost_s", 0.0)
    out["lost"] = lost
    total = sum(out.values())
    recomputed = self._before.get("recomputed_steps", 0.0)
    recomputed += (self._attempt or {}).get("recomputed_steps", 0)
    out.update(total=total, share=out["step"] / total if total else 0.0)
    out.update(recomputed_steps=float(recomputed), runs=self._before.get("runs", 0.0) + 1)
    return out

  def scalars(self, step: int) -> dict[str, float]:
    """The account for TensorBoard and the progress line (`goodput/share`); process 0 only."""
    self._step = max(self._step, step)
    if not self._writer:
      return {}
    account = self.totals()
    out = {f"goodput/{k}_s": account[k] for k in (*PHASES, "lost", "total")}
    out.update({"goodput/share": account["share"]})
    out["goodput/recomputed_steps"] = account["recomputed_steps"]
    return out

  def finish(self, outcome: str) -> None:
    """Ends the record ('finished', 'stopped' or 'failed') and logs the account's table."""
    self.enter(self._phase)
    if self._attempt is None:
      return
    self._attempt["end"] = dict(
      step=self._step, time=time.time(), outcome=outcome, spent=_rounded(self.spent())
    )
    self._write(wait=True)
    if self._pool is not None:
      self._pool.shutdown(wait=True)
    logging.info("%s", table(self.totals(), {**self.spent(), "lost": self._attempt["lost_s"]}))

  def _write(self, wait: bool = False) -> None:
    """Writes the ledger (process 0): in the background, or now with `wait`."""
    if self._ledger is None:
      return
    text = json.dumps(self._ledger, indent=1, sort_keys=True)
    path = epath.Path(self.workdir) / FILE
    if self._pool is None:
      self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="vit_jax-goodput")
    self._pending = [f for f in self._pending if not f.done()]
    self._pending.append(self._pool.submit(_write_text, path, text))
    if wait:
      concurrent.futures.wait(self._pending)


def _write_text(path: epath.Path, text: str) -> None:
  try:
    workdir_lib.write_json(path, text)
  except Exception as e:  # noqa: BLE001 - the account must not end a run
    logging.warning("goodput: could not write %s: %s", path, e)


def _rounded(spent: dict[str, float]) -> dict[str, float]:
  return {k: round(v, 4) for k, v in spent.items()}
