"""Goodput accounting and profiles on demand (vit_jax.runtime.goodput, vit_jax.runtime.profiling).

The ledger's arithmetic and the request file are checked in-process; through the entry point,
one workdir's two runs: the first with a slow input pipeline (every batch 0.4 s late,
tests/helpers/fault_injection.py), a trace of steps 2-3 from the config, and a SIGKILL at batch 9; the
rerun with a `profile_request` file waiting in the workdir. Its account shows the data wait,
the time lost to the kill and no step recomputed, and both traces hold the train step.
"""

import json
import re
import subprocess
import sys
import time

import pytest

from tests.helpers import REPO, fault_injection, xla_env
from vit_jax.checkpoint.state import train_state
from vit_jax.runtime import goodput, profiling


def _spent(**seconds) -> dict[str, float]:
  return {**dict.fromkeys(goodput.PHASES, 0.0), **seconds}


def test_a_killed_run_counts_up_to_the_restored_save_and_the_rest_is_lost():
  first = dict(
    start=100.0,
    start_step=0,
    marks=[
      dict(step=3, time=110.0, spent=_spent(startup=4.0, step=6.0)),
      dict(step=6, time=120.0, spent=_spent(startup=4.0, step=16.0)),
    ],
  )
  attempts = [first]
  assert goodput.resolve(attempts, start=130.0, step=6) == 10.0
  assert first["counted"] == _spent(startup=4.0, step=16.0) and first["counted_to"] == 6
  assert "marks" not in first  # settled: its records are no longer needed
  # Its rerun committed nothing before it died too: the next rerun from step 6 loses all of it.
  second = dict(start=140.0, start_step=6, lost_s=10.0, marks=[])
  attempts.append(second)
  assert goodput.resolve(attempts, start=150.0, step=6) == 10.0
  assert second["counted"] == _spent() and second["counted_to"] is None
  attempts.append(dict(start=150.0, start_step=6, lost_s=10.0))
  account = goodput.totals(attempts)
  assert account["lost"] == 20.0 and account["total"] == 40.0  # 130 - 100 + 150 - 140
  assert account["share"] == 16.0 / 40.0 and account["runs"] == 3


@pytest.mark.parametrize("outcome,lost", [("stopped", 60.0), ("finished", 0.0)])
def test_after_a_stop_the_wait_is_lost_after_a_finish_nothing(outcome, lost):
  attempt = dict(
    start=100.0,
    start_step=0,
    marks=[dict(step=4, time=150.0, spent=_spent(step=30.0))],
    end=dict(step=8, time=200.0, outcome=outcome, spent=_spent(step=60.0, checkpoint=1.0)),
  )
  assert goodput.resolve([attempt], start=260.0, step=8) == lost
  assert attempt["counted"]["step"] == 60.0


def test_a_run_that_saved_nothing_is_lost_whole():
  attempt = dict(start=100.0, start_step=0, marks=[])
  assert goodput.resolve([attempt], start=130.0, step=None) == 30.0
  assert goodput.totals([attempt])["total"] == 0.0  # its lost time is the next run's


def test_the_account_times_phases_and_writes_only_once_the_state_exists(tmp_path, monkeypatch):
  monkeypatch.setattr(goodput, "_started", [True])  # not the test process's whole life
  refused = goodput.Account(str(tmp_path))
  with pytest.raises(ValueError), refused:
    raise ValueError("a config the workdir refuses")
  assert not list(tmp_path.iterdir())  # nothing written before the state was restored

  with goodput.Account(str(tmp_path)) as account:
    account.resumed(0, None, None)
    account.enter("data_wait")
    time.sleep(0.05)
    account.enter("step")
    with account.phase("checkpoint"):
      time.sleep(0.02)
      account.saved(2)
    assert account.spent()["data_wait"] >= 0.05 and account.spent()["checkpoint"] >= 0.02
    scalars = account.scalars(2)
    assert 0 < scalars["goodput/share"] < 1 and scalars["goodput/data_wait_s"] >= 0.05
  (attempt,) = goodput.read(str(tmp_path))["attempts"]
  assert attempt["end"]["outcome"] == "finished" and attempt["end"]["step"] == 2
  assert [m["step"] for m in attempt["marks"]] == [2]
  assert attempt["end"]["spent"]["data_wait"] >= 0.05


