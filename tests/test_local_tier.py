"""The local checkpoint tier (vit_jax.checkpoint.state.local_tier).

In-process: a state saved to the tier restores bitwise, the newer of the two tiers is taken (the
local one at a tie), a tier of another workdir or topology is emptied, and docs/training.md's
sizes per host are the formula's. Through the entry point on two local processes (slow): a
SIGKILL and a rerun resume from the local tier, ending bitwise equal to an uninterrupted run;
again with one process's local directory deleted, from the workdir's tier.
"""

import re
import shutil
import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from tests.helpers import REPO, fault_injection, local_cluster, this_thread, xla_env
from vit_jax import sharding
from vit_jax.checkpoint.state import local_tier, train_state
from vit_jax.runtime import goodput


def _local(root, **fields) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(
    dict(dict(dir=str(root), every_steps=2, every_minutes=0.0, keep=2), **fields)
  )


def _mesh(n=2):
  return sharding.make_mesh(
    ml_collections.ConfigDict(dict(data=n, fsdp=1, model=1)), jax.devices()[:n]
  )


def _state(mesh, step: int):
  """A small state: a sharded and a replicated array, and the step."""
  rows = jax.device_put(
    jnp.arange(8 * 3, dtype=jnp.float32).reshape(8, 3) * (step + 0.5),
    NamedSharding(mesh, P("data")),
  )
  rep = jax.device_put(jnp.full((5,), step, jnp.float32), NamedSharding(mesh, P()))
  return dict(rows=rows, rep=rep, step=jax.device_put(jnp.int32(step), NamedSharding(mesh, P())))


def _abstract(state):
  return jax.tree_util.tree_map(
    lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state
  )


def _tiers(tmp_path, mesh, **local):
  checkpointer = train_state.Checkpointer(str(tmp_path / "work"), every_steps=4, keep=3)
  tier = local_tier.LocalTier(_local(tmp_path / "local", **local), str(tmp_path / "work"), mesh)
  return checkpointer, tier


def test_the_newest_step_of_either_tier_restores_bitwise(tmp_path):
  mesh = _mesh()
  checkpointer, tier = _tiers(tmp_path, mesh)
  checkpointer.save(4, _state(mesh, 4), {"position": 4}, force=True)
  for step in (4, 6):
    assert tier.save(step, _state(mesh, step), {"position": step})
  checkpointer.wait(), tier.wait()
  assert tier.steps() == [4, 6]

  restored, resume = local_tier.restore_latest(checkpointer, tier, _abstract(_state(mesh, 0)))
  assert resume == local_tier.Resume(step=6, source="local", newest_committed=6)
  step, state, data = restored
  assert step == 6 and data == {"position": 6}
  for key, want in _state(mesh, 6).items():
    np.testing.assert_array_equal(np.asarray(state[key]), np.asarray(want))
    assert state[key].sharding == want.sharding

  checkpointer.save(8, _state(mesh, 8), {"position": 8}, force=True)
  checkpointer.wait()
  restored, resume = local_tier.restore_latest(checkpointer, tier, _abstract(_state(mesh, 0)))
  assert resume.source == "persistent" and restored[0] == 8 and resume.newest_committed == 8
  tier.close(), checkpointer.close()


def test_a_newer_local_step_is_taken_when_the_workdirs_newest_does_not_restore(tmp_path):
  mesh = _mesh()
  checkpointer, tier = _tiers(tmp_path, mesh)
  for step in (4, 8):
    checkpointer.save(step, _state(mesh, step), {"position": step}, force=True)
    checkpointer.wait()
  tier.save(6, _state(mesh, 6), {"position": 6})
  tier.wait()
  state_dir = tmp_path / "work" / train_state.CHECKPOINT_DIR / "8" / "state"
  data = [p for p in state_dir.rglob("*") if p.is_file() and p.parent.name == "d"]
  assert data
  for path in data:
    path.unlink()  # step 8's array data gone: the workdir's step 4 restores, local 6 is newer
  restored, resume = local_tier.restore_latest(checkpointer, tier, _abstract(_state(mesh, 0)))
  assert (restored[0], resume.source, resume.newest_committed) == (6, "local", 8)
  np.testing.assert_array_equal(np.asarray(restored[1]["rows"]), _state(mesh, 6)["rows"])
  tier.close(), checkpointer.close()


def test_a_tier_of_another_run_or_topology_is_emptied_not_read(tmp_path):
  mesh = _mesh()
  checkpointer, tier = _tiers(tmp_path, mesh)
  tier.save(2, _state(mesh, 2), {"position": 2})
  tier.wait(), tier.close(), checkpointer.close()
  # The same path on another mesh: its shards would not be this process's.
  _, other_mesh = _tiers(tmp_path, _mesh(4))
  assert other_mesh.steps() == []
  other_mesh.save(2, _state(_mesh(4), 2), {"position": 2})
  other_mesh.wait(), other_mesh.close()
  # The workdir deleted and made again at the same path: a new run, whose token differs.
  shutil.rmtree(tmp_path / "work")
  _, fresh = _tiers(tmp_path, _mesh(4))
  assert fresh.steps() == []
  fresh.close()


def test_bad_local_settings_are_one_line(tmp_path):
  with pytest.raises(ValueError, match="saves nothing: set checkpoint.local.every_steps"):
    local_tier.LocalTier(_local(tmp_path, every_steps=0), str(tmp_path / "w"), _mesh(1))
  with pytest.raises(ValueError, match="must be a local path"):
    local_tier.LocalTier(_local("gs://b/x"), str(tmp_path / "w"), _mesh(1))
  off = local_tier.LocalTier(_local(""), str(tmp_path / "w"), _mesh(1))
  assert not off.enabled and not off.due(2, True) and not (tmp_path / "w").exists()


