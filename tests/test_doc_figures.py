"""Every measured figure in README.md and docs/ comes from a committed file (tests/helpers/doc_figures.py).

In a page's source (HTML comments: invisible once rendered):

    <!-- results-table: experiments/results/demo/table.md -->
    | the table, exactly as that file holds it |

    <!-- results: experiments/results/demo/results.json -->
    ... reached 83.0%<!-- = 100 * r["pretrain"]["val/accuracy"] --> on Fashion-MNIST ...

    <!-- measured: <commit> <date>, <machine>; source: experiments/results/x/run.log -->
    a paragraph or table of figures that log holds

A `results-table` is the file's own table, line for line; a figure followed by `<!-- = EXPR -->`
is EXPR evaluated on the page's last `results` file (`r`), rounded as the page shows it; a table
under a `measured:` mark holds only figures of its files, which git tracks. `<!-- paper: where -->`
marks the paper's figures, `<!-- not measured: what they are -->` settings and targets the
detector takes for measurements. Any other measured figure fails, in the prose (a shell block's
comments included) and in tables wherever they are (in list items, in fences), and every
results file a page cites records the commit, date and machine it is from
(experiments/common.py `provenance`).
"""

import json
import sys

import pytest

from tests.helpers import doc_commands, doc_figures

REPO = doc_commands.REPO
PAGES = doc_commands.PAGES  # README.md and docs/**/*.md


def _text(page: str) -> str:
  return (REPO / page).read_text()


def _provenance(path: str) -> dict:
  data = json.loads((REPO / path).read_text())
  record = data.get("provenance") if isinstance(data, dict) else None
  assert record, f"{path}: no provenance (commit, date, machine)"
  assert record.get("commit") and record.get("date") and record.get("machine"), (path, record)
  return data


def _last_mark(context: str):
  """The mark that labels a table: the last of its context."""
  marks = [
    m
    for pattern in (doc_figures.RESULTS_TABLE, doc_figures.MEASURED, doc_figures.PAPER)
    for m in pattern.finditer(context)
  ]
  return max(marks, key=lambda m: m.start()) if marks else None


def table_faults(page: str, text: str) -> list[str]:
  """What is wrong with the tables of a page: a results-table not its file, a measured table
  with a figure its files lack, a table of measurements without a mark."""
  faults = []
  for table in doc_figures.tables(text):
    where, mark = f"{page}:{table.line}", _last_mark(table.context)
    if mark is not None and mark.re is doc_figures.RESULTS_TABLE:
      file = REPO / mark.group(1)
      if not file.exists():
        faults.append(f"{where}: results-table {mark.group(1)} does not exist")
        continue
      want = [line.strip() for line in file.read_text().strip().splitlines()]
      if table.rows != want:
        faults.append(f"{where}: the table after results-table {mark.group(1)} differs from it")
      results = file.parent / "results.json"
      if results.exists():
        _provenance(str(results.relative_to(REPO)))
    elif mark is not None and mark.re is doc_figures.MEASURED:
      files = doc_figures.sources(mark)
      if not files or not all((REPO / f).exists() for f in files):
        continue  # test_every_measured_mark_names_its_committed_source says so
      held = "\n".join((REPO / f).read_text() for f in files)
      missing = doc_figures.figures_missing_from(table.rows, held)
      if missing:
        faults.append(f"{where}: figures of this measured table not in {files}: {missing}")
    elif mark is None and doc_figures.MEASUREMENT.search("\n".join(table.rows[2:])):
      faults.append(
        f"{where}: a table of measurements without a results-table, measured (with its "
        "source) or paper mark just before it"
      )
  return faults


def prose_faults(page: str, text: str) -> list[str]:
  """The measured figures of a page's prose that nothing backs."""
  spans = doc_figures.covered_spans(text)
  faults = []
  for figure in doc_figures.figures(text):
    if doc_figures.has_expression(text, figure):
      continue
    if any(start <= figure.start < end for start, end, _ in spans):
      continue
    faults.append(f"{page}:{figure.line}: {figure.text!r}")
  return faults


@pytest.mark.parametrize("page", PAGES)
def test_every_table_is_its_source(page):
  faults = table_faults(page, _text(page))
  assert not faults, "\n".join(faults)


@pytest.mark.parametrize("page", PAGES)
def test_every_figure_in_the_prose_has_its_source(page):
  faults = prose_faults(page, _text(page))
  assert not faults, (
    "measured figures without a source: follow each with <!-- = EXPR --> of a results file, "
    "put a <!-- measured: <commit> <date>, <machine>; source: <committed file> --> mark before "
    "its block, or say it without the figure\n" + "\n".join(faults)
  )


