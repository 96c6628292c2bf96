"""vit_jax's XLA:CPU defaults: added to XLA_FLAGS by a command's process set-up
(vit_jax.runtime.process.configure) unless the user set the flag, never on import."""

import os
import subprocess
import sys

from vit_jax.kernels import xla_cpu_flags

FLAG = "--xla_cpu_experimental_ynn_fusion_type"
# A matmul compiled after the process set-up of a command: its HLO says whether YNNPACK runs it.
PROGRAM = (
  "from vit_jax.runtime import process; process.configure(); import jax, jax.numpy as jnp; "
  "x = jnp.ones((64, 64)); print(jax.jit(lambda a: a @ a).lower(x).compile().as_text())"
)


def test_apply_adds_missing_flags_and_keeps_the_users():
  env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
  assert xla_cpu_flags.apply(env) == "added " + " ".join(xla_cpu_flags.DEFAULTS)
  assert env["XLA_FLAGS"].split() == [
    "--xla_force_host_platform_device_count=8",
    *xla_cpu_flags.DEFAULTS,
  ]
  assert xla_cpu_flags.apply(env) == "vit_jax's defaults present"  # idempotent
  assert env["XLA_FLAGS"].split().count(xla_cpu_flags.DEFAULTS[0]) == 1
  mine = {"XLA_FLAGS": f"{FLAG}="}
  xla_cpu_flags.apply(mine)
  assert mine == {"XLA_FLAGS": f"{FLAG}="}
  empty = {}
  xla_cpu_flags.apply(empty)
  assert empty["XLA_FLAGS"].split() == list(xla_cpu_flags.DEFAULTS)


def test_the_opt_out_leaves_xla_flags_alone():
  for value in ("1", "true"):
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8", xla_cpu_flags.OPT_OUT: value}
    assert xla_cpu_flags.apply(env) == f"left as given ({xla_cpu_flags.OPT_OUT} is set)"
    assert env["XLA_FLAGS"] == "--xla_force_host_platform_device_count=8"
    bare = {xla_cpu_flags.OPT_OUT: value}
    xla_cpu_flags.apply(bare)
    assert "XLA_FLAGS" not in bare
  off = {xla_cpu_flags.OPT_OUT: "0"}
  xla_cpu_flags.apply(off)
  assert off["XLA_FLAGS"].split() == list(xla_cpu_flags.DEFAULTS)


def _hlo(xla_flags, **extra):
  env = dict(os.environ, **extra)
  env.pop("XLA_FLAGS", None)
  if xla_flags is not None:
    env["XLA_FLAGS"] = xla_flags
  out = subprocess.run(
    [sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=120
  )
  assert out.returncode == 0, out.stderr[-2000:]
  return out.stdout


def test_matmuls_leave_ynnpack_unless_the_user_asks_for_it():
  assert "__ynn_fusion" not in _hlo(None)
  assert "__ynn_fusion" in _hlo(f"{FLAG}=individual_dot")
  assert "__ynn_fusion" in _hlo(None, **{xla_cpu_flags.OPT_OUT: "1"})  # XLA's own default


def test_this_process_is_left_alone_once_jax_started_its_backends(monkeypatch):
  import jax

  jax.devices()  # the backends of this test process, started
  monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
  monkeypatch.delenv(xla_cpu_flags.OPT_OUT, raising=False)
  assert xla_cpu_flags.apply() == xla_cpu_flags.TOO_LATE
  assert os.environ["XLA_FLAGS"] == "--xla_force_host_platform_device_count=8"
