"""What a pod run meets, through the real entry point: signals (also inside an evaluation), a
broken latest checkpoint, a restore error that is no evidence of one, a full disk, a second
launch on the same workdir, and config mistakes.

Each run is `python -m vit_jax.main` in a child process (a signal sent by a patched data
iterator at a fixed batch, so the step is deterministic); the final parameters of interrupted
and resumed runs are compared bitwise with an uninterrupted run of the same command.
"""

import contextlib
import json
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import time

import pytest

from tests.helpers import REPO, fault_injection, small_disk, trees, xla_env
from vit_jax.checkpoint.state import train_state
from vit_jax.runtime import workdir as workdir_lib

TOTAL = 40
ARGS = [
  "--config=configs/pretrain.py:dataset=fashion_mnist,runlocal",
  f"--config.total_steps={TOTAL}",
  "--config.checkpoint.every_steps=10",
  "--config.checkpoint.keep=10",
  "--config.log_every_steps=10",
  "--config.evals.val.every_steps=0",  # the classification evaluator at the end only
  # No few-shot evaluators (2 CPU-s per finished run; the faults are the subject here).
  "--config.evals.fewshot_animal_mnist.every_steps=-1",
  "--config.evals.fewshot_mnist_5k.every_steps=-1",
]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
  """The children's environment: one process, one device (the compilation cache is the run's,
  tests/conftest.py)."""
  return xla_env.child_env(1, TF_CPP_MIN_LOG_LEVEL="2")


def _run(env, workdir, extra=(), prefix=(), args=ARGS, **fault) -> tuple[int, list[str]]:
  """Runs the entry point (with `fault`: FAULT_AT=..., ...) into `workdir`, through `prefix`
  (e.g. a small disk's nsenter); (status, the terminal's non-empty lines, stdout then stderr)."""
  # Without a fault, the entry point itself (which imports TensorFlow only once it builds the
  # input pipeline: a config mistake ends in ~2 s instead of ~10).
  flags = [*args, f"--workdir={workdir}", *extra]
  command = (
    fault_injection.command(*flags) if fault else [sys.executable, "-m", "vit_jax.main", *flags]
  )
  proc = subprocess.run(
    [*prefix, *command],
    env=fault_injection.child_env(env, **fault),
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=600,
  )
  return proc.returncode, [
    line for line in proc.stdout.splitlines() + proc.stderr.splitlines() if line.strip()
  ]


def _main(env, workdir, extra=(), **fault) -> tuple[int, str]:
  """`_run`'s status and last terminal line of this project ('vit_jax: ...'), or the output's
  tail if there is none."""
  code, lines = _run(env, workdir, extra, **fault)
  vit_lines = [line for line in lines if line.startswith("vit_jax: ")]
  last = vit_lines[-1] if vit_lines else "\n".join(lines[-30:])
  print(f"exit {code}: {last}")  # shown with -s: the closing note's figures
  return code, last


@pytest.fixture(scope="module")
def reference(env, tmp_path_factory):
  """The uninterrupted run's workdir."""
  workdir = tmp_path_factory.mktemp("reference")
  code, last = _main(env, workdir)
  assert code == 0, last
  assert train_state.committed_steps(workdir)[-1] == TOTAL
  return workdir


def _largest_data_file(step_dir: pathlib.Path) -> pathlib.Path:
  state = step_dir / "state"
  # Array data lives under state/d/ (OCDBT); the path above it may hold a '/d/' of its own.
  files = [p for p in state.rglob("*") if p.is_file() and "d" in p.relative_to(state).parts[:-1]]
  return max(files, key=lambda p: p.stat().st_size)


@pytest.fixture
def disk(tmp_path):
  """An 8 MiB disk (a tmpfs in a user namespace: any user, no root)."""
  reason = small_disk.unavailable_reason()
  if reason:
    pytest.skip(f"no small disk on this machine: {reason}")
  with small_disk.small_disk(tmp_path / "disk", "8m") as d:
    yield d