def test_every_minutes_saves_at_the_first_log_step_past_the_interval(tmp_path, monkeypatch):
  now = [1000.0]
  fake = this_thread.only(lambda: now[0], local_tier.time.monotonic)  # every thread's clock
  monkeypatch.setattr(local_tier.time, "monotonic", fake)
  tier = local_tier.LocalTier(
    _local(tmp_path / "local", every_steps=0, every_minutes=2.0), str(tmp_path / "w"), _mesh(1)
  )
  now[0] += 150  # past the 2 minutes
  assert not tier.due(7, at_log_step=False) and tier.due(8, at_log_step=True)
  assert tier.save(8, _state(_mesh(1), 8), {"position": 8})
  now[0] += 60
  assert not tier.due(10, at_log_step=True)  # a minute after that save
  tier.wait(), tier.close()


# Parameters at 224px with 1000 classes (tests/test_models.py pins them).
PARAMS = {"ViT-B/16": 86_567_656, "ViT-L/16": 304_326_632, "ViT-H/14": 632_045_800}


def test_the_sizes_per_host_in_the_docs_are_the_formulas():
  text = (REPO / "docs" / "training.md").read_text()
  for name, count in PARAMS.items():
    size = local_tier.bytes_per_host(count) / 2**30
    with_ema = local_tier.bytes_per_host(count, ema=True) / 2**30
    want = f"{name} ({count:,} parameters): {size:.2f} GiB ({with_ema:.2f} GiB with `ema_decay`)"
    assert want in text, want
  assert local_tier.bytes_per_host(1000, share=1 / 4) == 3000


# --------------------------------------------------------------------------------------------
# Two processes through the entry point.
TOTAL, KILL_AT = 12, 9
FLAGS = [
  "--config=configs/pretrain.py:dataset=fashion_mnist,runlocal",
  f"--config.total_steps={TOTAL}",
  "--config.checkpoint.every_steps=5",
  "--config.checkpoint.local.every_steps=2",
  "--config.evals.val.every_steps=0",
  "--config.evals.fewshot_animal_mnist.every_steps=-1",
  "--config.evals.fewshot_mnist_5k.every_steps=-1",
]


def _cluster(workdir, local, faults=None):
  env = xla_env.child_env(1, TF_CPP_MIN_LOG_LEVEL="2")

  def command(port, i):
    flags = [
      *FLAGS,
      f"--workdir={workdir}",
      f"--config.checkpoint.local.dir={local}",
      f"--coordinator_address=127.0.0.1:{port}",
      "--num_processes=2",
      f"--process_id={i}",
    ]
    if not faults:
      return [sys.executable, "-m", "vit_jax.main", *flags]
    variables = [f"{k}={v}" for k, v in fault_injection.env(**faults[i]).items()]
    return ["env", *variables, *fault_injection.command(*flags)]

  return local_cluster.launch(command, num_processes=2, cwd=REPO, env=env)


def _tails(results) -> str:
  return "\n".join(
    f"--- process {i} (exit {c}):\n{out[-3000:]}" for i, (c, out) in enumerate(results)
  )


def _params(workdir):
  return jax.tree_util.tree_leaves_with_path(train_state.restore_params(workdir))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  root = tmp_path_factory.mktemp("uninterrupted")
  results = _cluster(root / "work", root / "local")
  assert all(code == 0 for code, _ in results), _tails(results)
  return root / "work"


def _killed(root):
  """Both processes SIGKILLed at batch KILL_AT (past their local save of step 8, which waited
  for step 6's to be written); the committed steps of either tier."""
  kill = dict(signal="SIGKILL", at=KILL_AT)
  results = _cluster(root / "work", root / "local", faults=[kill, kill])
  assert all(code != 0 for code, _ in results), _tails(results)
  assert any(fault_injection.marker("SIGKILL", KILL_AT) in out for _, out in results)
  assert train_state.committed_steps(root / "work") == [5], _tails(results)
  return results


def _local_steps(local, process) -> list[int]:
  steps = local / f"process_{process}" / "steps"
  return sorted(int(p.name) for p in steps.iterdir() if re.fullmatch(r"\d+", p.name))


@pytest.mark.slow
@pytest.mark.parametrize("lost_local", [False, True], ids=["local", "one_local_dir_deleted"])
def test_two_processes_resume_bitwise_from_the_local_tier(uninterrupted, tmp_path, lost_local):
  _killed(tmp_path)
  local = tmp_path / "local"
  held = [set(_local_steps(local, p)) for p in (0, 1)]
  common = max(held[0] & held[1])
  assert common >= 6, held  # step 6 was written before step 8's save began, on each process
  if lost_local:
    shutil.rmtree(local / "process_1")  # a replaced VM: its local disk is new

  results = _cluster(tmp_path / "work", local)
  assert all(code == 0 for code, _ in results), _tails(results)
  _, second = goodput.read(tmp_path / "work")["attempts"]
  if lost_local:
    # Step 5 from the workdir; the local steps after it that process 0 still held were
    # committed there, and are trained again.
    assert (second["start_step"], second["source"]) == (5, "persistent")
    assert second["recomputed_steps"] == max(held[0]) - 5
  else:
    # A step only one process had finished writing when both were killed is not committed.
    assert (second["start_step"], second["source"]) == (common, "local")
    assert second["recomputed_steps"] == 0
  for (path, got), (_, want) in zip(
    _params(tmp_path / "work"), _params(uninterrupted), strict=True
  ):
    np.testing.assert_array_equal(got, want, err_msg=jax.tree_util.keystr(path))
