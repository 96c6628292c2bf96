"""libtpu only where it is used (vit_jax.runtime.libtpu_lock, vit_jax.runtime.process).

A command on a machine without a TPU never loads libtpu nor takes its lock, /tmp/libtpu_lockfile;
the planner compiles for a TPU topology beside other processes, one holding that lock included;
where it keeps the lock (a TPU VM, here ALLOW_MULTIPLE_LIBTPU_LOAD=0) and finds it held, it ends
in one line naming the file and its holder. The tests of two processes at once need libtpu and
are skipped without it.
"""

import fcntl
import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.helpers.libtpu_process import LIBTPU_TEST_LOCK, REPO, needs_libtpu
from vit_jax.kernels import xla_cpu_memory
from vit_jax.runtime import libtpu_lock

# What a command leaves libtpu to decide: its lock and JAX's platforms.
_CHOSEN = ("JAX_PLATFORMS", libtpu_lock.ALLOW, "TPU_SKIP_MDS_QUERY", "TPU_WORKER_HOSTNAMES")
PLAN = [
  sys.executable, "-m", "vit_jax.tools.plan",
  "--config=configs/pretrain.py:dataset=jft,model=testing,epochs=7,lr=1e-3",
  "--config.dataset.image_size=32", "--config.batch_size=16", "--topology=v3:2x2",
]  # fmt: skip
# Reports its pid once JAX's backends have started (a training run's next step), then waits
# for its stdin to close.
_STARTED = textwrap.dedent(
  """
  import json, os, sys
  def started():
    import jax
    jax.devices()
    print("STARTED " + json.dumps(dict(pid=os.getpid(), platforms=jax.config.jax_platforms)),
          flush=True)
    sys.stdin.read()
  """
)
# `python -m vit_jax.main`, as runpy runs it; its stage does not exist, so it fails in one line
# once its process is set up, and JAX's backends start at its exit.
COMMAND = _STARTED + textwrap.dedent(
  """
  import atexit, runpy
  atexit.register(started)
  sys.argv = ["vit_jax.main", *sys.argv[1:]]
  runpy.run_module("vit_jax.main", run_name="__main__", alter_sys=True)
  """
)
# A library caller that imported JAX before it called configure().
LIBRARY = _STARTED + textwrap.dedent(
  """
  import jax
  from vit_jax.runtime import process
  process.configure()
  started()
  """
)
# Holds a POSIX lock on libtpu's lock file as libtpu does (waiting for it, at most 5 minutes, if
# another process has it; a file unlinked by its last holder is opened again) until its stdin
# closes.
HOLDER = textwrap.dedent(
  f"""
  import fcntl, os, signal, sys
  signal.alarm(300)
  while True:
    fd = os.open({libtpu_lock.LOCKFILE!r}, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.lockf(fd, fcntl.LOCK_EX)
    try:
      if os.stat({libtpu_lock.LOCKFILE!r}).st_ino == os.fstat(fd).st_ino:
        break
    except FileNotFoundError:
      pass
    os.close(fd)
  signal.alarm(0)
  print("HOLDING", flush=True)
  sys.stdin.read()
  os.unlink({libtpu_lock.LOCKFILE!r})  # as libtpu does at its exit, while it holds the lock
  """
)


def _env(**extra) -> dict[str, str]:
  env = {k: v for k, v in os.environ.items() if k not in _CHOSEN and not k.startswith("PYTEST_")}
  return env | dict(TF_CPP_MIN_LOG_LEVEL="2") | extra


def _start(code: str, *args: str, env: dict[str, str]) -> subprocess.Popen:
  return subprocess.Popen(
    [sys.executable, "-c", code, *args],
    stdin=subprocess.PIPE,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    cwd=REPO,
    env=env,
  )


def _first_line(proc: subprocess.Popen, prefix: str) -> str:
  """The first stdout line of `proc` starting with `prefix` (its output so far if it ends)."""
  for line in proc.stdout:
    if line.startswith(prefix):
      return line[len(prefix) :].strip()
  proc.kill()
  held = f"; {libtpu_lock.LOCKFILE} held by {libtpu_lock.holder()}"
  pytest.fail(f"no {prefix!r} line; exit {proc.wait()}{held}: {proc.stderr.read()[-3000:]}")


def _finish(proc: subprocess.Popen) -> tuple[int, str]:
  """Closes the stdin of `proc`, waits for it; its exit status and stderr."""
  _, err = proc.communicate(timeout=300)
  return proc.returncode, err


def _plan(**env: str) -> subprocess.CompletedProcess:
  """The planner on the test model for a v3:2x2, once no other test compiles with libtpu."""
  with open(LIBTPU_TEST_LOCK, "a") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    return subprocess.run(
      PLAN, capture_output=True, text=True, timeout=600, cwd=REPO, env=_env(**env)
    )


def _uses_libtpu(pid: int) -> list[str]:
  """What says the process loaded libtpu: libtpu.so mapped, its lock file open."""
  maps = [line.split()[-1] for line in open(f"/proc/{pid}/maps") if "libtpu" in line]
  fds = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
  return sorted(set(maps)) + [f for f in fds if f.startswith(libtpu_lock.LOCKFILE)]