@pytest.mark.long
def test_signals_a_broken_checkpoint_and_a_full_disk_resume_exactly(env, reference, tmp_path):
  """One run's life on an 8 MiB disk: SIGTERM, a truncated checkpoint, Ctrl-C twice, the disk
  filling up; every rerun of the same command continues, and the last one ends with the
  parameters of the uninterrupted run, bitwise. (Where this user can make no small disk, the
  same without the full disk, and the test reports the part it skipped.)"""
  no_disk = small_disk.unavailable_reason()
  with contextlib.ExitStack() as stack:
    disk = None if no_disk else stack.enter_context(small_disk.small_disk(tmp_path / "d", "8m"))
    _a_runs_life(env, reference, disk, tmp_path)
  if no_disk:
    pytest.skip(f"ran without the full disk: no small disk on this machine: {no_disk}")


def _a_runs_life(env, reference, disk, tmp_path):
  # The workdir as the runs see it, and as this test does.
  workdir, view = (disk.path / "run", disk.view / "run") if disk else (tmp_path / "run",) * 2
  prefix = disk.prefix(REPO) if disk else ()

  def main(**fault):
    return _main(env, workdir, prefix=prefix, **fault)

  # SIGTERM while step 25 runs: that step is saved, exit 143, one line saying where.
  code, last = main(at=25)
  assert code == 143, last
  assert last.startswith(f"vit_jax: stopped by SIGTERM at step 25 of {TOTAL}; saved to "), last
  assert train_state.committed_steps(view) == [10, 20, 25]
  assert not (view / workdir_lib.LOCK_FILE).exists()  # released

  # Then a data file of step 25 truncated. The rerun names the broken step, moves it aside
  # (kept) and resumes from step 20, without replaying: Ctrl-C (SIGINT) at its 3rd batch (step
  # 23), and a second SIGINT while step 23 is being written: exits at once (130), step 23 never
  # committed.
  broken = _largest_data_file(view / "checkpoints" / "25")
  with open(broken, "r+b") as f:
    f.truncate(100)
  logs = set((view / "logs").glob("*.log"))
  code, last = main(signal="SIGINT", at=3, second_at=23)
  assert code == 130, last
  assert "second signal (SIGINT): exiting now without saving" in last, last
  _assert_resumed_from_20(view, broken, logs)
  assert train_state.committed_steps(view) == [10, 20]

  if not disk:
    code, last = main()
    assert code == 0, last
    trees.assert_same_params(view, reference)
    return
  # The disk fills up, leaving 64 KiB: less than a step (about 450 KiB). The rerun resumes from
  # step 20 and ends in one line when the save of step 30 (or the metrics writer after it: which
  # meets the full disk first is a race) finds no space; the line names the workdir and the step
  # a rerun continues from.
  filler = disk.view / "filler"
  with open(filler, "wb") as f:
    os.posix_fallocate(f.fileno(), 0, disk.free_bytes() - 64 * 1024)
  code, last = main()
  assert code == 1, last
  assert f"CheckpointSaveError: no space left on the device of {workdir} while " in last, last
  assert "MiB are free; the unfinished step was removed, step 20 is intact" in last, last
  assert train_state.committed_steps(view) == [10, 20]
  assert not [p for p in (view / "checkpoints").iterdir() if "tmp" in p.name]

  # Space freed: the same command finishes, with the parameters of the uninterrupted run.
  filler.unlink()
  code, last = main()
  assert code == 0, last
  trees.assert_same_params(view, reference)


