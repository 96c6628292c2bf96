"""The files a run reads from its workdir when it (re)starts never end it in a traceback.

Each file's reader meets a small fuzzer of contents (`_variants`: its valid form, each value
replaced by values of other types, each key removed, an extra key in each object, another top
level, null, an empty file, bytes that are not UTF-8, the valid text cut in half), and each
outcome is asserted: the file is used; or set aside (renamed `<name>.bad-<time>`, its bytes kept)
with a warning naming it; or the run is refused in one line naming it. Through the entry point
(`python -m vit_jax.main`, a few steps): a `goodput.json` of another shape is set aside and the
run finishes; a broken `config.json` beside checkpoints is refused in one line; an unusable
`checkpoint.local.dir` is named in one line. The decisions are in each reader's docstring
(vit_jax.runtime.goodput, workdir, workdir_lock, profiling, vit_jax.checkpoint.state.local_tier).
"""

import copy
import functools
import json
import logging
import math
import operator
import os
import pathlib
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from typing import Any

import jax
import ml_collections
import pytest

from tests.helpers import REPO, xla_env
from vit_jax.checkpoint import loader
from vit_jax.checkpoint.state import local_tier
from vit_jax.configs import pretrain
from vit_jax.runtime import cli, console, goodput, json_file, profiling, workdir, workdir_lock
from vit_jax.tools import goodput as goodput_tool

_WRONG = ("x", None, [], {}, True, -1, 1.5, 10**30, math.nan)


# --------------------------------------------------------------------------------------------
# The fuzzer.


def _paths(value: Any, path: tuple = ()) -> Iterator[tuple]:
  """The path of every value inside `value` (object keys and array indices), outermost first."""
  if not isinstance(value, dict | list):
    return
  for key, item in value.items() if isinstance(value, dict) else enumerate(value):
    yield (*path, key)
    yield from _paths(item, (*path, key))


_REMOVE = object()


def _with(value: Any, path: tuple, new: Any = _REMOVE) -> Any:
  """A copy of `value` with the item at `path` set to `new` (or removed)."""
  out = copy.deepcopy(value)
  parent = out
  for key in path[:-1]:
    parent = parent[key]
  if new is _REMOVE:
    del parent[path[-1]]
  else:
    parent[path[-1]] = new
  return out


def _dump(value: Any) -> bytes:
  return json.dumps(value).encode()


