r"""Prints where a workdir's wall time went: its goodput account over every run (vit_jax.runtime.goodput).

  python -m vit_jax.tools.goodput --workdir=/tmp/vit_pretrain
  python -m vit_jax.tools.goodput --workdir=gs://bucket/pretrain --json

The table of phases (docs/training.md, "The account (goodput)"), then one line per run. A run with
no end record is running, or died: its phases are counted up to its last save. `--json` prints
the totals instead. Reads `<workdir>/goodput.json` only (local or gs://) and writes nothing: a
file that is not a ledger ends in one line naming it and what is wrong.
"""

if __name__ == "__main__":  # the command's process, set up before any thread starts
  from vit_jax.runtime import process

  process.configure()

import json
import time
from collections.abc import Sequence

from vit_jax.runtime import cli


def _when(unix: float) -> str:
  try:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(unix))
  except (OverflowError, ValueError, OSError):  # a ledger's number that is no time: shown as is
    return f"time {unix!r}"


def run_lines(attempts: list[dict]) -> list[str]:
  """One line per run of the ledger."""
  lines = []
  for i, a in enumerate(attempts, 1):
    source = f"the {a['source']} tier" if a.get("source") else "initialised"
    where = f"{a.get('host', '?')} (pid {a.get('pid', '?')}, {a.get('processes', 1)} process(es))"
    end = a.get("end")
    if end:
      how = f"{end['outcome']} at step {end['step']}, {_when(end['time'])}"
    else:
      how = "no end record (killed, or running)"
    if "counted" in a:
      to = a.get("counted_to")  # written with "counted"; absent: none restored
      how += f"; counted up to step {to}" if to is not None else "; all of it lost"
    elif not end:
      marks = a.get("marks") or []
      last = f"its save of step {marks[-1]['step']}" if marks else "its start"
      how += f": counted up to {last}"
    lines.append(
      f"run {i}: started {_when(a['start'])} on {where} at step {a['start_step']} ({source}); "
      f"{how}; lost before it {a.get('lost_s', 0.0):.1f} s, steps recomputed "
      f"{a.get('recomputed_steps', 0)}"
    )
  return lines


define_flags = cli.define_flags(
  workdir=cli.WORKDIR,
  json=cli.Flag(False, "Print the totals as JSON instead of a table."),
)


def main(argv: Sequence[str], f) -> None:
  cli.no_arguments(argv)
  from vit_jax.runtime import goodput, json_file

  try:
    ledger = goodput.read(f.workdir.value)
  except json_file.InvalidFile as e:
    raise json_file.InvalidFile(
      e.path,
      f"not a goodput account ({e.why}); the workdir's next run sets it aside and starts anew",
    ) from None
  if not ledger or not ledger.get("attempts"):
    raise FileNotFoundError(f"{f.workdir.value}/{goodput.FILE}: no goodput account there")
  account = goodput.totals(ledger["attempts"])
  if f.json.value:
    print(json.dumps(account, indent=1, sort_keys=True))
    return
  print(f"{f.workdir.value}: " + goodput.table(account))
  print("\n".join(run_lines(ledger["attempts"])))


if __name__ == "__main__":
  cli.run(main, "goodput", define_flags, errors=(ValueError, OSError))
