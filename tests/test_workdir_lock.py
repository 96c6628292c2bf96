"""vit_jax/runtime/workdir_lock.py: the workdir lock as a lease (the entry point's cases are in
tests/test_faults.py)."""

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from tests.helpers import this_thread
from vit_jax.runtime import workdir_lock

FOREIGN = {"host": "t1v-n-old-w-0", "pid": 4242, "started": "2026-12-03 09:00:00 UTC"}


def _write(path, text, age_s):
  path.write_text(text)
  then = time.time() - age_s
  os.utime(path, (then, then))


def test_a_foreign_lock_holds_while_its_lease_runs_and_is_taken_over_after(tmp_path, caplog):
  path = tmp_path / workdir_lock.LOCK_FILE
  _write(path, json.dumps(FOREIGN), age_s=10)
  with pytest.raises(workdir_lock.WorkdirLocked) as e:
    with workdir_lock.lock(str(tmp_path), lease_s=60):
      pass
  assert str(e.value).startswith(
    f"{tmp_path} is in use by another run: pid 4242 on t1v-n-old-w-0, started 2026-12-03 "
    "09:00:00 UTC, lease renewed 10 s ago"
  )
  assert json.loads(path.read_text()) == FOREIGN  # untouched
  _write(path, json.dumps(FOREIGN), age_s=3600)
  with workdir_lock.lock(str(tmp_path), lease_s=60):
    assert json.loads(path.read_text())["pid"] == os.getpid()
  assert not path.exists()
  assert (
    f"took over the lock of {tmp_path} from pid 4242 on t1v-n-old-w-0, started 2026-12-03 "
    "09:00:00 UTC: its lease expired: not renewed for 3600 s (lease 60 s)"
  ) in caplog.text
  assert not list(tmp_path.iterdir())  # nothing left aside


@pytest.mark.parametrize("text", ["", "{not json", '{"pid": "4242"}', "[]"])
def test_an_empty_or_unreadable_lock_is_no_holder_once_older_than_the_lease(tmp_path, text):
  """Empty (a kill between the create and the write), not JSON, or JSON that is no lock record
  (tests/test_workdir_files.py tries many more)."""
  path = tmp_path / workdir_lock.LOCK_FILE
  _write(path, text, age_s=5)
  with pytest.raises(workdir_lock.WorkdirLocked, match="an empty or unreadable lock file, 5 s old"):
    with workdir_lock.lock(str(tmp_path), lease_s=60):
      pass
  _write(path, text, age_s=3 * 3600)
  with workdir_lock.lock(str(tmp_path), lease_s=60):
    assert json.loads(path.read_text())["pid"] == os.getpid()


_HOLDER = textwrap.dedent(
  """
  import sys, time
  from vit_jax.runtime import workdir_lock
  with workdir_lock.lock(sys.argv[1], lease_s=float(sys.argv[2])):
    print("held", flush=True)
    time.sleep(float(sys.argv[3]))
  """
)


def test_a_live_holder_renews_and_keeps_its_lock(tmp_path, monkeypatch):
  """A holder renews every quarter of its lease: seen from another host (this process told it
  is one) its lock never ages past the lease, so it is never taken over while it runs."""
  lease = 3.0
  holder = subprocess.Popen(
    [sys.executable, "-c", _HOLDER, str(tmp_path), str(lease), "7"],
    stdout=subprocess.PIPE, text=True,
  )  # fmt: skip
  assert holder.stdout.readline().strip() == "held"
  another = this_thread.only(lambda: "another-vm", socket.gethostname)  # the test's thread only
  monkeypatch.setattr(socket, "gethostname", another)
  path = tmp_path / workdir_lock.LOCK_FILE
  ages = []
  deadline = time.time() + 5
  while time.time() < deadline:
    ages.append(time.time() - path.stat().st_mtime)
    with pytest.raises(workdir_lock.WorkdirLocked, match=f"pid {holder.pid} on "):
      with workdir_lock.lock(str(tmp_path), lease_s=lease):
        pass
    time.sleep(0.25)
  assert max(ages) < lease, ages  # renewed every 0.75 s (unrenewed, it would reach 5 s)
  assert holder.wait(timeout=30) == 0
  assert not path.exists()  # released at its end


def test_of_launches_taking_over_at_once_one_wins(tmp_path):
  for attempt in range(5):
    workdir = tmp_path / f"w{attempt}"
    workdir.mkdir()
    _write(workdir / workdir_lock.LOCK_FILE, json.dumps(FOREIGN), age_s=3600)
    barrier, outcomes = threading.Barrier(4), []

    def take(i, workdir=workdir, barrier=barrier, outcomes=outcomes):
      store = workdir_lock._store(workdir / workdir_lock.LOCK_FILE)
      record = dict(host="h", pid=i, token=f"t{i}", lease_s=60)
      barrier.wait()
      outcomes.append(workdir_lock._acquire(store, record, str(workdir), 60))

    threads = [threading.Thread(target=take, args=(i,)) for i in range(4)]
    for t in threads:
      t.start()
    for t in threads:
      t.join()
    assert sum(o is None for o in outcomes) == 1, outcomes
    winner = json.loads((workdir / workdir_lock.LOCK_FILE).read_text())
    assert winner["token"] in {f"t{i}" for i in range(4)}
    assert sorted(p.name for p in workdir.iterdir()) == [workdir_lock.LOCK_FILE]


def test_a_renewal_between_the_read_and_the_take_over_keeps_the_holder(tmp_path):
  path = tmp_path / workdir_lock.LOCK_FILE
  _write(path, json.dumps(FOREIGN), age_s=3600)
  store = workdir_lock._store(path)
  seen = store.read()
  assert seen.age > 3500
  os.utime(path)  # the holder was alive after all: it renews
  assert not store.take_over(seen, json.dumps({"pid": os.getpid()}))
  assert json.loads(path.read_text()) == FOREIGN
  assert sorted(p.name for p in tmp_path.iterdir()) == [workdir_lock.LOCK_FILE]


def test_break_lock_names_what_it_removed(tmp_path):
  path = tmp_path / workdir_lock.LOCK_FILE
  assert workdir_lock.break_lock(str(tmp_path)) == f"--break_lock: {tmp_path} had no lock"
  _write(path, json.dumps(FOREIGN), age_s=1)
  assert workdir_lock.break_lock(str(tmp_path)) == (
    f"--break_lock: removed the lock of {tmp_path} held by pid 4242 on t1v-n-old-w-0, started "
    "2026-12-03 09:00:00 UTC"
  )
  assert not path.exists()


def test_a_lock_of_this_host_without_a_pid_is_judged_by_its_lease(tmp_path):
  """No process to look for: its age decides (it was once taken for a live process forever)."""
  path = tmp_path / workdir_lock.LOCK_FILE
  _write(path, json.dumps({"host": socket.gethostname()}), age_s=3600)
  with workdir_lock.lock(str(tmp_path), lease_s=60):
    assert json.loads(path.read_text())["pid"] == os.getpid()
