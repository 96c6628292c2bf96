"""Traces of chosen training steps (jax.profiler), for TensorBoard's profile plugin and XProf.

Asked for by the config (`config.profile.first_step`, `num_steps`, `processes`) or, while a run
is running, by a file `<workdir>/profile_request` holding a number of steps (docs/training.md,
"Profiles on demand"). The lowest of the chosen processes removes the request once its trace is
written (until then the others do not serve it twice). A request that is not a number of steps
is set aside (`profile_request.bad-<time>`, vit_jax.runtime.json_file) with a warning quoting
it, so that a file read at every log step does not warn at every one; one at the run's last
step is left for a later run. A trace is written to
`<workdir>/plugins/profile/steps_<first>-<last>/<host>[-p<process>].xplane.pb`, through a local
temporary directory.

Nothing here installs a signal handler; a failure to trace is a warning, never the end of a run.

This file must not import TensorFlow.
"""

import contextlib
import math
import shutil
import tempfile
import time
from typing import Any

import jax
import ml_collections
from absl import logging
from etils import epath

from vit_jax.runtime import json_file

REQUEST_FILE = "profile_request"
_MAX_REQUEST_BYTES = 64  # a number of steps, and room for spaces: more is no request
_REMOTE_POLL_S = 30.0  # the least time between two looks for a request on gs://
_SUFFIXES = (".xplane.pb", ".trace.json.gz")


def parse_processes(text: str) -> set[int] | None:
  """'all' → None (every process); '0,3' → {0, 3}.

  Raises:
    ValueError: one line naming `profile.processes`.
  """
  if str(text).strip() == "all":
    return None
  try:
    return {int(p) for p in str(text).split(",") if p.strip()}
  except ValueError:
    raise ValueError(
      f"profile.processes={text!r}: expected 'all' or process indices separated by commas"
    ) from None


