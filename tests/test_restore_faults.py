"""Restoring a training checkpoint: only evidence that a step is broken moves it aside.

In-process, on a small state saved by `Checkpointer` itself: a truncated array file, a missing
or unparsable metadata file are evidence (moved aside, the step before restored); a storage
error (OSError EIO raised by Orbax's array reader) is retried and, if it persists, ends with
CheckpointRestoreError, nothing moved; a model the step does not fit ends with
CheckpointMismatch, nothing moved. A restore (or a save) waiting on storage says so; a stop
request ends a restore's wait within seconds, nothing moved, unless the read returns within
the grace. The same through the entry point: tests/test_faults.py, tests/test_gcs_outage.py (slow).
"""

import asyncio
import errno
import json
import re
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from vit_jax.checkpoint.state import restore_faults, storage_wait, train_state


def _state(step: int, width: int = 4) -> dict:
  return {
    "step": jnp.int32(step),
    "params": {"dense": {"kernel": jnp.full((width, 3), float(step)), "bias": jnp.zeros(3)}},
    "opt_state": ({"count": jnp.int32(step)}, {"mu": jnp.ones(3)}),
  }


def _abstract(width: int = 4) -> dict:
  sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  return jax.tree_util.tree_map(
    lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), _state(0, width)
  )


@pytest.fixture
def workdir(tmp_path, monkeypatch):
  """A workdir with steps 1 and 2 (synchronous saves); retries without waiting."""
  monkeypatch.setattr(restore_faults, "RETRY_DELAYS_S", (0.0, 0.0))
  checkpointer = train_state.Checkpointer(str(tmp_path), 1, 10, asynchronous=False)
  for step in (1, 2):
    checkpointer.save(step, _state(step), {"position": step}, force=True)
  checkpointer.close()
  return tmp_path


def _restore(workdir):
  checkpointer = train_state.Checkpointer(str(workdir), 1, 10, asynchronous=False)
  try:
    return checkpointer.restore_latest(_abstract())
  finally:
    checkpointer.close()


def _truncate_array_files(step_dir):
  """Truncates the step's array data files (under `state/d/` and `state/ocdbt.process_0/d/`)."""
  state = step_dir / "state"
  for path in state.rglob("*"):
    if path.is_file() and "d" in path.relative_to(state).parts[:-1]:
      with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)


def _moved(workdir):
  broken = workdir / train_state.BROKEN_DIR
  return sorted(p.name for p in broken.iterdir()) if broken.exists() else []


@pytest.mark.parametrize(
  "damage, evidence",
  [
    (_truncate_array_files, "a file of the step is truncated or missing"),
    (lambda s: (s / "state" / "_METADATA").unlink(), "_METADATA is missing"),
    (lambda s: (s / "state" / "_METADATA").write_text("{"), "does not parse"),
    (lambda s: (s / "data" / "metadata").unlink(), "a file of the step is missing"),
  ],
  ids=["truncated_array", "missing_metadata", "garbled_metadata", "missing_data_state"],
)
def test_evidence_moves_the_step_aside(workdir, damage, evidence, caplog):
  damage(workdir / "checkpoints" / "2")
  step, state, data_state = _restore(workdir)
  assert step == 1 and data_state == {"position": 1}
  np.testing.assert_array_equal(state["params"]["dense"]["kernel"], np.full((4, 3), 1.0))
  assert _moved(workdir) == ["2"] and train_state.committed_steps(workdir) == [1]
  assert evidence in caplog.text
  assert "resuming from step 1, older than the newest step 2, which does not restore" in caplog.text
  # The next start says that a newer step was moved aside by an earlier run.
  caplog.clear()
  assert _restore(workdir)[0] == 1
  assert "holds newer step(s) 2, moved aside by an earlier run" in caplog.text


def _failing_reads(monkeypatch, failures: int) -> list[int]:
  """Orbax's array reader raises OSError EIO on its first `failures` calls; the call count."""
  read, calls = ocp.type_handlers.ArrayHandler.deserialize, [0]

  async def failing(self, infos, args=None):
    calls[0] += 1
    if calls[0] <= failures:
      raise OSError(errno.EIO, "Input/output error", str(infos[0].path))
    return await read(self, infos, args)

  monkeypatch.setattr(ocp.type_handlers.ArrayHandler, "deserialize", failing)
  return calls


