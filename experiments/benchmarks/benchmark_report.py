"""benchmark_model's report: the vit_jax / other-side ratios and the printed rows and summary.

Not an experiment of its own: `experiments.benchmarks.benchmark_model` prints its measurements with it.
"""

import statistics


def variant(row: dict) -> tuple:
  """What makes two rows the same measurement: (model, batch, dtype, mode)."""
  return tuple(row[k] for k in ("model", "batch", "dtype", "mode"))


def ratio(times: list[float], ref_times: list[float], paired: bool) -> float:
  """How many times faster `ref` (JAX) ran than `times`' side: paired (round i of both sides
  timed seconds apart), the median of the rounds' ratios; otherwise the ratio of the medians."""
  if paired:
    return statistics.median(t / r for t, r in zip(times, ref_times, strict=True))
  return statistics.median(times) / statistics.median(ref_times)


def ratio_quartiles(times: list[float], ref_times: list[float]) -> tuple[float, float] | None:
  """The first and third quartiles of paired rounds' ratios (None for fewer than two rounds)."""
  if len(times) < 2:
    return None
  q = statistics.quantiles([t / r for t, r in zip(times, ref_times, strict=True)], n=4)
  return q[0], q[2]


def _fmt(x, spec, missing="-"):
  return missing if x is None else format(x, spec)


def print_row(row, header=False):
  if header:
    print(
      f"{'model':10} {'batch':>5} {'dtype':8} {'mode':7} {'impl':12} {'img/s':>8} {'ms/step':>9}"
      f" {'spread':>6} {'best':>8} {'TFLOP/s':>7} {'XLA':>6} {'%peak':>6} {'jax/this':>8}"
    )
  print(
    f"{row['model']:10} {row['batch']:5d} {row['dtype']:8} {row['mode']:7} {row['impl']:12}"
    f" {row['img_s']:8.2f} {row['step_ms']:9.1f} {row['spread']:6.1%} {row['best_img_s']:8.2f}"
    f" {_fmt(row['tflops'], '7.3f')} {_fmt(row['xla_tflops'], '6.3f')}"
    f" {_fmt(row['peak'] and 100 * row['peak'], '6.1f')} {_fmt(row['vs'], '8.3f')}",
    flush=True,
  )


def print_summary(rows, paired: bool):
  """One line per (model, dtype, mode): JAX images/s and its ratio to each other variant."""
  print(
    "\nSummary: images/s of the median round (of the best round); ratio = JAX's over the"
    " other's, >1 means JAX is faster"
    + ("; --paired: median of the rounds' ratios" if paired else "")
  )
  for k in dict.fromkeys(map(variant, rows)):
    group = [r for r in rows if variant(r) == k]
    parts = [f"{group[0]['impl']} {group[0]['img_s']:.2f} ({group[0]['best_img_s']:.2f})"]
    for r in group[1:]:
      if r["vs_quartiles"]:
        detail = "rounds' ratios IQR {:.3f}-{:.3f}".format(*r["vs_quartiles"])
      else:
        detail = f"x{r['vs_best']:.3f}"
      parts.append(
        f"{r['impl']} {r['img_s']:.2f} ({r['best_img_s']:.2f}) ratio x{r['vs']:.3f} ({detail})"
      )
    print(f"  {k[0]} b{k[1]} {k[2]:8} {k[3]:7}: " + ", ".join(parts))