class Profiler:
  """Starts and stops jax.profiler traces of this process at the chosen steps.

  The trainer calls `step(step, state)` before each step (an integer comparison unless a trace
  starts or ends there), `poll(step)` at log steps and `close(state)` at the end.
  """

  def __init__(
    self,
    profile: ml_collections.ConfigDict,
    workdir: str,
    account: Any = None,
    total_steps: int | None = None,
  ):
    """Args: `config.profile`, the workdir, the goodput account (its 'profile' phase), and the
    run's last step (None: no end; a trace never goes past it)."""
    chosen = parse_processes(profile.processes)
    if chosen is not None and not chosen <= set(range(jax.process_count())):
      raise ValueError(
        f"profile.processes={profile.processes!r} names a process this run does not have "
        f"({jax.process_count()} processes: 0 to {jax.process_count() - 1})"
      )
    self._on = chosen is None or jax.process_index() in chosen
    self._remover = jax.process_index() == (0 if chosen is None else min(chosen, default=-1))
    self._workdir = workdir
    self._num_steps = max(int(profile.num_steps), 1)
    first = int(profile.first_step)
    # Windows still to trace: (first step, last step, whether a request file asked for it).
    self._windows: list[tuple[int, int, bool]] = []
    self._total = math.inf if total_steps is None else int(total_steps)
    if self._on and first > 0:
      self._windows.append((first, int(min(first + self._num_steps - 1, self._total)), False))
    self._next = self._windows[0][0] if self._windows else -1
    self._account = account
    self._request = epath.Path(workdir) / REQUEST_FILE
    self._remote = "://" in str(workdir)
    self._last_poll = -math.inf
    self._serving = False  # a request file was served and has not been removed yet
    self._tmp: str | None = None
    self._traced: tuple[int, int, bool] | None = None  # the window being traced

  def _phase(self):
    return self._account.phase("profile") if self._account else contextlib.nullcontext()

  def step(self, step: int, state: Any) -> None:
    """Before `step`: ends a trace whose last step was the one before (waiting for `state`,
    its result), starts one that begins here."""
    if self._traced is not None and step > self._traced[1]:
      self.close(state)
    if 0 <= self._next <= step:
      first, last, requested = self._windows.pop(0)
      self._next = self._windows[0][0] if self._windows else -1
      if step <= last:  # else passed before this run started (a resumed run)
        self._start((step, last, requested))

  def poll(self, step: int) -> None:
    """At a log step: serves `<workdir>/profile_request` from the next step on."""
    if not self._on or self._traced is not None:
      return
    now = time.monotonic()
    if self._remote and now - self._last_poll < _REMOTE_POLL_S:
      return
    self._last_poll = now
    try:
      if not self._request.exists():
        self._serving = False
        return
      if self._serving:
        return
      with self._request.open("rb") as f:
        data = f.read(_MAX_REQUEST_BYTES + 1)
    except OSError as e:
      logging.warning("profile: cannot read %s: %s", self._request, e)
      return
    self._serving = True
    text = data.decode("utf-8", errors="replace").strip()
    try:
      if len(data) > _MAX_REQUEST_BYTES:
        raise ValueError
      num_steps = int(text) if text else self._num_steps
      if num_steps < 1:
        raise ValueError
    except ValueError:
      self._remove_request(f"holds {text[:40]!r}, not a number of steps; ignored")
      return
    left = self._total - step  # the steps this run has after this one
    if left < 1:
      self._serving = False
      logging.info(
        "profile: %s asks for %d steps at the run's last step (%d); left for a later run",
        self._request,
        num_steps,
        step,
      )
      return
    asked, num_steps = num_steps, int(min(num_steps, left))
    clipped = f" (clipped to the {num_steps} left in this run)" if num_steps < asked else ""
    self._windows = sorted([*self._windows, (step + 1, step + num_steps, True)])
    self._next = self._windows[0][0]
    logging.info(
      "profile: %s asks for %d steps%s: tracing steps %d-%d",
      self._request,
      asked,
      clipped,
      step + 1,
      step + num_steps,
    )

  def _start(self, window: tuple[int, int, bool]) -> None:
    first, last, _ = window
    if self._traced is not None:
      logging.warning("profile: steps %d-%d overlap the trace in progress; not traced", first, last)
      if window[2]:
        self._remove_request()
      return
    with self._phase():
      self._tmp = tempfile.mkdtemp(prefix="vit_jax-profile-")
      try:
        jax.profiler.start_trace(self._tmp)
      except Exception as e:  # noqa: BLE001 - a trace is never worth a run
        logging.warning("profile: could not start a trace of steps %d-%d: %s", first, last, e)
        shutil.rmtree(self._tmp, ignore_errors=True)
        if window[2]:
          self._remove_request()
        return
      self._traced = window

  def close(self, state: Any = None) -> None:
    """Ends a trace in progress (after waiting for `state`) and writes it to the workdir."""
    if self._traced is None:
      return
    first, last, requested = self._traced
    self._traced = None
    if state is not None:  # the traced steps' device work (training time, not the trace's)
      jax.block_until_ready(state)
    with self._phase():
      try:
        jax.profiler.stop_trace()
        target = self._copy(first, last)
        logging.info(
          "profile: steps %d-%d traced to %s (tensorboard --logdir=%s, Profile tab)",
          first,
          last,
          target,
          self._workdir,
        )
      except Exception as e:  # noqa: BLE001 - see _start
        logging.warning("profile: the trace of steps %d-%d was not written: %s", first, last, e)
      finally:
        shutil.rmtree(self._tmp, ignore_errors=True)
        if requested:
          self._remove_request()

  def _copy(self, first: int, last: int) -> epath.Path:
    """Copies jax's trace files into the workdir's profile plugin directory; the target."""
    target = epath.Path(self._workdir) / "plugins" / "profile" / f"steps_{first}-{last}"
    target.mkdir(parents=True, exist_ok=True)
    files = [p for p in epath.Path(self._tmp).glob("plugins/profile/*/*") if p.is_file()]
    if not files:
      raise FileNotFoundError(f"jax.profiler wrote no trace under {self._tmp}")
    for path in files:
      name = path.name
      if jax.process_count() > 1:
        for suffix in _SUFFIXES:
          if name.endswith(suffix):
            name = f"{name[: -len(suffix)]}-p{jax.process_index()}{suffix}"
      path.copy(target / name, overwrite=True)
    return target

  def _remove_request(self, bad: str | None = None) -> None:
    """Removes the request served (the lowest chosen process); one that is `bad` (why) is set
    aside instead, with a warning."""
    if not self._remover:
      if bad:
        logging.warning("profile: %s %s", self._request, bad)
      return
    try:
      if bad:
        json_file.set_aside(self._request, bad)
      else:
        self._request.unlink(missing_ok=True)
      self._serving = False
    except OSError as e:
      logging.warning("profile: cannot remove %s: %s", self._request, e)
