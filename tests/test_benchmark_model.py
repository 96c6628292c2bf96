"""experiments/benchmarks/benchmark_model.py: the paired (turn-taking) comparison against a baseline tree of
its own vit_jax, its ratios, the CPU header."""

import os
import re
import shutil
import statistics
import subprocess
import sys

import jax
import pytest

from experiments.benchmarks import benchmark_model, benchmark_report
from tests.helpers import REPO, this_thread
from vit_jax.cost import devices
from vit_jax.runtime import cli


def test_paired_ratio_follows_the_rounds_not_the_drift():
  # Round 2 ran while the machine was slow for both sides: the timm side was 1.2x slower in
  # every round but that one's neighbour, so the paired median says 1.2; the ratio of the
  # medians mixes rounds from different machine states.
  jax_times = [1.0, 1.0, 3.0]
  timm_times = [1.2, 3.3, 3.6]
  assert benchmark_report.ratio(timm_times, jax_times, paired=True) == pytest.approx(1.2)
  assert benchmark_report.ratio(timm_times, jax_times, paired=False) == pytest.approx(3.3)
  q1, q3 = benchmark_report.ratio_quartiles(timm_times, jax_times)
  assert q1 == pytest.approx(1.2) and q3 == pytest.approx(3.3)
  assert benchmark_report.ratio_quartiles([1.0], [1.0]) is None


# Two logical CPUs of an AVX-512 server as Linux lists them (flags shortened).
CPUINFO = """\
processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
cpu MHz\t\t: 2699.998
flags\t\t: fpu sse2 avx fma avx2 avx512f avx512bw avx512_bf16 amx_tile

processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
cpu MHz\t\t: 3100.5
flags\t\t: fpu sse2 avx fma avx2 avx512f avx512bw avx512_bf16 amx_tile
"""


def test_cpu_header_names_the_model_and_its_matmul_features(monkeypatch):
  # The header the benchmark prints (vit_jax.cost.devices.cpu_description) and its CPU peak.
  info = devices.parse_cpuinfo(CPUINFO)
  assert info.model == "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz"
  assert info.mhz == [2699.998, 3100.5]
  # avx512bw is not one of the features reported; amx_bf16 is absent from these flags.
  assert info.describe() == (
    "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz; avx2 fma avx512f avx512_bf16 amx_tile, "
    "no amx_bf16"
  )
  avx2_only = devices.parse_cpuinfo("model name : AMD EPYC 7B12\nflags : sse2 fma avx2\n")
  assert avx2_only.describe() == "AMD EPYC 7B12; avx2 fma, no avx512f avx512_bf16 amx_bf16 amx_tile"
  # An aarch64 machine lists neither a model name nor these flags.
  arm = devices.parse_cpuinfo("processor : 0\nFeatures : fp asimd\nCPU part : 0xd0c\n")
  assert arm.describe() == "unknown model; none of avx2 fma avx512f avx512_bf16 amx_bf16 amx_tile"
  # The peak estimate reads the same parse: AVX-512, the fastest core's clock, the usable CPUs.
  fake = this_thread.only(lambda pid: {0, 1}, os.sched_getaffinity)  # every thread's os
  monkeypatch.setattr(os, "sched_getaffinity", fake)
  peak, how = devices.cpu_peak(info)
  assert peak == pytest.approx(2 * 2 * 16 * 2 * 3.1005e9)
  assert "AVX-512" in how
  assert devices.read_cpuinfo("/nonexistent/cpuinfo") is None
  assert "/proc/cpuinfo unreadable" in devices.cpu_description(None)


def _benchmark(*args: str) -> str:
  """The stdout of `python -m experiments.benchmarks.benchmark_model` timing the forward pass of the tiny
  `testing` model at 16px, without timm, with `args` added."""
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "experiments.benchmarks.benchmark_model",
      "--models=testing",
      "--image_size=16",
    ]
    + ["--num_classes=10", "--batch_sizes=2", "--modes=forward", "--timm=off", *args],
    capture_output=True,
    text=True,
    timeout=600,
    cwd=REPO,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  return proc.stdout


def _rounds(out: str, impl: str) -> list[float]:
  m = re.search(
    rf"^  {impl} ViT-testing float32 forward: [\d.]+ img/s; rounds \(ms\): (.*)$", out, re.M
  )
  assert m, out
  return [float(t) for t in m.group(1).split()]


