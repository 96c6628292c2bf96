"""Where the measured figures of README.md and docs/**/*.md are, and what backs each one.

tests/test_doc_figures.py holds every figure to its source. A page backs a figure in one of three
ways (HTML comments, invisible once rendered):

    <!-- results: experiments/results/demo/results.json -->
    ... reached 83.0%<!-- = 100 * r["pretrain"]["val/accuracy"] --> ...   an expression of the file

    <!-- results-table: experiments/results/demo/table.md -->                the file's own table
    | ... |

    <!-- measured: <commit> <date>, <machine>; source: <file> [<file> ...] -->

A `measured:` mark names the commit the figures were measured at and the committed files that hold
them (a benchmark's log); it covers the next block of the page (a paragraph, a list item, a
table, a fenced block), or the rest of the block it sits in. A table under it is compared with its
files: every figure of the table is a figure of a file, rounded as the table shows it.
`<!-- paper: <where> -->` covers the paper's own figures the same way.

A measured figure is a time, a rate, a percentage (an accuracy, a share, MFU), a difference in
points, a ratio, an error (1.3e-4) or a count of results (5 of 1,000 examples; 773 passed).
Sizes, versions, model names and settings are not. Prose is everything but code: fenced Python and
the commands of shell blocks are skipped (a shell block's comments are prose), as are code spans
(`--steps=600`), link targets and HTML comments. Tables are found wherever they are: at the top
level, inside list items, inside fences.
"""

import dataclasses
import re
import subprocess

from tests.helpers import doc_commands

REPO = doc_commands.REPO

RESULTS_TABLE = re.compile(r"<!--\s*results-table:\s*(\S+)\s*-->")
RESULTS = re.compile(r"<!--\s*results:\s*(\S+)\s*-->")
# A figure followed by the expression of the page's last results file that gives it.
FIGURE = re.compile(
  r"([+-]?[\d,]*\d(?:\.\d+)?)(%|×|[ \t]?(?:points|pp|minutes|seconds|ms|s|MB|GB|images/s))?"
  r"\s*<!--\s*=\s*(.*?)\s*-->"
)
MEASURED = re.compile(
  r"<!--\s*measured:\s*(\S+)\s+(\d{4}-\d{2}-\d{2}),\s*([^;]+?)\s*(?:;\s*source:\s*(.+?))?\s*-->",
  re.S,
)
PAPER = re.compile(r"<!--\s*paper:\s*(.+?)\s*-->", re.S)
# Figures that are no measurement (a setting, a target, a lease) in prose the detector reads as one.
NOT_MEASURED = re.compile(r"<!--\s*not measured:\s*(\S.*?)\s*-->", re.S)
_COMMENT = re.compile(r"<!--.*?-->", re.S)

_NUM = r"(?<![\w.,/=:-])[-+−~]?\d[\d,]*(?:\.\d+)?½?"
_WORD_NUM = r"(?:an?|one|two|three|four|five|six|seven|eight|nine|ten|half an|a few|few|several)"
MEASUREMENT = re.compile(
  "|".join(
    [
      # a time
      rf"{_NUM}[ \t]?(?:ms|µs|us|ns|s|sec|seconds?|min|minutes?|h|hours?|days?)\b",
      rf"\b{_WORD_NUM}\s+(?:hours?|minutes?)\b",
      r"\b(?:in|to|within|under|takes?|took)\s+(?:seconds|minutes|hours)\b",
      # a rate
      rf"{_NUM}[ \t]?(?:images/s|img/s|steps/s|examples/s|records/s|[GT]FLOP/s)",
      rf"{_NUM}[ \t]+(?:images|steps|examples) (?:per|a) second\b",
      # a percentage, points of accuracy, a ratio, an error
      rf"{_NUM}[ \t]?%",
      rf"{_NUM}[ \t]+(?:points|pp)\b",
      rf"{_NUM}[ \t]?[×x](?![ \t]?\d)(?!\w)",
      r"(?<![\w.])\d(?:\.\d+)?e-\d+\b",
      # a count of results
      rf"{_NUM}[ \t]+(?:passed|failed|errors?|skipped)\b",
      rf"{_NUM}[ \t]+(?:of|out of)[ \t]+\d[\d,]*[ \t]+(?:\w+[ \t]+)?(?:images|examples|records|runs|pairs)\b",
    ]
  )
)
_BLANK_LINE = re.compile(r"\n[ \t]*\n")
_SEPARATOR = re.compile(r"^\|?[ \t]*:?-{3,}:?[ \t]*(?:\|[ \t]*:?-{3,}:?[ \t]*)*\|?$")