# The processes beside the planner start JAX on the CPU, and the planner skips libtpu's lock, only
# where no accelerator is found.
no_accelerator_here = pytest.mark.skipif(
  xla_cpu_memory.device_node(xla_cpu_memory.ACCELERATOR_NODES) is not None,
  reason="an accelerator's device node is here",
)


@needs_libtpu
@no_accelerator_here
def test_the_planner_compiles_beside_a_command_and_a_holder_of_libtpus_lock(tmp_path):
  """The entry point and a library caller that imported JAX first, both set up by configure()
  with their backends started, map no libtpu and leave its lock file alone; the planner
  compiles while they run and another process holds libtpu's lock."""
  args = ["--config=configs/pretrain.py:dataset=fashion_mnist,runlocal", "--config.stage=nothing"]
  command = _start(COMMAND, *args, f"--workdir={tmp_path / 'w'}", env=_env())
  library = _start(LIBRARY, env=_env())
  holder = _start(HOLDER, env=_env())
  try:
    for proc in (command, library):
      started = json.loads(_first_line(proc, "STARTED "))
      assert started["platforms"] == "cpu"
      assert _uses_libtpu(started["pid"]) == []
    _first_line(holder, "HOLDING")
    out = _plan()
  finally:
    status, err = _finish(command)
    _finish(library)
    _finish(holder)
  assert status == 1 and "config.stage='nothing'" in err, err[-3000:]
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.startswith("v3:2x2: 8 × TPU v3, mesh {'data': 8, 'fsdp': 1, 'model': 1}")


@needs_libtpu
@no_accelerator_here
def test_a_planner_keeping_libtpus_lock_names_its_holder_in_one_line():
  """With libtpu's lock kept (ALLOW_MULTIPLE_LIBTPU_LOAD=0, as on a TPU VM) and held by another
  process: one line naming the file and the holder, and no advice to delete the file."""
  holder = _start(HOLDER, env=_env())
  try:
    _first_line(holder, "HOLDING")
    held = _plan(**{libtpu_lock.ALLOW: "0"})
  finally:
    _finish(holder)
  assert held.returncode == 1 and held.stdout == ""
  last = held.stderr.strip().splitlines()[-1]
  assert last.startswith(
    f"plan: error: RuntimeError: libtpu's lock /tmp/libtpu_lockfile is held by process "
    f"{holder.pid} ({sys.executable} -c "
  ), held.stderr[-3000:]
  assert "leave the file in place" in last
  assert "Traceback" not in held.stderr and "rm /tmp/libtpu_lockfile" not in held.stderr


def test_holder_names_the_process_that_locks_the_file(tmp_path):
  path = str(tmp_path / "lockfile")
  open(path, "w").close()
  assert libtpu_lock.holder(path) is None
  assert libtpu_lock.holder(str(tmp_path / "absent")) is None
  code = HOLDER.replace(repr(libtpu_lock.LOCKFILE), repr(path))
  holder = _start(code, env=_env())
  try:
    _first_line(holder, "HOLDING")
    text = " ".join(f"{sys.executable} -c {code}".split())  # its command line, on one line
    assert libtpu_lock.holder(path) == f"process {holder.pid} ({text[:120]}...)"
    assert f"{path} is held by process {holder.pid} (" in libtpu_lock.held_message(path)
  finally:
    _finish(holder)
  assert libtpu_lock.holder(path) is None


def test_topology_desc_skips_the_lock_only_without_a_tpu(monkeypatch, tmp_path):
  """ALLOW_MULTIPLE_LIBTPU_LOAD=1 set where no TPU node is found (a value of the user's kept);
  libtpu's lock error becomes one line, any other error passes as it was."""
  from jax.experimental import topologies  # noqa: PLC0415

  def fails(topology, platform, **kwargs):
    raise RuntimeError(message)

  monkeypatch.setattr(topologies, "get_topology_desc", fails)
  monkeypatch.setattr(libtpu_lock, "holder", lambda path=libtpu_lock.LOCKFILE: "process 7")
  monkeypatch.delenv(libtpu_lock.ALLOW, raising=False)
  monkeypatch.setattr(xla_cpu_memory, "TPU_NODES", (str(tmp_path / "accel*"),))
  locked = 'ABORTED: Internal error ... lockfile. Run "$ sudo rm /tmp/libtpu_lockfile".'
  message = locked
  with pytest.raises(RuntimeError, match=r"^libtpu's lock /tmp/libtpu_lockfile is held by "):
    libtpu_lock.topology_desc("v3:2x2")
  assert os.environ[libtpu_lock.ALLOW] == "1"
  monkeypatch.setenv(libtpu_lock.ALLOW, "0")
  message = "INVALID_ARGUMENT: unknown topology"
  with pytest.raises(RuntimeError, match="^INVALID_ARGUMENT"):
    libtpu_lock.topology_desc("v3:2x2")
  assert os.environ[libtpu_lock.ALLOW] == "0"
  monkeypatch.delenv(libtpu_lock.ALLOW)
  (tmp_path / "accel0").touch()  # a TPU here: the lock kept
  message = locked
  with pytest.raises(RuntimeError, match="is held by process 7: one process at a time"):
    libtpu_lock.topology_desc("v3:2x2")
  assert libtpu_lock.ALLOW not in os.environ
