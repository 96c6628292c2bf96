"""A restore waiting on gs:// storage (slow): one object of a step answering 503 to every request,
against the local GCS API server (tests/helpers/gcs.py), through the entry point and in process.

The entry point's test needs a committed step on gs://: this module's own 2-step pretraining run
(tests/test_gcs.py's fixtures, made again here: tests/test_gcs.py is at its size limit).
"""

import re
import signal
import subprocess
import sys
import threading
import time

import jax
import pytest

from tests import test_gcs
from tests.test_gcs import BUCKET, REPO, ROOT, main_args, run
from vit_jax.checkpoint.state import train_state

pytestmark = pytest.mark.slow
# tests/test_gcs.py's module fixtures, made again for this module: the shards on gs://, a child's
# environment, and the 2-step pretraining run into gs://.../pretrain.
env, shards, pretrained = test_gcs.env, test_gcs.shards, test_gcs.pretrained


def test_a_restore_retries_a_failing_request_a_bounded_number_of_times(local_gcs, monkeypatch):
  """A restore attempt gives up on an object answering 503 after RESTORE_REQUEST_RETRIES (here
  1 retry; TensorStore's own default is 32, about 15 minutes), in the reads of the arrays'
  metadata and of the arrays: the retries are `Checkpointer`'s, on its schedule. Saves keep
  TensorStore's retries."""
  from vit_jax.checkpoint.state import restore_faults

  for key, value in local_gcs.env().items():
    monkeypatch.setenv(key, value)
  monkeypatch.setattr(restore_faults, "RETRY_DELAYS_S", (0.0,))
  monkeypatch.setattr(
    train_state, "RESTORE_REQUEST_RETRIES", {"max_retries": 1, "initial_delay": "0.1s"}
  )
  sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  state = {"step": jax.numpy.int32(1), "kernel": jax.numpy.ones((64, 3))}
  abstract = jax.tree_util.tree_map(
    lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), state
  )
  workdir = f"{ROOT}/bounded"
  checkpointer = train_state.Checkpointer(workdir, 1, 1, asynchronous=False)
  checkpointer.save(1, state, {"position": 1}, force=True)
  (data,) = [o for o in local_gcs.objects(BUCKET, "bounded/") if "/1/state/d/" in o]
  quoted = data.replace("/", "%2F")
  start = time.monotonic()
  with local_gcs.faults(lambda method, path: 503 if quoted in path else None):
    # Given up on by the retries in seconds; a stop after 60 s ends a regression's 15 minutes.
    with pytest.raises(restore_faults.CheckpointRestoreError, match="failed 2 times"):
      checkpointer.restore_latest(abstract, lambda: time.monotonic() > start + 60)
  checkpointer.close()
  answered = [r for r in local_gcs.requests if r[2] == 503 and quoted in r[1]]
  assert len(answered) == 2 * 2  # 2 attempts, each a request and its one retry
  assert train_state.committed_steps(workdir) == [1]


def _copy_objects(local_gcs, source: str, target: str) -> None:
  """Copies the objects under `source/` to `target/` (straight on the server)."""
  for name in local_gcs.objects(BUCKET, f"{source}/"):
    copy = f"{target}/{name.removeprefix(source + '/')}"
    local_gcs.upload(BUCKET, copy, local_gcs.download(BUCKET, name))


def test_a_restore_waiting_on_storage_says_so_and_ends_on_sigterm(env, pretrained, local_gcs):
  """One object of step 2 answering 503 to every request: the restore says what it waits for
  (vit_jax.checkpoint.state.storage_wait: nothing said for 30 s), each attempt gives up after
  TensorStore's bounded retries and is retried, and SIGTERM in the middle of an attempt ends the
  run within seconds with one line, exit 1, nothing moved (it used to wait out TensorStore's 32
  retries, 15 minutes, in silence, before acting on the signal). The same command without the
  fault then resumes from step 2."""
  prefix = "outage"
  _copy_objects(local_gcs, "pretrain", prefix)
  before = local_gcs.objects(BUCKET, prefix)
  # The step's one data file a restore reads (the merged database's; Orbax's per-process files
  # were merged into it by the save).
  (data,) = [o for o in before if o.startswith(f"{prefix}/checkpoints/2/state/d/")]
  quoted = data.replace("/", "%2F")
  doing = f"restoring checkpoint step 2 from {ROOT}/{prefix}/checkpoints"
  notice = re.compile(rf"{doing}: waiting on storage for (\d+) s \(attempt (\d) of 4\)$")
  retry = re.compile(rf"{doing} failed \(.*\); retrying in 2 s \(retry 1 of 3\)$")
  with local_gcs.faults(lambda method, path: 503 if quoted in path else None):
    proc = subprocess.Popen(
      [sys.executable, *main_args(f"{ROOT}/{prefix}")], env=env, cwd=REPO,
      stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    lines, noticed, retried = [], threading.Event(), threading.Event()

    def read():
      for line in proc.stderr:
        lines.append(line.rstrip())
        for pattern, event in ((notice, noticed), (retry, retried)):
          if pattern.search(lines[-1]):
            event.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
      # Startup (imports, the mesh, the model: 10-30 s here), then the first attempt: its
      # notice at 30 s, its end after TensorStore's 5 retries (about 33 s here).
      assert noticed.wait(240) and retried.wait(120), "\n".join(lines[-20:])
      time.sleep(3)  # into the second attempt (the retry waits 2 s)
      proc.send_signal(signal.SIGTERM)
      sent = time.monotonic()
      code = proc.wait(timeout=120)
      took = time.monotonic() - sent
    finally:
      proc.kill()
    reader.join(10)
  faults = [r for r in local_gcs.requests if r[2] == 503 and quoted in r[1]]
  last = [x for x in lines if x.strip()][-1]
  first = next(notice.search(x) for x in lines if notice.search(x))
  print(f"\n{first[0]}\nSIGTERM: exit {code} after {took:.1f} s: {last}")
  print(f"{len(faults)} requests of {data} answered 503")
  # The first notice 30 s into the first attempt (a slice late at most).
  assert first[2] == "1" and int(first[1]) in range(30, 33), first[0]
  # Attempt 1: a request and TensorStore's 5 retries; attempt 2: at least its first request.
  assert len(faults) >= 7, faults
  assert code == 1 and took < 15, (code, took)  # storage_wait.STOP_GRACE_S (5 s) and the exit
  assert last.startswith(
    f"vit_jax: error: CheckpointRestoreError: {doing}: a stop was requested while waiting on "
    "storage for "
  ), last
  assert " s (attempt 2 of 4); nothing was moved. Rerun the same command to continue" in last
  after = local_gcs.objects(BUCKET, prefix)
  assert after == before  # nothing moved aside, nothing written, the lock released

  code, last = run(env, *main_args(f"{ROOT}/{prefix}", "--config.total_steps=4"))
  assert code == 0, last
  objects = local_gcs.objects(BUCKET, prefix)
  assert f"{prefix}/checkpoints/4/commit_success.txt" in objects
  assert not any(o.startswith(f"{prefix}/{train_state.BROKEN_DIR}/") for o in objects)