def _assert_resumed_from_20(view, broken, logs_before):
  """The run since `logs_before` named the broken step 25, moved it aside (kept) and resumed from
  step 20."""
  moved = view / train_state.BROKEN_DIR / "25"
  kept = moved / broken.relative_to(view / "checkpoints" / "25")
  assert (moved / "state").is_dir() and kept.exists(), kept
  assert 25 not in train_state.committed_steps(view)
  (log,) = set((view / "logs").glob("*.log")) - logs_before
  text = log.read_text()
  assert "checkpoint step 25 does not restore (a file of the step is truncated or missing: " in text
  assert re.search(rf"; moved aside to \S*/{train_state.BROKEN_DIR}/25\n", text)
  # The warning on the terminal (and in the log) naming both steps and why.
  assert (
    "resuming from step 20, older than the newest step 25, which does not restore: a file of "
    "the step is truncated or missing: OUT_OF_RANGE: " in text
  )


def _copy(workdir, tmp_path, name) -> pathlib.Path:
  """A copy of a finished run's workdir (without its logs)."""
  copy = tmp_path / name
  shutil.copytree(workdir, copy, ignore=shutil.ignore_patterns("logs"))
  return copy


def _last(lines) -> str:
  vit_lines = [line for line in lines if line.startswith("vit_jax: ")]
  return vit_lines[-1] if vit_lines else "\n".join(lines[-30:])


@pytest.mark.long
def test_only_evidence_moves_a_step_aside(env, reference, tmp_path):
  """On a copy of the finished reference run (steps 10 to 40): an I/O error (EIO) on every read
  of step 40 is retried, then ends the run with one line, nothing moved; on the first two reads
  only, it is retried and the run resumes from step 40. (Evidence, a truncated array file, moves
  a step aside: test_signals_a_broken_checkpoint_and_a_full_disk_resume_exactly.)"""
  workdir = _copy(reference, tmp_path, "run")
  steps = train_state.committed_steps(workdir)
  assert steps == [10, 20, 30, 40]
  moved = workdir / train_state.BROKEN_DIR

  code, lines = _run(env, workdir, restore_errors=100)
  print(f"exit {code}: {_last(lines)}")
  assert code == 1, lines[-30:]
  assert _last(lines).startswith(
    f"vit_jax: error: CheckpointRestoreError: restoring checkpoint step 40 from {workdir}/"
    "checkpoints failed 4 times, without evidence that the step is broken: OSError: [Errno 5] "
    "injected read error: "
  ), _last(lines)
  assert "nothing was moved" in _last(lines)
  assert train_state.committed_steps(workdir) == steps and not moved.exists()

  logs = set((workdir / "logs").glob("*.log"))
  code, lines = _run(env, workdir, restore_errors=2)
  print(f"exit {code}: {_last(lines)}")
  assert code == 0, lines[-30:]
  retries = [line for line in lines if "restoring checkpoint step 40 from" in line]
  assert len(retries) == 2 and all("retrying in 0.1 s" in line for line in retries), lines
  (log,) = set((workdir / "logs").glob("*.log")) - logs
  assert f"checkpoint: restored step 40 from {workdir}/checkpoints" in log.read_text()
  assert train_state.committed_steps(workdir) == steps and not moved.exists()


def _run_timed(env, workdir, args, **fault) -> tuple[int, list[str], float]:
  """`_run` with `args`, and the seconds from the fault's marker line to the process's exit."""
  proc = subprocess.Popen(
    fault_injection.command(*args, f"--workdir={workdir}"),
    env=fault_injection.child_env(env, **fault),
    cwd=REPO,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
  )
  lines, signalled = [], None
  for line in proc.stdout:
    if line.startswith("[fault: "):
      signalled = time.monotonic()
    if line.strip():
      lines.append(line.rstrip("\n"))
  proc.wait(timeout=600)
  assert signalled is not None, lines[-30:]
  return proc.returncode, lines, time.monotonic() - signalled


# An evaluation every 15 steps of 400 examples in batches of 8: 50 batches.
_SLOW_EVAL = [
  *ARGS,
  "--config.evals.val.every_steps=15",
  "--config.evals.val.max_examples=400",
  "--config.eval_batch_size=8",
]