@dataclasses.dataclass(frozen=True)
class Table:
  line: int  # of its header row, 1-based
  rows: list[str]  # stripped of their indentation
  context: str  # the lines just above it, to a blank line (a fence skipped): its mark
  fenced: bool


@dataclasses.dataclass(frozen=True)
class Figure:
  line: int
  text: str
  start: int  # offset in the page
  end: int


def _line(text: str, offset: int) -> int:
  return text.count("\n", 0, offset) + 1


def fences(text: str):
  """(start, end, language, body) of every fenced block, indented ones (in list items) too."""
  for m in doc_commands.BLOCK.finditer(text):
    yield m.start(), m.end(), m.group(2), m.group(3)


def tables(text: str) -> list[Table]:
  """Every markdown table of `text`: at the top level, in a list item, in a fence."""
  lines = text.splitlines()
  fenced_lines = set()
  for start, end, _, _ in fences(text):
    fenced_lines.update(range(_line(text, start) - 1, _line(text, end)))
  found, i = [], 0
  while i < len(lines):
    row = lines[i].strip()
    if row.startswith("|") and i + 1 < len(lines) and _SEPARATOR.match(lines[i + 1].strip()):
      j = i
      while j < len(lines) and lines[j].strip().startswith("|"):
        j += 1
      before, k = [], i - 1  # the lines just above it, up to a blank line (a fence skipped)
      while k >= 0 and lines[k].strip() and len(before) < 3:
        if not lines[k].strip().startswith("```"):
          before.insert(0, lines[k].strip())
        k -= 1
      context = "\n".join(before)
      found.append(Table(i + 1, [line.strip() for line in lines[i:j]], context, i in fenced_lines))
      i = j
      continue
    i += 1
  return found


def _mask(text: str, spans) -> str:
  """`text` with the characters of `spans` replaced by spaces (newlines kept): offsets hold."""
  chars = list(text)
  for start, end in spans:
    for k in range(start, end):
      if chars[k] != "\n":
        chars[k] = " "
  return "".join(chars)


def prose(text: str) -> str:
  """`text` with everything but its prose blanked (see the module docstring), offsets kept."""
  spans = []
  for start, end, language, body in fences(text):
    body_start = text.index("\n", start) + 1
    spans.append((start, body_start))
    if language in ("bash", "sh"):
      offset = body_start
      for line in body.splitlines(keepends=True):
        code = len(doc_commands.drop_comment(line.rstrip("\n")))
        spans.append((offset, offset + code))  # the command; its comment stays
        offset += len(line)
    elif language:
      spans.append((body_start, end))  # Python, JSON, ...: code
    spans.append((body_start + len(body), end))
  spans += [m.span() for m in _COMMENT.finditer(text)]
  spans += [m.span() for m in re.finditer(r"`[^`\n]+`", text)]
  spans += [m.span(1) for m in re.finditer(r"\]\(([^)\s]+)\)", text)]
  spans += [m.span() for m in re.finditer(r"^[ \t]*\|.*$", text, re.M)]  # tables: checked apart
  return _mask(text, spans)


def figures(text: str) -> list[Figure]:
  """The measured figures of `text`'s prose."""
  blank = prose(text)
  return [
    Figure(_line(text, m.start()), m.group(0).strip(), m.start(), m.end())
    for m in MEASUREMENT.finditer(blank)
  ]


