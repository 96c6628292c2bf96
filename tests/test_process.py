"""The package is a library and the commands own the process (vit_jax.runtime.process).

Importing vit_jax and every module in it leaves the environment, glibc's allocator, the garbage
collector and the signal handlers as they were; `python -m vit_jax.main` sets the allocator and
XLA_FLAGS first thing and logs them; a second stop signal ends a command at once but raises
KeyboardInterrupt in a library caller (a notebook's kernel lives on).
"""

import ast
import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap

import pytest

from tests.helpers import REPO
from vit_jax.kernels import xla_cpu_flags, xla_cpu_memory
from vit_jax.runtime import process, stopping

GLIBC = bool(os.confstr("CS_GNU_LIBC_VERSION"))
MARK = "PROCESS_STATE "

# What a process looks like from inside: its environment, the collector, the handlers of the
# stop signals, JAX's CPU dispatch, and two effects of glibc's settings that can be observed:
# whether a new thread that allocates gets an arena of its own (M_ARENA_MAX), and whether a
# 64 MiB block of the main thread is mapped on its own (M_MMAP_MAX; mallinfo2's hblks counts such
# blocks).
PROBE = textwrap.dedent(
  f"""
  import ctypes, gc, json, os, re, signal, threading

  def _allocator():
    if not os.confstr("CS_GNU_LIBC_VERSION"):
      return None
    libc = ctypes.CDLL(None)
    class Mallinfo2(ctypes.Structure):
      _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split())]
    libc.mallinfo2.restype = Mallinfo2
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    thread = threading.Thread(target=lambda: bytearray(1 << 20))
    thread.start(); thread.join()
    buf, size = ctypes.c_char_p(), ctypes.c_size_t()
    libc.open_memstream.restype = ctypes.c_void_p
    stream = ctypes.c_void_p(libc.open_memstream(ctypes.byref(buf), ctypes.byref(size)))
    libc.malloc_info(0, stream); libc.fclose(stream)
    arenas = len(re.findall(r"<heap nr=", ctypes.string_at(buf, size.value).decode()))
    before = libc.mallinfo2().hblks
    block = libc.malloc(64 << 20)
    mapped = libc.mallinfo2().hblks - before
    libc.free(block)
    return dict(arenas=arenas, mapped_blocks=mapped)

  def state():
    return dict(
      environ=dict(os.environ),
      gc_enabled=gc.isenabled(),
      gc_frozen=gc.get_freeze_count(),
      gc_threshold=gc.get_threshold(),
      handlers={{s.name: repr(signal.getsignal(s)) for s in (signal.SIGINT, signal.SIGTERM)}},
    )

  def report(**extra):
    import jax
    dispatch = jax.config.values["jax_cpu_enable_async_dispatch"]
    print("{MARK}" + json.dumps(
      dict(state(), allocator=_allocator(), async_dispatch=dispatch, **extra)), flush=True)
  """
)

# JAX's and TensorFlow's own imports set variables (TF_CPP_MIN_LOG_LEVEL, TPU_SKIP_MDS_QUERY,
# TF2_BEHAVIOR, KMP_DUPLICATE_LIB_OK, ...): they are imported before the state is taken.
IMPORT_EVERYTHING = PROBE + textwrap.dedent(
  f"""
  import importlib, pkgutil, sys
  import jax, tensorflow
  before = state()
  import vit_jax
  names = [m.name for m in pkgutil.walk_packages(vit_jax.__path__, "vit_jax.")]
  missing = []  # modules needing an optional package that is not installed (onnx: export)
  for name in names:
    try:
      importlib.import_module(name)
    except ModuleNotFoundError as e:
      if (e.name or "vit_jax").startswith("vit_jax"):
        raise
      missing.append(name)
  print("{MARK}" + json.dumps(before))
  report(modules=len(names) - len(missing))
  """
)


def _states(out: str) -> list[dict]:
  return [json.loads(line[len(MARK) :]) for line in out.splitlines() if line.startswith(MARK)]


def _env(**extra) -> dict[str, str]:
  env = {k: v for k, v in os.environ.items() if k not in (xla_cpu_memory.OPT_OUT, "JAX_PLATFORMS")}
  env.pop(xla_cpu_flags.OPT_OUT, None)
  env.update(XLA_FLAGS="--xla_force_host_platform_device_count=1", TF_CPP_MIN_LOG_LEVEL="2")
  env.update(extra)
  return env