@pytest.mark.long
def test_sigterm_inside_an_evaluation_stops_within_seconds(env, reference, tmp_path):
  """SIGTERM at the 3rd batch of step 15's evaluation, each batch made 0.5 s slower (the other
  47 batches would take 23.5 s more): the evaluation is abandoned, step 15 saved, exit 143
  within 15 s of the signal (measured: 3.6 s, under a load of 5 on 2 cores). The same command
  then finishes, bitwise as the uninterrupted run."""
  workdir = tmp_path / "run"
  code, lines, seconds = _run_timed(env, workdir, _SLOW_EVAL, eval_at=3, eval_delay=0.5)
  print(f"exit {code} {seconds:.1f} s after the signal: {_last(lines)}")
  assert code == 143, lines[-30:]
  assert _last(lines) == (
    f"vit_jax: stopped by SIGTERM at step 15 of {TOTAL}; saved to {workdir}/checkpoints. The "
    "same command continues from step 15."
  )
  assert seconds <= 15, f"exited {seconds:.1f} s after the signal"
  assert train_state.committed_steps(workdir) == [10, 15]
  code, last = _main(env, workdir)
  assert code == 0, last
  trees.assert_same_params(workdir, reference)


@pytest.mark.slow
def test_sigterm_during_a_restore_stops_once_it_returns(env, reference, tmp_path):
  """SIGTERM while step 40 is being read: the run stops as the restore returns, before any
  compile or step, with nothing new to save."""
  workdir = _copy(reference, tmp_path, "run")
  code, lines = _run(env, workdir, [f"--config.total_steps={TOTAL + 10}"], restore_at=1)
  print(f"exit {code}: {_last(lines)}")
  assert code == 143, lines[-30:]
  assert _last(lines) == (
    f"vit_jax: stopped by SIGTERM at step 40 of {TOTAL + 10}; saved to {workdir}/checkpoints. "
    "The same command continues from step 40."
  )
  assert not [line for line in lines if f"/{TOTAL + 10} (" in line]  # no step trained
  assert train_state.committed_steps(workdir) == [10, 20, 30, 40]


# A wider model saving every 2 steps asynchronously: several of Orbax's background writes are in
# flight when the disk fills up, and each fails on its own thread after the run's error.
_WIDE = [
  "--config=configs/pretrain.py:dataset=fashion_mnist,runlocal",
  "--config.total_steps=40",
  "--config.model.hidden_size=128",
  "--config.model.mlp_dim=512",
  "--config.checkpoint.every_steps=2",
  "--config.checkpoint.keep=10",
  "--config.evals.val.every_steps=0",
  "--config.evals.fewshot_animal_mnist.every_steps=-1",
  "--config.evals.fewshot_mnist_5k.every_steps=-1",
]


# The failing writes' timing varies from run to run: once in the default run, three more times in
# the slow one. tests/test_console.py checks the mechanism itself deterministically.
@pytest.mark.parametrize(
  "attempt", [0, *(pytest.param(i, marks=pytest.mark.slow) for i in (1, 2, 3))]
)
def test_nothing_reaches_the_terminal_after_a_full_disks_line(env, disk, attempt):
  code, lines = _run(env, disk.path / "run", prefix=disk.prefix(REPO), args=_WIDE)
  assert code == 1, "\n".join(lines[-30:])
  ends = [i for i, line in enumerate(lines) if line.startswith("vit_jax: error: ")]
  assert ends, "\n".join(lines[-30:])
  assert "CheckpointSaveError: no space left on the device of" in lines[ends[0]], lines[ends[0]]
  assert lines[ends[0] + 1 :] == [], "after the line:\n" + "\n".join(lines[ends[0] :][:40])
  # Before it: the log's name and the project's progress lines, no traceback.
  assert not [line for line in lines if "Traceback" in line or "RESOURCE_EXHAUSTED" in line]


def test_a_second_launch_on_a_held_workdir_refuses(env, tmp_path):
  workdir = tmp_path / "held"
  with workdir_lib.lock(str(workdir)):  # a live run of this process holds it
    code, last = _main(env, workdir)
  assert code == 1, last
  assert f"WorkdirLocked: {workdir} is in use by another run: pid {os.getpid()} on " in last
  assert not (workdir / "checkpoints").exists()