def _profile_config(**fields):
  import ml_collections

  return ml_collections.ConfigDict(dict(dict(first_step=0, num_steps=3, processes="0"), **fields))


def test_a_request_file_is_served_at_the_next_log_step(tmp_path):
  assert profiling.parse_processes("all") is None and profiling.parse_processes("0,3") == {0, 3}
  with pytest.raises(ValueError, match="profile.processes='one'"):
    profiling.parse_processes("one")
  request = tmp_path / profiling.REQUEST_FILE
  profiler = profiling.Profiler(_profile_config(), str(tmp_path))
  request.write_text("many\n")
  profiler.poll(10)
  assert not request.exists() and profiler._next == -1  # refused with a warning, set aside
  (aside,) = tmp_path.glob(f"{profiling.REQUEST_FILE}.bad-*")
  assert aside.read_text() == "many\n"
  request.write_text("4\n")
  profiler.poll(10)
  assert profiler._windows == [(11, 14, True)] and profiler._next == 11
  with pytest.raises(ValueError, match="profile.processes='3' names a process"):
    profiling.Profiler(_profile_config(processes="3"), str(tmp_path))


def test_bench_goodput_runs_main(monkeypatch, capsys, tmp_path):
  """experiments/benchmarks/bench_goodput.py's main: one pair of 3-step runs of a one-block model on one
  device, the real account and the one that does nothing (then the real one back)."""
  import jax

  from experiments.benchmarks import bench_goodput
  from vit_jax import models, sharding
  from vit_jax.runtime import cli

  tiny = models.get_model_config("demo")
  tiny.update(hidden_size=32, mlp_dim=64, num_heads=2, num_layers=1)
  monkeypatch.setitem(models.MODEL_CONFIGS, "ViT-demo", lambda: tiny.copy_and_resolve_references())
  make_mesh = sharding.make_mesh
  monkeypatch.setattr(
    sharding, "make_mesh", lambda config, devices=None: make_mesh(config, jax.devices()[:1])
  )
  account = goodput.Account
  argv = ["--pairs=1", "--steps=3", "--log_every=1", "--batch_size=8", f"--out={tmp_path}"]
  results = cli.call(bench_goodput, argv)
  (pair,) = results["pairs"]
  assert pair["on"] > 0 and pair["off"] > 0 and goodput.Account is account
  saved = json.loads((tmp_path / "overhead.json").read_text())
  assert saved["pairs"] == [pair] and saved["cost"] == pytest.approx(1 - pair["on"] / pair["off"])
  assert saved["provenance"]["machine"]["cores"] >= 1
  assert 0 < saved["bookkeeping_s_per_step"] < saved["step_s"]
  out = capsys.readouterr().out
  assert re.search(r"^the account's own work: [\d.]+ µs per step, [\d.]+% of the step", out, re.M)
  assert re.search(
    r"^pair 1: on [\d.]+ images/s, off [\d.]+ images/s, cost [+-][\d.]+%$", out, re.M
  )
  assert re.search(r"^goodput accounting: cost [+-][\d.]+%, 1 pairs of 3 steps", out, re.M), out


def test_bench_goodput_account_table_has_every_phase_and_its_share():
  from experiments.benchmarks import bench_goodput

  account = dict.fromkeys(goodput.PHASES, 0.0) | dict(step=30.0, compile=10.0, lost=0.0)
  account["total"] = 40.0
  lines = bench_goodput.account_table(account).splitlines()
  assert len(lines) == 2 + len(goodput.PHASES) + 2  # header, rule, phases, lost, total
  assert "| step | 30.0 | 75.0% |" in lines and "| compile | 10.0 | 25.0% |" in lines
  assert lines[-1] == "| total | 40.0 | |"


# --------------------------------------------------------------------------------------------
# Through the entry point.
TOTAL, DELAY, KILL_AT = 10, 0.4, 9
FLAGS = [
  "--config=configs/pretrain.py:dataset=fashion_mnist,runlocal",
  f"--config.total_steps={TOTAL}",
  "--config.evals.val.every_steps=0",  # the classification evaluator at the end only
  "--config.evals.fewshot_animal_mnist.every_steps=-1",
  "--config.evals.fewshot_mnist_5k.every_steps=-1",
  "--config.profile.first_step=2",
  "--config.profile.num_steps=2",
]