def test_paired_mode_takes_turns_between_processes(tmp_path):
  # The working tree against a copy of its whole vit_jax package (a tree, no git needed): two
  # JAX processes alive at once, each importing its own vit_jax, taking turns.
  baseline = tmp_path / "before"
  shutil.copytree(
    os.path.join(REPO, "vit_jax"),
    baseline / "vit_jax",
    ignore=shutil.ignore_patterns("__pycache__"),
  )
  out = _benchmark(
    f"--baseline_dir={baseline}", "--paired", "--pause=0", "--repeats=3", "--iters=2"
  )
  assert re.search(r"^\d+ CPUs: .+; ", out, re.M), out  # the header names the CPU
  assert "== jax (own process, taking turns)" in out
  assert "== baseline (own process, taking turns)" in out
  # Each process reports its backend once (whatever jax's version: 0.x or later), and the
  # vit_jax it imported: this checkout's for the jax side, the copy's for the baseline.
  assert out.count(f"jax {jax.__version__} on ") == 2, out
  imported = re.findall(r"^  vit_jax (\S+); XLA_FLAGS=", out, re.M)
  assert imported == [
    os.path.realpath(os.path.join(REPO, "vit_jax", "__init__.py")),
    os.path.realpath(baseline / "vit_jax" / "__init__.py"),
  ], out
  summary = re.search(
    r"testing b2 float32  forward: jax [\d.]+ \([\d.]+\), jax@before [\d.]+ \([\d.]+\) "
    r"ratio x([\d.]+) \(rounds' ratios IQR ([\d.]+)-([\d.]+)\)",
    out,
  )
  assert summary, out
  # The ratio and its quartiles are those of the rounds each side printed, round i against
  # round i (to the printed precision).
  jax_rounds, base_rounds = _rounds(out, "jax"), _rounds(out, "baseline")
  assert len(jax_rounds) == len(base_rounds) == 3
  ratios = [b / j for b, j in zip(base_rounds, jax_rounds, strict=True)]
  quartiles = statistics.quantiles(ratios, n=4)
  expected = (statistics.median(ratios), quartiles[0], quartiles[2])
  assert [float(x) for x in summary.groups()] == pytest.approx(expected, abs=1.5e-3)


def test_one_process_at_a_time_against_a_git_revision():
  # --baseline_rev: the revision's vit_jax package exported (git archive) to a temporary tree;
  # the sides run one after the other, each with the same options (--xla_flags included, added
  # once, to which each process's vit_jax adds its defaults).
  flag = "--xla_cpu_enable_fast_math=false"
  out = _benchmark("--repeats=2", "--iters=1", "--baseline_rev=HEAD", f"--xla_flags={flag}")
  assert "== jax (own process)" in out and "== baseline (own process)" in out, out
  imported = re.findall(r"^  vit_jax (\S+); XLA_FLAGS='(.*)'$", out, re.M)
  assert imported[0][0] == os.path.realpath(os.path.join(REPO, "vit_jax", "__init__.py")), out
  baseline_file = imported[1][0]
  assert os.path.basename(os.path.dirname(os.path.dirname(baseline_file))).startswith(
    "vit_jax_baseline_"
  ), out
  assert not os.path.exists(baseline_file)  # the temporary tree is gone
  for _, xla_flags in imported:
    assert xla_flags.split().count(flag) == 1, out
  assert len(_rounds(out, "jax")) == len(_rounds(out, "baseline")) == 2
  assert re.search(r"testing b2 float32  forward: jax [\d.]+ \([\d.]+\), jax@HEAD ", out), out


def _git(cwd, *args):
  subprocess.run(
    ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
    capture_output=True,
  )  # fmt: skip


def test_baseline_rev_outside_a_git_checkout_is_one_line(tmp_path, monkeypatch, capsys):
  # A copy of the tree without `.git`: --baseline_rev names itself and the folder in one line
  # (SystemExit's message, no traceback), before the header or any process is started.
  monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))  # git looks no higher
  tree = tmp_path / "tree"
  tree.mkdir()
  monkeypatch.setattr(benchmark_model.common, "REPO", str(tree))
  with pytest.raises(SystemExit) as exit_info:
    cli.call(benchmark_model, ["--baseline_rev=HEAD", "--timm=off"])
  message = str(exit_info.value)
  assert message.startswith(f"--baseline_rev=HEAD: {tree} is not a git checkout; ")
  assert "--baseline_dir" in message and "\n" not in message
  assert capsys.readouterr().out == ""
  # A folder inside another repository is not a checkout of its own: git archive would read
  # that one's revision.
  _git(tmp_path, "init", "-q", "outer")
  inner = tmp_path / "outer" / "inner"
  inner.mkdir()
  with pytest.raises(SystemExit, match=r"is not a git checkout \(it lies inside another one"):
    benchmark_model._check_baseline_rev("HEAD", str(inner))
  # In a checkout: a revision it holds passes, one it does not is named.
  _git(tmp_path / "outer", "commit", "-q", "--allow-empty", "-m", "first")
  benchmark_model._check_baseline_rev("HEAD", str(tmp_path / "outer"))
  with pytest.raises(SystemExit, match=r"^--baseline_rev=nope: no such revision in the git"):
    benchmark_model._check_baseline_rev("nope", str(tmp_path / "outer"))
  # Without git at all: one line too, not a FileNotFoundError.
  monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))
  with pytest.raises(SystemExit, match=r"^--baseline_rev=HEAD: git is not installed; "):
    benchmark_model._check_baseline_rev("HEAD", str(tree))