def test_a_transient_error_is_retried(workdir, monkeypatch, caplog):
  calls = _failing_reads(monkeypatch, failures=2)
  step, state, _ = _restore(workdir)
  assert step == 2 and calls[0] == 3 and _moved(workdir) == []
  np.testing.assert_array_equal(state["params"]["dense"]["kernel"], np.full((4, 3), 2.0))
  assert caplog.text.count("retrying in 0 s") == 2


def test_a_persistent_error_ends_the_run_with_nothing_moved(workdir, monkeypatch):
  calls = _failing_reads(monkeypatch, failures=100)
  with pytest.raises(restore_faults.CheckpointRestoreError) as error:
    _restore(workdir)
  assert calls[0] == 3  # one attempt and two retries, of step 2 only: never the older step
  message = str(error.value)
  assert message.startswith(f"restoring checkpoint step 2 from {workdir}/checkpoints failed 3")
  assert "OSError: [Errno 5] Input/output error" in message and "nothing was moved" in message
  assert _moved(workdir) == [] and train_state.committed_steps(workdir) == [1, 2]


def test_a_stop_request_cuts_the_retries_short(workdir, monkeypatch):
  monkeypatch.setattr(restore_faults, "RETRY_DELAYS_S", (30.0, 30.0))
  calls = _failing_reads(monkeypatch, failures=100)
  checkpointer = train_state.Checkpointer(str(workdir), 1, 10, asynchronous=False)
  start = time.monotonic()
  with pytest.raises(restore_faults.CheckpointRestoreError, match="a stop was requested"):
    checkpointer.restore_latest(_abstract(), stop_requested=lambda: True)
  checkpointer.close()
  assert calls[0] == 1 and time.monotonic() - start < 10  # not the 30 s wait
  assert _moved(workdir) == [] and train_state.committed_steps(workdir) == [1, 2]


@pytest.mark.parametrize("error", [MemoryError(), ConnectionResetError(104, "reset by peer")])
def test_memory_and_connection_errors_are_no_evidence(workdir, monkeypatch, error):
  def failing(*args, **kwargs):
    raise error

  monkeypatch.setattr(train_state.Checkpointer, "restore", failing)
  with pytest.raises(restore_faults.CheckpointRestoreError, match=type(error).__name__):
    _restore(workdir)
  assert _moved(workdir) == [] and train_state.committed_steps(workdir) == [1, 2]


def test_a_model_the_step_does_not_fit_moves_nothing(workdir):
  checkpointer = train_state.Checkpointer(str(workdir), 1, 10, asynchronous=False)
  with pytest.raises(restore_faults.CheckpointMismatch) as error:
    checkpointer.restore_latest(_abstract(width=5))
  checkpointer.close()
  assert str(error.value).startswith(
    f"checkpoint step 2 in {workdir}/checkpoints does not fit the model: params/dense/kernel is "
    "(4, 3) in the checkpoint, (5, 3) in the model; nothing was moved"
  )
  assert _moved(workdir) == [] and train_state.committed_steps(workdir) == [1, 2]


def test_what_counts_as_evidence():
  step = "/w/checkpoints/20"
  evidence = restore_faults.evidence
  data_loss = ValueError(f'DATA_LOSS: Error reading "x" in OCDBT database at "{step}/state/"')
  assert evidence(data_loss, step, True)
  # The same error naming another step (step 2's path is a prefix of step 20's) is not.
  assert evidence(data_loss, "/w/checkpoints/2", True) is None
  unavailable = ValueError(f'UNAVAILABLE: Error reading "x" in OCDBT database at "{step}/state/"')
  assert evidence(unavailable, step, True) is None
  wrapped = Exception("Encountered error while reading array index")
  wrapped.__cause__ = ValueError(f'OUT_OF_RANGE: at local file "{step}/state/": byte range')
  assert "truncated or missing" in evidence(wrapped, step, True)
  assert evidence(FileNotFoundError(f"File {step}/data/metadata not found."), step, True)
  assert evidence(FileNotFoundError("File /w/other not found."), step, True) is None
  assert evidence(json.JSONDecodeError("Expecting value", "{", 1), step, True)
  assert evidence(OSError(errno.EIO, "Input/output error"), step, True) is None
  assert evidence(TimeoutError("timed out"), step, True) is None
  stored = ValueError("Requested shape: (48,) is not compatible with the stored shape: (32,).")
  assert evidence(stored, step, metadata_fits=True)  # the arrays contradict their metadata
  assert evidence(stored, step, metadata_fits=False) is None  # the model does not fit


