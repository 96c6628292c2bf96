"""experiments/benchmark_model.py: the paired (turn-taking) comparison and its ratios."""

import re
import subprocess
import sys

import pytest

sys.path.insert(0, "experiments")

import benchmark_model  # noqa: E402


def test_paired_ratio_follows_the_rounds_not_the_drift():
  # Round 2 ran while the machine was slow for both sides: the timm side was 1.2x slower in
  # every round but that one's neighbour, so the paired median says 1.2; the ratio of the
  # medians mixes rounds from different machine states.
  jax_times = [1.0, 1.0, 3.0]
  timm_times = [1.2, 3.3, 3.6]
  assert benchmark_model.ratio(timm_times, jax_times, paired=True) == pytest.approx(1.2)
  assert benchmark_model.ratio(timm_times, jax_times, paired=False) == pytest.approx(3.3)
  q1, q3 = benchmark_model.ratio_quartiles(timm_times, jax_times)
  assert q1 == pytest.approx(1.2) and q3 == pytest.approx(3.3)
  assert benchmark_model.ratio_quartiles([1.0], [1.0]) is None


def test_paired_mode_takes_turns_between_processes(tmp_path):
  # The working tree against itself at HEAD: two JAX processes alive at once, taking turns.
  proc = subprocess.run(
    [
      sys.executable,
      "experiments/benchmark_model.py",
      "--models=testing",
      "--image_size=16",
      "--num_classes=10",
      "--batch_sizes=2",
      "--modes=forward",
      "--timm=off",
      "--baseline_rev=HEAD",
      "--paired",
      "--pause=0",
      "--repeats=3",
      "--iters=2",
    ],
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = proc.stdout
  assert "== jax (own process, taking turns)" in out
  assert "== baseline (own process, taking turns)" in out
  assert out.count("jax 0.") == 2, out  # each process reports its backend once
  summary = re.search(
    r"testing b2 float32  forward: jax [\d.]+ \([\d.]+\), jax@HEAD [\d.]+ \([\d.]+\) "
    r"ratio x([\d.]+) \(rounds' ratios IQR ([\d.]+)-([\d.]+)\)",
    out,
  )
  assert summary, out
  median, q1, q3 = map(float, summary.groups())
  assert 0 < q1 <= median <= q3