@pytest.mark.skipif(not GLIBC, reason="the allocator's observable effects are glibc's")
def test_importing_every_module_changes_nothing_process_wide():
  out = subprocess.run(
    [sys.executable, "-c", IMPORT_EVERYTHING],
    env=_env(JAX_PLATFORMS="cpu"),
    capture_output=True,
    text=True,
    timeout=300,
    cwd=REPO,
  )
  assert out.returncode == 0, out.stderr[-3000:]
  before, after = _states(out.stdout)
  assert after["modules"] > 90  # vit_jax.train, models, checkpoint, input_pipeline, tools, ...
  for key in ("environ", "gc_enabled", "gc_frozen", "gc_threshold", "handlers"):
    assert after[key] == before[key], key
  assert after["environ"]["XLA_FLAGS"] == "--xla_force_host_platform_device_count=1"
  assert before["gc_enabled"] and before["gc_frozen"] == 0
  # glibc's defaults: a thread that allocates gets an arena of its own, a 64 MiB block its own
  # mapping; JAX's, asynchronous dispatch (JAX_PLATFORMS=cpu: the settings would have been made
  # here had the import made them).
  assert after["allocator"]["arenas"] >= 2, after["allocator"]
  assert after["allocator"]["mapped_blocks"] == 1, after["allocator"]
  assert after["async_dispatch"] is True


# `python -m vit_jax.main`, as runpy runs it, with a state report when it exits: the stage it is
# given does not exist, so it fails in one line once its log file and process are set up.
COMMAND = PROBE + textwrap.dedent(
  """
  import atexit, runpy, sys
  def at_exit():
    from vit_jax.runtime import stopping
    report(second_signal_exits=stopping._second_signal_exits[0])
  atexit.register(at_exit)
  sys.argv = ["vit_jax.main", *sys.argv[1:]]
  runpy.run_module("vit_jax.main", run_name="__main__", alter_sys=True)
  """
)


@pytest.mark.skipif(not GLIBC, reason="the allocator's observable effects are glibc's")
def test_the_entry_point_sets_its_process_up_and_logs_it(tmp_path):
  workdir = tmp_path / "w"
  out = subprocess.run(
    [sys.executable, "-c", COMMAND]
    + ["--config=configs/pretrain.py:dataset=fashion_mnist,runlocal", "--config.stage=nothing"]
    + [f"--workdir={workdir}"],
    env=_env(JAX_PLATFORMS="cpu"),
    capture_output=True,
    text=True,
    timeout=300,
    cwd=REPO,
  )
  assert out.returncode == 1, out.stderr[-3000:]
  assert "config.stage='nothing'" in out.stdout + out.stderr
  (state,) = _states(out.stdout)
  flags = state["environ"]["XLA_FLAGS"].split()
  assert flags == ["--xla_force_host_platform_device_count=1", *xla_cpu_flags.DEFAULTS]
  # A 64 MiB block of the main thread from its heap, not a mapping, and the steps run there;
  # every other thread keeps an arena of its own.
  assert state["allocator"]["mapped_blocks"] == 0 and state["allocator"]["arenas"] >= 2
  assert state["async_dispatch"] is False
  assert state["second_signal_exits"] is True
  (log,) = (workdir / "logs").glob("*.log")
  line = f"process settings: allocator: {xla_cpu_memory.APPLIED}; XLA_FLAGS: added"
  assert line in log.read_text()


def test_configure_says_when_it_came_too_late(monkeypatch, caplog):
  # This test process has started JAX's backends (stubbed to say so on any machine).
  monkeypatch.setattr(xla_cpu_memory, "status", "not applied yet")
  monkeypatch.setattr(xla_cpu_memory, "_libc", lambda: object())
  monkeypatch.setattr(xla_cpu_flags, "backends_started", lambda: True)
  monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
  monkeypatch.setattr(process, "_configured", [])
  with caplog.at_level("INFO"):
    settings = process.configure(environ=os.environ)
  assert settings.too_late and process.configured() == settings
  assert settings.allocator == xla_cpu_memory.TOO_LATE
  assert settings.xla_flags == xla_cpu_flags.TOO_LATE
  assert os.environ["XLA_FLAGS"] == "--xla_force_host_platform_device_count=8"
  (record,) = [r for r in caplog.records if "configure() came too late" in r.getMessage()]
  assert record.levelname == "WARNING"
  # Another environment (a child's): its XLA_FLAGS are set whatever this process has started.
  child = {"XLA_FLAGS": ""}
  caplog.clear()
  with caplog.at_level("INFO"):
    assert process.configure(environ=child).xla_flags.startswith("added")
  assert child["XLA_FLAGS"].split() == list(xla_cpu_flags.DEFAULTS)
  assert process.configured() == settings  # what was done to this process


