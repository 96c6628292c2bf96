"""Every figure in README.md and docs/ comes from a results file, or says what tree it is from.

In a page's source (HTML comments: invisible once rendered):

    <!-- results-table: experiments/results/demo/table.md -->
    | the table, exactly as that file holds it |

    <!-- results: experiments/results/demo/results.json -->
    ... reached 83.0%<!-- = 100 * r["pretrain"]["val/accuracy"] --> on Fashion-MNIST ...

A `results-table` is the file's own table, line for line; a figure followed by `<!-- = EXPR -->`
is EXPR evaluated on the page's last `results` file (`r`), rounded as the page shows it. A table
of measurements that no results file holds is preceded by its label instead,

    <!-- measured: <commit> <date>, <machine> -->     (or <!-- paper: Table 2 --> for the paper's)

and every results file a page cites records the commit, date and machine it is from
(experiments/common.py `provenance`).
"""

import json
import re

import pytest

from tests.helpers import doc_commands

REPO = doc_commands.REPO
PAGES = doc_commands.PAGES  # README.md and docs/**/*.md

_TABLE = re.compile(r"<!--\s*results-table:\s*(\S+)\s*-->\s*\n((?:\|.*\n?)+)")
_RESULTS = re.compile(r"<!--\s*results:\s*(\S+)\s*-->")
_FIGURE = re.compile(r"([+-]?[\d,]*\d(?:\.\d+)?)(%| points| pp)?\s*<!--\s*=\s*(.*?)\s*-->")
_MEASURED = re.compile(r"<!--\s*measured:\s*(\S+)\s+(\d{4}-\d{2}-\d{2}),\s*(.+?)\s*-->")
_PAPER = re.compile(r"<!--\s*paper:\s*(.+?)\s*-->")  # the paper's own figures
# A cell that reports a measurement: a percentage with decimals, a time, a size, a rate, a ratio.
_MEASUREMENT = re.compile(
  r"\d\.\d+ ?%|\b\d+\.\d\d\b|\d(?:\.\d+)?e-\d+|\b\d+(?:\.\d+)? ?(?:ms|µs|s|min|GiB|MiB|GB|MB|KiB|kB|img/s|images/s)\b|\d\.\d+ ?[x×]"
)


def _text(page: str) -> str:
  return (REPO / page).read_text()


def _tables(text: str):
  """(line number, the lines before it, table lines) of every markdown table outside code blocks."""
  lines, in_code, i = text.splitlines(), False, 0
  while i < len(lines):
    if lines[i].startswith("```"):
      in_code = not in_code
    elif not in_code and lines[i].startswith("|") and i + 1 < len(lines) and "---" in lines[i + 1]:
      j = i
      while j < len(lines) and lines[j].startswith("|"):
        j += 1
      yield i + 1, lines[max(0, i - 3) : i], lines[i:j]
      i = j
      continue
    i += 1


def _provenance(path: str) -> dict:
  data = json.loads((REPO / path).read_text())
  record = data.get("provenance") if isinstance(data, dict) else None
  assert record, f"{path}: no provenance (commit, date, machine)"
  assert record.get("commit") and record.get("date") and record.get("machine"), (path, record)
  return data


@pytest.mark.parametrize("page", PAGES)
def test_results_tables_are_their_files(page):
  for path, table in _TABLE.findall(_text(page)):
    file = REPO / path
    assert file.exists(), f"{page}: results-table {path} does not exist"
    want = [line.rstrip() for line in file.read_text().strip().splitlines()]
    got = [line.rstrip() for line in table.strip().splitlines()]
    assert got == want, f"{page}: the table after results-table {path} differs from the file"
    results = file.parent / "results.json"
    if results.exists():
      _provenance(str(results.relative_to(REPO)))


def _shown_matches(shown: str, value: float) -> bool:
  """`shown` (as printed: '92.5', '+8.2', '1,000') is `value` rounded to its digits."""
  number = float(shown.replace(",", ""))
  decimals = len(shown.split(".")[1]) if "." in shown else 0
  return abs(number - value) <= 0.5 * 10.0**-decimals + 1e-9


@pytest.mark.parametrize("page", PAGES)
def test_quoted_figures_are_their_results(page):
  text = _text(page)
  marks = [(m.start(), m.group(1)) for m in _RESULTS.finditer(text)]
  for figure in _FIGURE.finditer(text):
    before = [path for start, path in marks if start < figure.start()]
    assert before, f"{page}: figure {figure.group(0)!r} without a results file before it"
    results = _provenance(before[-1])
    value = eval(figure.group(3), {"__builtins__": {}}, {"r": results, "abs": abs})  # noqa: S307
    assert _shown_matches(figure.group(1), float(value)), (
      f"{page}: {figure.group(1)}{figure.group(2) or ''} but {before[-1]} gives {value:.6g} "
      f"({figure.group(3)})"
    )


@pytest.mark.parametrize("page", PAGES)
def test_every_table_of_measurements_has_its_source(page):
  for line, before, table in _tables(_text(page)):
    cells = "\n".join(table[2:])
    if not _MEASUREMENT.search(cells):
      continue
    context = "\n".join(before)
    labelled = _MEASURED.search(context) or _PAPER.search(context)
    assert _TABLE.search(context + "\n" + "\n".join(table) + "\n") or labelled, (
      f"{page}:{line}: a table of measurements with neither a results-table file nor a "
      f"`<!-- measured: <commit> <date>, <machine> -->` label just before it"
    )


def test_the_checks_catch_a_stale_figure():
  assert _shown_matches("92.5", 0.925 * 100) and _shown_matches("+8.2", 8.2000001)
  assert not _shown_matches("91.9", 92.5) and not _shown_matches("1,000", 1002)
  figure = _FIGURE.search('reaches 91.9%<!-- = 100 * r["x"] --> on')
  assert figure.groups() == ("91.9", "%", '100 * r["x"]')
  assert _MEASURED.search("<!-- measured: a939a5b 2026-12-03, 2-core AMD EPYC (AVX2) -->")
