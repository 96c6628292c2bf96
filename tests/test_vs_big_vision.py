"""experiments/vs_big_vision.py and experiments/big_vision_step.py: the bisection for the largest
batch, the report, big_vision's recipe step around a stand-in model, (slow, with a big_vision
checkout named by $BIG_VISION_DIR) both sides of the smallest row compiled for CPU devices, and
(slow, libtpu) the --quick profile against the committed results' fingerprint."""

import json
import os
import sys
import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from experiments import big_vision_step, fingerprint, vs_big_vision
from tests.helpers import REPO
from tests.helpers.libtpu_process import needs_libtpu, run_with_libtpu
from vit_jax.cost import compiled_stats

GiB = 2**30


def _fake_result(batch: int, hbm: int = 16 * GiB, fixed: float = 3.0, per_example: float = 0.1):
  """A compile's result whose total grows linearly with the batch; refused above 1.2 x HBM."""
  total = int((fixed + per_example * batch) * GiB)
  return dict(
    stats=dict(
      total=total, temp=total - int(fixed * GiB), params=GiB, opt_state=2 * GiB,
      gradients=int(0.5 * GiB), code=0, flops_xla=1e12 * batch, flops=1e12 * batch,
      collectives={"all-reduce": {"count": 1.0, "bytes": 1e9}},
    ),
    refused="RESOURCE_EXHAUSTED" if total > 1.2 * hbm else "",
    fits=total <= hbm,
    hbm=hbm,
    compile_seconds=60.0,
  )  # fmt: skip


def test_the_largest_batch_is_found_in_few_compiles():
  # 3 + 0.1 b GiB <= 16: b <= 130, so 128 (a multiple of 8); 1 + 0.05 b <= 16: b <= 300 → 296.
  for per_example, fixed, want in [(0.1, 3.0, 128), (0.05, 1.0, 296), (20.0, 1.0, 0)]:
    compiled = []

    def measure(b, per_example=per_example, fixed=fixed, compiled=compiled):
      compiled.append(b)
      return _fake_result(b, fixed=fixed, per_example=per_example)

    largest, tried = vs_big_vision.largest_batch(measure, 64, 16 * GiB)
    assert largest == want and sorted(set(compiled)) == tried
    assert len(compiled) <= 5, compiled


def test_the_search_bisects_where_the_compiler_rematerialises_to_fit():
  """Near the HBM the TPU compiler trades FLOPs for memory: the total stops growing with the
  batch until it refuses. A straight line then points far off; the search still halves its
  bracket (here: fits up to 424 per device at 15.9 GiB)."""
  compiled = []

  def measure(b):
    compiled.append(b)
    r = _fake_result(b, per_example=0.06)
    if b > 200:
      r["stats"]["total"] = int(15.9 * GiB)
      r["fits"], r["refused"] = b <= 424, "" if b <= 424 else "RESOURCE_EXHAUSTED"
    return r

  largest, _ = vs_big_vision.largest_batch(measure, 176, 16 * GiB)
  assert largest == 424 and len(compiled) <= 10, compiled


def test_a_row_and_its_table():
  calls = []

  def compile_(side, model, topology, batch):
    calls.append((side, batch))
    per_example = {"vit_jax": 0.1, "big_vision": 0.2, vs_big_vision.SAME_STATE: 0.09}[side]
    return _fake_result(batch, per_example=per_example)

  row = vs_big_vision.run_row(compile_, "B/16", "v3:2x2", start=64)
  assert row["sides"]["vit_jax"]["largest_batch"] == 128
  assert row["sides"]["big_vision"]["largest_batch"] == 64
  assert (vs_big_vision.SAME_STATE, 64) in calls  # at the first batch only
  text = vs_big_vision.table([row])
  line = text.splitlines()[2]
  assert line.startswith("| B/16 | v3:2x2 | 64 | 6.40 GiB / 12.80 GiB | ")
  # totals, their ratio, and with vit_jax's Adam state as big_vision's
  assert "| 9.40 / 15.80 of 16 GiB | 0.595 | 0.554 | 64,000 / 64,000 | 1.000 |" in line
  assert line.endswith("| 60 / 60 | 128 (+0.0%) / 64 (+0.0%) |")

  calls.clear()  # --nosearch: each side at the first batch only, and no largest batch
  row = vs_big_vision.run_row(compile_, "B/16", "v3:2x2", start=64, search=False)
  assert sorted(calls) == sorted(
    (side, 64) for side in (*vs_big_vision.SIDES, vs_big_vision.SAME_STATE)
  )
  assert all(row["sides"][side]["largest_batch"] is None for side in vs_big_vision.SIDES)
  assert vs_big_vision.table([row]).splitlines()[2].endswith("| — / — |")