def has_expression(text: str, figure: Figure) -> bool:
  """Whether `<!-- = EXPR -->` follows the figure's number or the figure."""
  number = re.match(r"[-+−~]?[\d,]*\d(?:\.\d+)?½?", figure.text)
  ends = [figure.end] + ([figure.start + number.end()] if number else [])
  return any(re.match(r"[ \t]*<!--\s*=", text[end:]) for end in ends)


def mark_scope(text: str, mark_end: int) -> int:
  """Where a mark ending at `mark_end` stops covering: the end of the block it sits in, or of
  the next block with content after it (a fenced block whole)."""
  i = mark_end
  rest_of_line = text[i : text.find("\n", i) if "\n" in text[i:] else len(text)]
  if not _COMMENT.sub("", rest_of_line).strip():  # the mark ends its line: the next block
    while i < len(text):
      newline = text.find("\n", i)
      line = text[i : newline if newline >= 0 else len(text)]
      if line.strip() and _COMMENT.sub("", line).strip():
        break
      if newline < 0:
        return len(text)
      if line.strip().startswith("<!--") and "-->" not in line:  # a comment of several lines
        i = text.index("-->", i) + 3
        continue
      i = newline + 1
  for start, end, _, _ in fences(text):
    if start <= i < end or (i <= start and not text[i:start].strip()):
      return end
  blank = _BLANK_LINE.search(text, i)
  return blank.start() if blank else len(text)


def covered_spans(text: str) -> list[tuple[int, int, re.Match]]:
  """(start, end, mark) of what each `measured:`, `paper:` or `not measured:` mark covers."""
  marks = [m for pattern in (MEASURED, PAPER, NOT_MEASURED) for m in pattern.finditer(text)]
  return [(m.start(), mark_scope(text, m.end()), m) for m in marks]


def sources(mark: re.Match) -> list[str]:
  """The files a `measured:` mark names (none for a `paper:` mark)."""
  if mark.re is not MEASURED or not mark.group(4):
    return []
  return mark.group(4).split()


def numbers(text: str) -> list[str]:
  """The numbers of `text` as shown ('1,000', '0.98', '-4.7'), units and signs aside."""
  return re.findall(r"(?<![\w.])\d[\d,]*(?:\.\d+)?(?:e-\d+)?", text)


def shown_matches(shown: str, value: float) -> bool:
  """`shown` (as printed: '92.5', '+8.2', '1,000', '1.3e-4') is `value` rounded to its digits."""
  number = float(shown.replace(",", "").replace("−", "-"))
  if "e" in shown:
    mantissa = shown.split("e")[0]
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    return abs(number - value) <= 0.5 * 10.0 ** (-decimals + int(shown.split("e")[1])) + 1e-15
  decimals = len(shown.split(".")[1]) if "." in shown else 0
  return abs(number - value) <= 0.5 * 10.0**-decimals + 1e-9


def figures_missing_from(table_rows: list[str], files_text: str) -> list[str]:
  """The figures of a table's body (its first column, the row's name, aside) that no number of
  `files_text` gives, rounded as the table shows them."""
  values = [float(n.replace(",", "")) for n in numbers(files_text)]
  missing = []
  for row in table_rows[2:]:
    cells = [c.strip() for c in row.strip().strip("|").split("|")]
    for shown in (n for cell in cells[1:] for n in numbers(cell)):
      if not any(shown_matches(shown, v) for v in values):
        missing.append(shown)
  return missing


def committed(path: str) -> bool:
  """Whether git tracks `path` (a source must be in the repository, not only on a disk)."""
  done = subprocess.run(
    ["git", "ls-files", "--error-unmatch", path], cwd=REPO, capture_output=True, text=True
  )
  return done.returncode == 0


def commit_exists(commit: str) -> bool:
  done = subprocess.run(
    ["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=REPO, capture_output=True, text=True
  )
  return done.returncode == 0
