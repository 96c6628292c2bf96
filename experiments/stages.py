"""Running `python -m vit_jax.main` stages from the experiments, each in its own process.

Every experiment that chains stages (demo.py, scale_study.py, folder_transfer.py) runs them
through `run_stage`: the command is printed so that a reader can rerun any stage by hand, the
progress lines (metrics, ETA, errors) are shown as they come, and the last value of every metric
the stage logged is returned.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Metric lines of the trainer's log ('[step] k=v, ...'), and the lines worth showing.
_METRICS = re.compile(r"logging_writer\.py:\d+\] \[(\d+)\] (.*)$")
_SHOW = ("loss=", "accuracy=", "shot=", "ETA", "Error", "error", "Traceback")
DONE = "metrics.json"  # written into a stage's workdir when it finished


def parse_metrics(line: str, into: dict[str, float]) -> bool:
  """Adds the metrics of a trainer log line to `into` (and 'step'); False if it has none."""
  m = _METRICS.search(line)
  if not m:
    return False
  for item in m.group(2).split(", "):
    key, _, value = item.partition("=")
    try:
      into[key.strip()] = float(value)
    except ValueError:
      pass
  into["step"] = float(m.group(1))
  return True


def run_stage(
  title: str, args: list[str], workdir: str, *, resume: bool = False, verbose: bool = False
) -> tuple[dict[str, float], float]:
  """Runs `python -m vit_jax.main ARGS --workdir=WORKDIR`; returns (last metrics, seconds).

  Args:
    title: printed above the command.
    args: the stage's flags (--config=... and overrides).
    workdir: the stage's workdir.
    resume: a stage that finished before (its workdir holds metrics.json) is not run again: its
      saved metrics and wall time are returned; an interrupted one continues from its last
      checkpoint. Otherwise the workdir is removed first, so the stage measures from scratch.
    verbose: show every log line, not just metrics, ETA and errors.

  Raises:
    SystemExit: the stage failed; its log's last lines are printed to stderr.
  """
  done = os.path.join(workdir, DONE)
  if resume and os.path.exists(done):
    print(f"-- {title}: finished earlier ({workdir})", flush=True)
    with open(done) as f:
      metrics = json.load(f)
    return metrics, metrics["wall_seconds"]
  if not resume:
    shutil.rmtree(workdir, ignore_errors=True)
  cmd = [sys.executable, "-m", "vit_jax.main", *args, f"--workdir={workdir}"]
  print(f"\n== {title}\n  python -m vit_jax.main " + " \\\n      ".join(cmd[3:]), flush=True)
  env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
  env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  start = time.perf_counter()
  metrics: dict[str, float] = {}
  tail: list[str] = []
  with subprocess.Popen(
    cmd + ["--alsologtostderr"],
    cwd=REPO,
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
    bufsize=1,
  ) as proc:
    for line in proc.stdout:
      line = line.rstrip()
      tail = (tail + [line])[-40:]
      is_metrics = parse_metrics(line, metrics)
      if verbose or ((is_metrics or "ETA" in line) and any(s in line for s in _SHOW)):
        shown = line if verbose else line.split("] ", 1)[-1]
        print(f"  {time.perf_counter() - start:6.0f}s  {shown[:150]}", flush=True)
  seconds = time.perf_counter() - start
  if proc.returncode:
    print("\n".join(tail), file=sys.stderr)
    raise SystemExit(f"stage '{title}' failed (exit {proc.returncode}); log tail above")
  metrics["wall_seconds"] = seconds
  with open(done, "w") as f:
    json.dump(metrics, f, indent=2, sort_keys=True)
  return metrics, seconds


def fmt_seconds(seconds: float) -> str:
  """'12m05s' (or '42s')."""
  return f"{int(seconds // 60)}m{int(seconds % 60):02d}s" if seconds >= 60 else f"{seconds:.0f}s"