def _variants(valid: Any, wrong: tuple = _WRONG) -> Iterator[tuple[str, bytes]]:
  """(label, the file's bytes) for the fuzzer's shapes of `valid` (see the module docstring)."""
  yield "valid", _dump(valid)
  for top in (None, [], "x", 3, True):
    yield f"top level {top!r}", _dump(top)
  yield "empty", b""
  yield "bytes", bytes(range(256))
  yield "truncated", _dump(valid)[: len(_dump(valid)) // 2]
  for path in _paths(valid):
    name = ".".join(map(str, path))
    for bad in wrong:
      yield f"{name}={bad!r}", _dump(_with(valid, path, bad))
    if isinstance(path[-1], str):
      yield f"{name} removed", _dump(_with(valid, path))
  for path in [(), *_paths(valid)]:
    if not isinstance(functools.reduce(operator.getitem, path, valid), dict):
      continue
    yield (
      f"{'.'.join(map(str, path)) or 'top'} + an extra key",
      _dump(_with(valid, (*path, "zz_extra"), 1)),
    )


def _set_aside(directory: pathlib.Path, name: str) -> list[pathlib.Path]:
  return sorted(directory.glob(f"{name}.bad-*"))


def _assert_set_aside(directory, name, data, caplog):
  """`name` in `directory` was renamed aside whole, with a warning naming it."""
  (aside,) = _set_aside(directory, name)
  assert aside.read_bytes() == data
  assert f"{directory / name}: " in caplog.text and f"set aside as {aside.name}" in caplog.text


def _one_line(error: BaseException, *names: str) -> str:
  message = str(error)
  assert "\n" not in message and all(n in message for n in names), message
  return message


# --------------------------------------------------------------------------------------------
# goodput.json: set aside (an account of time; nothing a run needs), or used.

_LEDGER = {
  "attempts": [
    {
      "start": 1000.0, "host": "h", "pid": 7, "processes": 1, "start_step": 0, "source": None,
      "lost_s": 0.0, "recomputed_steps": 0, "counted": {"step": 5.0, "startup": 1.0},
      "counted_to": 10,
    },
    {
      "start": 2000.0, "start_step": 10, "source": "persistent",
      "marks": [{"step": 20, "time": 2100.0, "spent": {"step": 9.0}}],
      "end": {"step": 20, "time": 2100.0, "outcome": "stopped", "spent": {"step": 9.5}},
    },
  ]
}  # fmt: skip


def test_goodput_json_of_any_shape_is_used_or_set_aside(tmp_path, caplog, capsys):
  outcomes = {}
  for i, (label, data) in enumerate(_variants(_LEDGER)):
    wd = tmp_path / f"w{i}"
    wd.mkdir()
    (wd / goodput.FILE).write_bytes(data)
    caplog.clear()
    # The tool (writes nothing): the account, or one line naming the file.
    try:
      cli.call(goodput_tool, [f"--workdir={wd}"])
      invalid = False
    except FileNotFoundError as e:  # a ledger without attempts
      _one_line(e, f"{wd / goodput.FILE}: no goodput account there")
      invalid = False
    except ValueError as e:
      _one_line(e, f"{wd / goodput.FILE}: not a goodput account (", "sets it aside")
      invalid = True
    assert (wd / goodput.FILE).read_bytes() == data, label
    # A run: continues the ledger, or sets it aside and starts anew.
    account = goodput.Account(str(wd))
    account.resumed(20, "persistent", 20)
    account.finish("finished")
    attempts = goodput.read(str(wd))["attempts"]
    if _set_aside(wd, goodput.FILE):
      _assert_set_aside(wd, goodput.FILE, data, caplog)
      assert len(attempts) == 1, label
      outcomes[label] = "set aside"
    else:
      assert len(attempts) == len(json.loads(data).get("attempts", [])) + 1, label
      outcomes[label] = "used"
    assert invalid == (outcomes[label] == "set aside"), label  # the tool and a run agree
  assert outcomes["valid"] == outcomes["top + an extra key"] == "used"
  assert outcomes["attempts.1.end + an extra key"] == outcomes["attempts.0.host removed"] == "used"
  for label in ("top level None", "top level []", "empty", "bytes", "truncated", "attempts='x'"):
    assert outcomes[label] == "set aside", label
  assert outcomes["attempts.0.start='x'"] == outcomes["attempts.1.end.step=1.5"] == "set aside"
  capsys.readouterr()


# --------------------------------------------------------------------------------------------
# config.json: refused in one line beside checkpoints (the record of what they were trained with).


def _config() -> ml_collections.ConfigDict:
  config = pretrain.get_config("dataset=fashion_mnist,runlocal")
  config.total_steps = 2
  return config


def test_config_json_of_any_shape_is_used_or_refused_in_one_line(tmp_path):
  config = _config()
  saved = json.loads(config.to_json_best_effort())
  path = tmp_path / workdir.CONFIG_FILE
  outcomes = {}
  for label, data in _variants(saved, wrong=("x", None, [])):
    path.write_bytes(data)
    try:
      workdir.check_config(str(tmp_path), config)
      outcomes[label] = "used"
    except json_file.InvalidFile as e:
      _one_line(e, f"{path}: ", "Put that run's config.json back, or use a new --workdir")
      outcomes[label] = "refused: not a config"
    except ValueError as e:
      _one_line(e, f"{tmp_path} holds a run with another config: ", str(path))
      outcomes[label] = "refused: another config"
    assert path.read_bytes() == data and not _set_aside(tmp_path, workdir.CONFIG_FILE), label
  assert outcomes["valid"] == outcomes["total_steps='x'"] == "used"  # may change on resume
  assert outcomes["top + an extra key"] == outcomes["model.hidden_size='x'"]
  assert outcomes["model.hidden_size removed"] == "refused: another config"
  for label in ("top level None", "top level []", "top level 'x'", "empty", "bytes", "truncated"):
    assert outcomes[label] == "refused: not a config", label
  # A later stage reading this workdir's checkpoint (model_init, predict, the linear probe).
  path.write_bytes(b"[1, 2]")
  with pytest.raises(json_file.InvalidFile) as e:
    loader.saved_config(str(tmp_path))
  _one_line(e.value, f"{path}: its top level is an array, not an object", "config.json back")


# --------------------------------------------------------------------------------------------
# lock.json: no live holder is known in a file that is no lock record; refused while the lease
# may run (a launch may be writing it), taken over after.

_LOCK = {
  "host": "t1v-n-old-w-0", "pid": 4242, "process_start": "1", "pid_ns": 4026531836,
  "started": "2026-12-03 09:00:00 UTC", "lease_s": 60.0, "renewed": 1.0, "token": "abc",
}  # fmt: skip


def test_lock_json_of_any_shape_is_held_or_taken_over_in_one_line(tmp_path, caplog):
  path = tmp_path / workdir_lock.LOCK_FILE
  for label, data in _variants(_LOCK):
    for age in (5, 3 * 3600):
      path.write_bytes(data)
      then = time.time() - age
      os.utime(path, (then, then))
      assert workdir_lock.break_lock(str(tmp_path)).startswith("--break_lock: removed the lock")
      path.write_bytes(data)
      os.utime(path, (then, then))
      try:
        with workdir_lock.lock(str(tmp_path), lease_s=60):
          assert json.loads(path.read_text())["pid"] == os.getpid()
        taken = True
      except workdir_lock.WorkdirLocked as e:
        _one_line(e, f"{tmp_path} is ", "--break_lock")
        assert path.read_bytes() == data, label  # untouched
        taken = False
      # Old: taken over, unless the record's own lease is longer (10**30 s: --break_lock
      # ends it). Young: held, unless the record's own lease is shorter.
      expired = (age > 5 or label == "lease_s=1.5") and label != f"lease_s={10**30!r}"
      assert taken == expired, label
  assert list(tmp_path.iterdir()) == [path] or not list(tmp_path.iterdir())


# --------------------------------------------------------------------------------------------
# local_tier.json and tier.json: set aside / emptied (local steps are a cache of the workdir's);
# checkpoint.local.dir unusable: one line naming the setting.


def test_local_tier_json_of_any_shape_is_used_or_set_aside(tmp_path, caplog):
  valid = {"token": "00000000000000ff"}
  for i, (label, data) in enumerate(_variants(valid)):
    wd = tmp_path / f"w{i}"
    wd.mkdir()
    (wd / local_tier.TOKEN_FILE).write_bytes(data)
    caplog.clear()
    token = local_tier._workdir_token(str(wd))
    assert json.loads((wd / local_tier.TOKEN_FILE).read_text())["token"] == token
    if label in ("valid", "top + an extra key"):
      assert token == "00000000000000ff" and not _set_aside(wd, local_tier.TOKEN_FILE)
    elif token != "00000000000000ff":
      _assert_set_aside(wd, local_tier.TOKEN_FILE, data, caplog)
      assert "a new token empties the local tiers written before" in caplog.text


def _mesh():
  from vit_jax import sharding

  return sharding.make_mesh(
    ml_collections.ConfigDict(dict(data=1, fsdp=1, model=1)), jax.devices()[:1]
  )


def _local(directory) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(
    dict(dir=str(directory), every_steps=2, every_minutes=0.0, keep=2)
  )


@pytest.mark.parametrize("data", [b"\x89\xff\x00", b"null", b'{"workdir": 1}', b"{"])
def test_an_unreadable_tier_json_empties_that_tier(tmp_path, caplog, data):
  mesh = _mesh()
  local_tier.LocalTier(_local(tmp_path / "local"), str(tmp_path / "w"), mesh).close()
  root = tmp_path / "local" / "process_0"
  (root / "steps" / "left").mkdir(parents=True)
  (root / "tier.json").write_bytes(data)
  tier = local_tier.LocalTier(_local(tmp_path / "local"), str(tmp_path / "w"), mesh)
  tier.close()
  assert not (root / "steps" / "left").exists()
  assert f"local checkpoint tier {root} " in caplog.text and "emptying it" in caplog.text
  assert json.loads((root / "tier.json").read_text())["workdir"] == str(tmp_path / "w")


@pytest.mark.parametrize("where", ["/proc/nonexistent", "file/below"])
def test_an_unusable_local_dir_is_one_line_naming_the_setting(tmp_path, where):
  (tmp_path / "file").write_text("a file, not a directory")
  directory = where if where.startswith("/") else str(tmp_path / where)
  with pytest.raises(ValueError) as e:
    local_tier.LocalTier(_local(directory), str(tmp_path / "w"), _mesh())
  _one_line(e.value, f"checkpoint.local.dir={directory!r}: cannot use {directory}/process_0: ")


# --------------------------------------------------------------------------------------------
# profile_request: served (clipped to the run), set aside, or left for a later run.


@pytest.mark.parametrize(
  "data, window",
  [
    (b"4\n", (11, 14)),
    (b"", (11, 13)),  # profile.num_steps
    (b" 7 ", (11, 17)),
    (b"99999999\n", (11, 20)),  # clipped to the steps left
    (b"0", None),
    (b"-3", None),
    (b"many", None),
    (b"1e3", None),
    (b"5\n6", None),
    (b"\x89\xff\x00", None),
    (b"9" * 65, None),  # longer than any number of steps
    (b"null", None),
  ],
)
def test_a_profile_request_is_served_within_the_run_or_set_aside(tmp_path, caplog, data, window):
  caplog.set_level(logging.INFO, logger="absl")  # whatever verbosity an earlier test left
  config = ml_collections.ConfigDict(dict(first_step=0, num_steps=3, processes="0"))
  request = tmp_path / profiling.REQUEST_FILE
  request.write_bytes(data)
  profiler = profiling.Profiler(config, str(tmp_path), total_steps=20)
  profiler.poll(10)
  if window is None:
    assert profiler._windows == [] and not request.exists()
    _assert_set_aside(tmp_path, profiling.REQUEST_FILE, data, caplog)
    assert "not a number of steps; ignored" in caplog.text
  else:
    assert profiler._windows == [(*window, True)] and request.read_bytes() == data
    clipped = "(clipped to the 10 left in this run): tracing steps 11-20"
    assert (clipped in caplog.text) == (data == b"99999999\n"), caplog.text
  # At the run's last step: nothing left to trace; the request waits for a later run.
  request.write_bytes(b"4")
  last = profiling.Profiler(config, str(tmp_path), total_steps=10)
  last.poll(10)
  assert last._windows == [] and request.read_bytes() == b"4"


# --------------------------------------------------------------------------------------------
# final_metrics.json (vit_jax.tools.transfer's "finished"): set aside, the stage runs again.


def test_final_metrics_json_of_any_shape_is_used_or_set_aside(tmp_path, caplog):
  valid = {"val/accuracy": 0.5, "loss": 1.25}
  for i, (label, data) in enumerate(_variants(valid)):
    wd = tmp_path / f"w{i}"
    wd.mkdir()
    (wd / workdir.FINAL_METRICS_FILE).write_bytes(data)
    caplog.clear()
    metrics = workdir.read_final_metrics(str(wd))
    if metrics is None:
      _assert_set_aside(wd, workdir.FINAL_METRICS_FILE, data, caplog)
    else:
      assert metrics == json.loads(data) and (wd / workdir.FINAL_METRICS_FILE).exists()
    removed = label in ("loss removed", "val/accuracy removed")
    numbers = label.endswith(("=-1", "=1.5", "=nan"))
    used = removed or numbers or label in ("valid", "top + an extra key")
    assert (metrics is not None) == used, label


# --------------------------------------------------------------------------------------------
# The log file: each process's own.

_LOG_CHILD = textwrap.dedent(
  """
  import sys, time
  from vit_jax.runtime import console
  time.strftime = lambda fmt, *a: "20261205-120000"  # launched in the winner's second
  print(console.setup(sys.argv[1]), flush=True)
  print("the refused launch's line", file=sys.stderr, flush=True)
  """
)


def test_a_launch_in_the_same_second_never_writes_into_another_runs_log(tmp_path):
  logs = tmp_path / "logs"
  logs.mkdir()
  winner = logs / "20261205-120000-p0.log"
  winner.write_text("the winning run's log\n")
  proc = subprocess.run(
    [sys.executable, "-c", _LOG_CHILD, str(tmp_path)], cwd=REPO, capture_output=True,
    text=True, timeout=120,
  )  # fmt: skip
  assert proc.returncode == 0, proc.stderr
  assert winner.read_text() == "the winning run's log\n"
  own = logs / "20261205-120000-p0-2.log"
  assert f"full log in {own}" in proc.stderr and "the refused launch's line" in own.read_text()
  path, fd = console._create(str(winner))
  os.close(fd)
  assert path == str(logs / "20261205-120000-p0-3.log")


# --------------------------------------------------------------------------------------------
# Through the entry point.

_ARGS = [
  "--config=configs/pretrain.py:dataset=fashion_mnist,runlocal",
  "--config.total_steps=2",
  "--config.checkpoint.every_steps=2",
  "--config.log_every_steps=1",
  "--config.evals.val.every_steps=-1",
  "--config.evals.fewshot_animal_mnist.every_steps=-1",
  "--config.evals.fewshot_mnist_5k.every_steps=-1",
]


def _main(workdir, *extra, module="vit_jax.main", args=_ARGS) -> tuple[int, list[str]]:
  """`python -m <module>` into `workdir`: (status, the terminal's non-empty lines); prints the
  command, status, wall time and last line (shown with -s)."""
  command = [sys.executable, "-m", module, *args, f"--workdir={workdir}", *extra]
  start = time.monotonic()
  proc = subprocess.run(
    command, env=xla_env.child_env(1, TF_CPP_MIN_LOG_LEVEL="2"), cwd=REPO,
    capture_output=True, text=True, timeout=600,
  )  # fmt: skip
  lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
  print(f"{' '.join(command[1:])}: exit {proc.returncode} in {time.monotonic() - start:.1f} s:")
  print(f"  {lines[-1] if lines else ''}")
  return proc.returncode, lines


@pytest.mark.long
def test_through_the_entry_point(tmp_path):
  """A goodput.json of another shape: set aside, the run finishes (and the tool says why in one
  line before it); its config.json broken: the restart is refused in one line naming it; an
  unusable checkpoint.local.dir: one line naming the setting."""
  wd = tmp_path / "run"
  wd.mkdir()
  (wd / goodput.FILE).write_text('{"attempts": "x"}')
  code, lines = _main(wd, module="vit_jax.tools.goodput", args=[])
  assert code == 1 and lines == [
    f"goodput: error: InvalidFile: {wd / goodput.FILE}: not a goodput account (attempts is a "
    "string, not an array); the workdir's next run sets it aside and starts anew"
  ]
  code, lines = _main(wd)
  assert code == 0, lines[-10:]
  (aside,) = _set_aside(wd, goodput.FILE)
  assert aside.read_text() == '{"attempts": "x"}'
  assert [line for line in lines if f"{wd / goodput.FILE}: not a goodput account (attempts" in line]
  assert [a["end"]["outcome"] for a in goodput.read(str(wd))["attempts"]] == ["finished"]

  (wd / workdir.CONFIG_FILE).write_text('{"model": {"name": "ViT-dem')  # cut short
  code, lines = _main(wd, "--config.total_steps=4")
  assert code == 1
  assert (
    lines[-1].startswith(
      f"vit_jax: error: InvalidFile: {wd / workdir.CONFIG_FILE}: not JSON (Unterminated string"
    )
    and "Put that run's config.json back, or use a new --workdir" in lines[-1]
  )
  assert (wd / workdir.CONFIG_FILE).read_text() == '{"model": {"name": "ViT-dem'
  logs = sorted((wd / "logs").iterdir())
  assert len(logs) == 2 and "InvalidFile" not in logs[0].read_text()  # each launch its own log

  local = [
    "--config.checkpoint.local.dir=/proc/nonexistent",
    "--config.checkpoint.local.every_steps=1",
  ]
  code, lines = _main(tmp_path / "local", *local)
  assert code == 1 and lines[-1].startswith(
    "vit_jax: error: ValueError: checkpoint.local.dir='/proc/nonexistent': cannot use "
    "/proc/nonexistent/process_0: No such file or directory; set it to a writable local "
    "directory, or to '' to turn the local tier off (full log: "
  ), lines[-1]