def _run(workdir, command, **fault) -> subprocess.CompletedProcess:
  env = fault_injection.child_env(xla_env.child_env(1, TF_CPP_MIN_LOG_LEVEL="2"), **fault)
  return subprocess.run(
    [*command, f"--workdir={workdir}"],
    env=env,
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=600,
  )


@pytest.fixture(scope="module")
def killed_and_rerun(tmp_path_factory):
  """The workdir after both runs, the restored step, and the account command's output."""
  workdir = tmp_path_factory.mktemp("goodput") / "run"
  killed = _run(
    workdir,
    fault_injection.command(*FLAGS),
    signal="SIGKILL",
    at=KILL_AT,
    data_delay=DELAY,
  )
  assert fault_injection.marker("SIGKILL", KILL_AT) in killed.stdout, killed.stderr[-3000:]
  committed = train_state.committed_steps(workdir)
  (workdir / profiling.REQUEST_FILE).write_text("2\n")  # for the rerun: a trace on request
  rerun = _run(workdir, [sys.executable, "-m", "vit_jax.main", *FLAGS])
  assert rerun.returncode == 0, rerun.stderr[-3000:]
  shown = _run(workdir, [sys.executable, "-m", "vit_jax.tools.goodput"])
  assert shown.returncode == 0, shown.stderr[-3000:]
  print(shown.stdout)  # with -s: the account
  return workdir, committed, shown.stdout


@pytest.mark.long
def test_a_slow_input_pipeline_shows_in_the_data_wait_share(killed_and_rerun):
  workdir, committed, shown = killed_and_rerun
  first, second = goodput.read(workdir)["attempts"]
  restored = second["start_step"]
  # The killed run counts up to the save the rerun restored: its batches 1..restored each
  # waited DELAY seconds in next() (the rerun's input pipeline is not slowed).
  assert first["counted_to"] == restored
  assert first["counted"]["data_wait"] >= DELAY * restored
  line = next(x for x in shown.splitlines() if x.startswith("data wait"))
  total = goodput.totals([first, second])
  assert line.split()[-1] == f"{100 * total['data_wait'] / total['total']:.1f}%"


@pytest.mark.long
def test_a_sigkilled_and_rerun_workdir_shows_the_lost_time_and_no_recomputed_step(
  killed_and_rerun,
):
  workdir, committed, shown = killed_and_rerun
  first, second = goodput.read(workdir)["attempts"]
  # The rerun continued from the newest committed step: nothing trained twice that was saved.
  assert second["start_step"] == committed[-1] and second["source"] == "persistent"
  assert second["recomputed_steps"] == 0 and "steps recomputed: 0" in shown
  # Lost: the killed run's batches after that step (each DELAY late) and the time to the rerun.
  assert second["lost_s"] >= DELAY * (KILL_AT - 1 - committed[-1])
  assert second["end"]["outcome"] == "finished" and second["end"]["step"] == TOTAL
  lost = goodput.totals([first, second])["lost"]
  assert next(x for x in shown.splitlines() if x.startswith("lost")).split()[1] == f"{lost:.1f}"


@pytest.mark.long
def test_profiles_from_the_config_and_from_a_request_hold_the_train_step(killed_and_rerun):
  workdir, _, _ = killed_and_rerun
  runs = sorted(p.name for p in (workdir / "plugins" / "profile").iterdir())
  assert "steps_2-3" in runs and len(runs) == 2, runs  # the config's, the request's
  for run in runs:
    (trace,) = (workdir / "plugins" / "profile" / run).glob("*.xplane.pb")
    data = trace.read_bytes()
    # The trainer's jitted step (its HLO module) and the step annotations of the loop.
    assert b"jit_train_step" in data and b"train" in data, run
  assert not (workdir / profiling.REQUEST_FILE).exists()  # served, then removed
  requested = next(r for r in runs if r != "steps_2-3")
  first, last = map(int, requested.removeprefix("steps_").split("-"))
  assert last - first == 1  # the 2 steps asked for
  assert json.loads((workdir / "config.json").read_text())["profile"]["first_step"] == 2