@pytest.mark.parametrize("page", PAGES)
def test_every_measured_mark_names_its_committed_source(page):
  for mark in doc_figures.MEASURED.finditer(_text(page)):
    where = f"{page}:{_text(page).count(chr(10), 0, mark.start()) + 1}"
    files = doc_figures.sources(mark)
    assert files, f"{where}: a measured mark without '; source: <file>' (the file that holds it)"
    assert doc_figures.commit_exists(mark.group(1)), f"{where}: no commit {mark.group(1)}"
    for file in files:
      assert doc_figures.committed(file), f"{where}: {file} is not a committed file"


@pytest.mark.parametrize("page", PAGES)
def test_quoted_figures_are_their_results(page):
  text = _text(page)
  marks = [(m.start(), m.group(1)) for m in doc_figures.RESULTS.finditer(text)]
  for figure in doc_figures.FIGURE.finditer(text):
    before = [path for start, path in marks if start < figure.start()]
    assert before, f"{page}: figure {figure.group(0)!r} without a results file before it"
    results = _provenance(before[-1])
    value = eval(figure.group(3), {"__builtins__": {}}, {"r": results, "abs": abs})  # noqa: S307
    assert doc_figures.shown_matches(figure.group(1), float(value)), (
      f"{page}: {figure.group(1)}{figure.group(2) or ''} but {before[-1]} gives {value:.6g} "
      f"({figure.group(3)})"
    )


def test_the_checks_catch_a_stale_figure():
  shown_matches = doc_figures.shown_matches
  assert shown_matches("92.5", 0.925 * 100) and shown_matches("+8.2", 8.2000001)
  assert not shown_matches("91.9", 92.5) and not shown_matches("1,000", 1002)
  assert shown_matches("1.3e-4", 1.26e-4) and not shown_matches("1.3e-4", 1.4e-4)
  figure = doc_figures.FIGURE.search('reaches 91.9%<!-- = 100 * r["x"] --> on')
  assert figure.groups() == ("91.9", "%", '100 * r["x"]')
  figure = doc_figures.FIGURE.search('took 58 minutes<!-- = r["s"] / 60 --> beside')
  assert figure.groups() == ("58", " minutes", 'r["s"] / 60')
  mark = doc_figures.MEASURED.search(
    "<!-- measured: a939a5b 2026-12-03, 2-core AMD EPYC (AVX2); source: a/b.log c.log -->"
  )
  assert doc_figures.sources(mark) == ["a/b.log", "c.log"]


def test_the_checks_catch_an_unbacked_figure():
  """A figure in prose, in a shell block's comment or in a fenced listing fails; one with its
  expression, under a mark, in a code span or in a command does not."""
  text = (
    "It took 12 minutes on 2 cores, at 84.1% top-1.\n\n"
    "<!-- measured: abc1234 2026-12-01, a CPU; source: x.log -->\n"
    "Under the mark: 3.2 ms and 1.05×.\n\n"
    "Set `--steps=600` and reach 90.1%<!-- = r['a'] --> with 64 MB.\n\n"
    "```bash\npython -m a --hold=10%  # about an hour\n```\n\n"
    "```\nrun  1.5 s  2.1e-5\n```\n"
  )
  found = [fault.split(": ", 1)[1] for fault in prose_faults("p.md", text)]
  assert found == ["'12 minutes'", "'84.1%'", "'an hour'", "'1.5 s'", "'2.1e-5'"]


def test_the_checks_catch_a_table_that_is_not_its_file(tmp_path, monkeypatch):
  """A results table in a fence or a list item that differs from its file, a measured table
  with a figure its log lacks, and a table of measurements without a mark."""
  monkeypatch.setattr(doc_figures, "REPO", tmp_path)
  monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
  (tmp_path / "t.md").write_text("| a | b |\n|---|---|\n| x | 1.5% |\n")
  (tmp_path / "run.log").write_text("x: 1.4999 s; y: 20.04 images/s\n")
  good = (
    "- item\n\n  <!-- results-table: t.md -->\n  | a | b |\n  |---|---|\n  | x | 1.5% |\n\n"
    "<!-- measured: abc1234 2026-12-01, a CPU; source: run.log -->\n"
    "| run | time | rate |\n|---|---|---|\n| 1 | 1.50 s | 20.0 img/s |\n"
  )
  assert table_faults("p.md", good) == []
  bad = (
    "<!-- results-table: t.md -->\n```\n| a | b |\n|---|---|\n| x | 1.6% |\n```\n\n"
    "<!-- measured: abc1234 2026-12-01, a CPU; source: run.log -->\n"
    "| run | time | rate |\n|---|---|---|\n| 1 | 1.50 s | 21.0 img/s |\n\n"
    "| run | time |\n|---|---|\n| 1 | 3.5 ms |\n"
  )
  faults = table_faults("p.md", bad)
  assert len(faults) == 3, faults
  assert "differs" in faults[0] and "['21.0']" in faults[1] and "without" in faults[2]