class _StandInVit(nn.Module):
  """big_vision's `vit.Model` interface: (logits, intermediates), dropout, dtype_mm."""

  num_classes: int
  width: int = 16
  dropout: float = 0.0
  dtype_mm: str = "float32"

  @nn.compact
  def __call__(self, image, *, train=False):
    x = nn.Dense(self.width, dtype=self.dtype_mm)(image.reshape(image.shape[0], -1))
    x = nn.Dropout(self.dropout)(x, not train)
    return nn.Dense(self.num_classes, name="head", dtype=self.dtype_mm)(x), {}


def test_big_vision_recipe_step_around_a_stand_in_model():
  module = types.SimpleNamespace(Model=lambda **kw: _StandInVit(**kw))
  kwargs = dict(num_classes=10, dropout=0.1, dtype_mm="bfloat16")
  step = big_vision_step.build_step(module, kwargs, jax.devices()[:8], 16, image_size=8)
  adam = step.state["opt_state"][1]
  # The recipe's optimizer state: Adam's first moment in bf16, its second in float32.
  assert {x.dtype for x in jax.tree.leaves(adam.mu)} == {jnp.dtype(jnp.bfloat16)}
  assert {x.dtype for x in jax.tree.leaves(adam.nu)} == {jnp.dtype(jnp.float32)}
  compiled = step.jitted.lower(*step.args).compile()
  stats = compiled_stats.step_stats(compiled, step.state, step.state_shardings, step.batch)
  assert stats.collectives["all-reduce"]["count"] >= 1 and stats.flops > 0
  assert stats.opt_state > stats.params  # mu (2 bytes) + nu (4) per 4-byte parameter


def test_a_folder_without_big_vision_is_one_line(tmp_path):
  with pytest.raises(ValueError, match=r"^--big_vision_dir='.*': no big_vision/models/vit.py"):
    big_vision_step.model_path(str(tmp_path))


@pytest.mark.slow
def test_the_smallest_row_compiles_for_both_sides_on_cpu_devices():
  """The 'testing' ViT at 32px, 2 images per CPU device on 8 devices, both sides' steps compiled
  by the CPU backend (no libtpu), and the report's fields."""
  checkout = os.environ.get("BIG_VISION_DIR", "")
  if not os.path.isfile(os.path.join(checkout, "big_vision", "models", "vit.py")):
    pytest.skip("set BIG_VISION_DIR to a checkout of github.com/google-research/big_vision")

  def compile_(side, model, topology, batch):
    return vs_big_vision.compile_one(
      side, model, topology, batch, checkout, devices=jax.devices()[:8], image_size=32,
      num_classes=10,
    )  # fmt: skip

  row = vs_big_vision.run_row(compile_, "testing", "cpu:8", start=2)
  for side in vs_big_vision.SIDES:
    r = row["sides"][side]["at_start"]
    s = r["stats"]
    assert r["fits"] and not r["refused"] and r["num_devices"] == 8 and r["hbm"] is None
    assert s["temp"] > 0 and s["total"] > s["argument"] > 0 and s["flops_xla"] > 0
    assert s["collectives"]["all-reduce"]["bytes"] > 0 and r["compile_seconds"] > 0
    assert row["sides"][side]["largest_batch"] is None
  assert "big_vision.models.vit" in sys.modules
  line = vs_big_vision.table([row]).splitlines()[2]
  assert line.startswith("| testing | cpu:8 | 2 | ") and line.endswith("| — / — |")


COMMITTED = REPO / "experiments/results/vs_big_vision/results.json"
COMMAND = (
  "python -m experiments.vs_big_vision --big_vision_dir=... with the committed rows' "
  "--models, --topologies and --batch"
)


@pytest.mark.slow  # two compiles of the 'testing' ViT's step for a v4:2x2x2 (libtpu)
@needs_libtpu
def test_quick_profile_matches_the_committed_fingerprint(tmp_path):
  """vit_jax's side of the comparison, compiled today for the --quick row, is what it was when
  the committed results were made (experiments/fingerprint.py)."""
  out = run_with_libtpu(
    [sys.executable, "-m", "experiments.vs_big_vision", "--quick", f"--out_dir={tmp_path}"],
    timeout=900,
  )
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  results = json.loads((tmp_path / "results.json").read_text())
  (row,) = results["rows"].values()
  assert set(row["sides"]) == {"vit_jax"} and row["vit_jax_mu_bf16"]["fits"]
  # big_vision's state: the first moment in bf16, 2 bytes per parameter fewer.
  ours, same_state = row["sides"]["vit_jax"]["at_start"]["stats"], row["vit_jax_mu_bf16"]["stats"]
  assert ours["opt_state"] - same_state["opt_state"] == pytest.approx(ours["params"] / 2, rel=0.01)
  fingerprint.check(json.loads(COMMITTED.read_text()), results, COMMAND)


def test_the_committed_results_were_made_with_todays_configs():
  committed = json.loads(COMMITTED.read_text())
  today = fingerprint.configs(vs_big_vision.stage_configs(list(committed["rows"].values())))
  fingerprint.check_configs(committed, today, COMMAND)