def _blocking_reads(monkeypatch, seconds: float) -> tuple[list[int], threading.Event]:
  """Orbax's array reader waits up to `seconds` (or until the event is set) before it reads,
  as a read of storage that retries does; the call count and the event."""
  read, calls, release = ocp.type_handlers.ArrayHandler.deserialize, [0], threading.Event()

  async def blocking(self, infos, args=None):
    calls[0] += 1
    await asyncio.get_running_loop().run_in_executor(None, release.wait, seconds)
    return await read(self, infos, args)

  monkeypatch.setattr(ocp.type_handlers.ArrayHandler, "deserialize", blocking)
  return calls, release


def test_a_restore_waiting_on_storage_says_so(workdir, monkeypatch, caplog):
  monkeypatch.setattr(storage_wait, "NOTICE_EVERY_S", 0.5)
  calls, _ = _blocking_reads(monkeypatch, seconds=2.5)
  step, state, _ = _restore(workdir)
  assert step == 2 and calls[0] == 1
  np.testing.assert_array_equal(state["params"]["dense"]["kernel"], np.full((4, 3), 2.0))
  notices = re.findall(
    rf"restoring checkpoint step 2 from {workdir}/checkpoints: waiting on storage for \d+ s "
    r"\(attempt 1 of 3\)",
    caplog.text,
  )
  assert len(notices) >= 2, caplog.text  # 2.5 s of waiting, a notice every 0.5 s


def test_a_stop_ends_a_wait_on_storage(workdir, monkeypatch):
  monkeypatch.setattr(storage_wait, "STOP_GRACE_S", 1.0)
  calls, release = _blocking_reads(monkeypatch, seconds=60)
  checkpointer = train_state.Checkpointer(str(workdir), 1, 10, asynchronous=False)
  start = time.monotonic()
  try:
    with pytest.raises(restore_faults.CheckpointRestoreError) as error:
      checkpointer.restore_latest(_abstract(), stop_requested=lambda: time.monotonic() > start + 1)
    took = time.monotonic() - start
  finally:
    release.set()  # the abandoned read ends
    checkpointer.close()
  assert calls[0] == 1 and took < 10, took  # not the read's 60 s
  assert re.match(
    rf"restoring checkpoint step 2 from {workdir}/checkpoints: a stop was requested while "
    r"waiting on storage for \d+ s \(attempt 1 of 3\); nothing was moved",
    str(error.value),
  ), error.value
  assert _moved(workdir) == [] and train_state.committed_steps(workdir) == [1, 2]


def test_a_restore_that_returns_within_the_grace_of_a_stop_is_kept(workdir, monkeypatch):
  """A stop requested while the step is being read from a disk: the read ends within
  storage_wait.STOP_GRACE_S and the step is restored (the run then stops at its next stopping
  point, with nothing new to save)."""
  calls, _ = _blocking_reads(monkeypatch, seconds=1.0)
  checkpointer = train_state.Checkpointer(str(workdir), 1, 10, asynchronous=False)
  try:
    step, _, data_state = checkpointer.restore_latest(_abstract(), stop_requested=lambda: True)
  finally:
    checkpointer.close()
  assert step == 2 and data_state == {"position": 2} and calls[0] == 1


def test_a_save_waiting_on_storage_says_so(workdir, monkeypatch, caplog):
  monkeypatch.setattr(storage_wait, "NOTICE_EVERY_S", 0.5)
  write = ocp.type_handlers.ArrayHandler.serialize

  async def slow(self, values, infos, args=None):
    await asyncio.sleep(2.0)  # a write that storage is slow to take
    return await write(self, values, infos, args)

  monkeypatch.setattr(ocp.type_handlers.ArrayHandler, "serialize", slow)
  checkpointer = train_state.Checkpointer(str(workdir), 1, 10, asynchronous=False)
  try:
    assert checkpointer.save(3, _state(3), {"position": 3}, force=True)
  finally:
    checkpointer.close()
  assert f"saving checkpoint step 3 to {workdir}/checkpoints: waiting on storage for" in caplog.text
  assert train_state.committed_steps(workdir) == [1, 2, 3]