def test_a_dead_runs_lock_from_a_replaced_vm(env, tmp_path, reference):
  """The lock left by a run that died on another machine (a preempted, replaced TPU VM): a
  restart stops with one line while its lease runs, takes it over once the lease has expired
  (one line naming whose and why) and continues as the uninterrupted run; --break_lock takes
  a fresh one at once."""
  workdir = tmp_path / "replaced"
  workdir.mkdir()
  lock = workdir / workdir_lib.LOCK_FILE
  holder = {"host": "t1v-n-old-w-0", "pid": 4242, "started": "2026-12-03 09:00:00 UTC"}
  lock.write_text(json.dumps(holder))
  code, last = _main(env, workdir)
  assert code == 1
  assert f"WorkdirLocked: {workdir} is in use by another run: pid 4242 on t1v-n-old-w-0" in last
  assert "--break_lock" in last and not (workdir / "checkpoints").exists()
  hour_ago = time.time() - 3600
  os.utime(lock, (hour_ago, hour_ago))
  code, lines = _run(env, workdir)
  assert code == 0, lines[-5:]
  took = [line for line in lines if "took over the lock of" in line]
  assert len(took) == 1 and "pid 4242 on t1v-n-old-w-0" in took[0], lines
  assert re.search(r"its lease expired: not renewed for 36\d\d s \(lease 300 s\)", took[0])
  trees.assert_same_params(workdir, reference)
  assert not lock.exists()

  fresh = tmp_path / "broken"
  fresh.mkdir()
  (fresh / workdir_lib.LOCK_FILE).write_text(json.dumps(holder))
  code, lines = _run(env, fresh, ["--break_lock", f"--config.total_steps={TOTAL // 4}"])
  assert code == 0, lines[-5:]
  assert [line for line in lines if "--break_lock: removed the lock of" in line], lines


def test_a_stale_lock_is_taken_over(tmp_path, caplog):
  dead = subprocess.run(
    [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True
  )
  pid = int(dead.stdout)  # exited: its pid names no live process (or another process's start)
  path = tmp_path / workdir_lib.LOCK_FILE
  path.write_text(f'{{"host": "{socket.gethostname()}", "pid": {pid}, "process_start": "1"}}')
  with workdir_lib.lock(str(tmp_path)):
    assert f'"pid": {os.getpid()}' in path.read_text()
  assert not path.exists()
  assert "is no longer running" in caplog.text


@pytest.mark.parametrize(
  "extra, expected",
  [
    (
      ["--config=configs/pretrain.py:dataset=fashion_mnst,runlocal"],
      "ValueError: pretrain dataset='fashion_mnst' is not one of [",
    ),
    (
      ["--config.modle.name=B/16"],
      "UnknownFieldError: --config.modle.name: the config has no field 'modle'; did you mean "
      "'model.name'?",
    ),
    (
      ["--config.learning_rat=0.1"],
      "UnknownFieldError: --config.learning_rat: the config has no field 'learning_rat'; did you "
      "mean 'schedule.base_lr'?",
    ),
    (["--config=configs/pretrain.py:datset=x"], "unknown config argument 'datset'; did you mean"),
  ],
)
def test_config_mistakes_are_one_line(env, tmp_path, extra, expected):
  code, last = _main(env, tmp_path / "w", extra)
  assert code == 1, last
  assert last.startswith("vit_jax: error: ") and expected in last, last
  assert "(full log: " in last


def test_an_unwritable_workdir_is_one_line(env, tmp_path):
  blocker = tmp_path / "file"
  blocker.write_text("not a directory")
  code, last = _main(env, blocker / "w")
  assert code == 1, last
  assert last.startswith(f"vit_jax: error: NotADirectoryError: cannot write to --workdir={blocker}")