def test_configure_keeps_jax_on_the_cpu_where_libtpu_has_no_tpu(monkeypatch):
  """libtpu installed (the test install) on a machine without an accelerator: JAX_PLATFORMS=cpu
  and libtpu's metadata answers set, said in the settings; never where JAX_PLATFORMS is chosen,
  an accelerator's node exists or libtpu is absent."""
  monkeypatch.setattr(xla_cpu_memory, "accelerator", lambda environ: None)
  monkeypatch.setattr(process.importlib.util, "find_spec", lambda name: object())
  child = {"XLA_FLAGS": ""}
  settings = process.configure(environ=child)
  assert child["JAX_PLATFORMS"] == "cpu" and child["TPU_SKIP_MDS_QUERY"] == "1"
  assert "JAX_PLATFORMS: cpu (libtpu is installed, no accelerator here)" in str(settings)
  chosen = {"XLA_FLAGS": "", "JAX_PLATFORMS": "tpu"}
  assert not process.configure(environ=chosen).platforms and chosen["JAX_PLATFORMS"] == "tpu"
  monkeypatch.setattr(xla_cpu_memory, "accelerator", lambda environ: "/dev/accel0")
  assert not process.configure(environ={"XLA_FLAGS": ""}).platforms
  monkeypatch.setattr(xla_cpu_memory, "accelerator", lambda environ: None)
  monkeypatch.setattr(process.importlib.util, "find_spec", lambda name: None)
  plain = {"XLA_FLAGS": ""}
  assert not process.configure(environ=plain).platforms and "JAX_PLATFORMS" not in plain


def test_quiet_libtpu_sets_only_what_is_unset():
  environ = {"JAX_PLATFORMS": "tpu"}
  process.quiet_libtpu(environ)
  assert environ == {
    "JAX_PLATFORMS": "tpu",
    "TPU_SKIP_MDS_QUERY": "1",
    "TPU_WORKER_HOSTNAMES": "localhost",
  }


@pytest.fixture
def main_thread():
  import threading

  if threading.current_thread() is not threading.main_thread():
    pytest.skip("signal handlers are installed from the main thread only")


def test_a_second_signal_raises_keyboard_interrupt_in_a_library_caller(monkeypatch, main_thread):
  monkeypatch.setattr(stopping, "_second_signal_exits", [False])
  previous = signal.getsignal(signal.SIGINT)
  with stopping.StopOnSignal() as stop:
    assert signal.getsignal(signal.SIGINT) == stop._handle
    os.kill(os.getpid(), signal.SIGINT)
    assert stop.reached(7)  # the first: save step 7, then stop
    assert stop.exit_status == 130
    with pytest.raises(KeyboardInterrupt, match=r"second signal \(SIGINT\): stopped without"):
      os.kill(os.getpid(), signal.SIGINT)
  assert signal.getsignal(signal.SIGINT) == previous


def test_a_second_signal_ends_a_command_at_once(monkeypatch, main_thread):
  monkeypatch.setattr(stopping, "_second_signal_exits", [False])
  stopping.exit_on_second_signal()  # what vit_jax.runtime.cli.run does
  exits = []

  class Exited(Exception):
    pass

  def exit_now(status):
    exits.append(status)
    raise Exited

  monkeypatch.setattr(stopping.os, "_exit", exit_now)
  with stopping.StopOnSignal():
    os.kill(os.getpid(), signal.SIGTERM)
    with pytest.raises(Exited):
      os.kill(os.getpid(), signal.SIGTERM)
  assert exits == [128 + signal.SIGTERM]


def _commands() -> list[pathlib.Path]:
  """Every module of the package and the experiments that runs as `python -m ...`."""
  paths = sorted((REPO / "vit_jax").rglob("*.py")) + sorted((REPO / "experiments").rglob("*.py"))
  return [p for p in paths if 'if __name__ == "__main__":' in p.read_text()]


def _is_main_guard(node: ast.stmt) -> bool:
  return isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'"


# Sets each measured side up in main(), once it knows which tree's vit_jax the side runs.
_CONFIGURED_IN_MAIN = {"experiments/benchmarks/benchmark_model.py"}


def test_every_command_sets_its_process_up_before_its_imports():
  commands = _commands()
  assert len(commands) >= 20
  for path in commands:
    name = str(path.relative_to(REPO))
    if name == "vit_jax/runtime/cli.py" or name in _CONFIGURED_IN_MAIN:
      continue
    body = ast.parse(path.read_text()).body
    first = body[1]  # after the docstring
    assert _is_main_guard(first), f"{name}: its first statement is not the process set-up"
    calls = [ast.unparse(n.func) for n in ast.walk(first) if isinstance(n, ast.Call)]
    assert calls and calls[-1] == "process.configure", (name, calls)
