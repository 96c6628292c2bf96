"""The commands of README.md and docs/**/*.md, as tests/test_docs.py runs them.

Every ```bash, ```sh and ```python block of a page (at the top level or indented in a list item;
an indented code block, which has no language, is refused) is preceded by an annotation, an HTML comment
that a reader sees in the page's source and not in the rendered page:

    <!-- docs-test: run -->                            run as written (default tier)
    <!-- docs-test: ci --config.total_steps=4 ... -->  as written plus exactly these arguments,
                                                       appended to the command (default tier)
    <!-- docs-test: slow -->                           as written, in the slow tier only
    <!-- docs-test: slow --quick -->                   as written plus these, slow tier only
    <!-- docs-test: skip: <why it cannot run here> --> never run; the reason is reported

One line applies to every command of the block; a comment of several lines,

    <!-- docs-test
    ci --config.total_steps=4
    skip: a published checkpoint on gs://vit_models (a download)
    -->

gives one line per command, in order (or, on one line, the same separated by ` | `). A command is a line of a shell block (continuation lines
joined, comments dropped); a Python block is one command.

How a command runs: the README's commands first, in their order, in a sandbox folder; then each
other page's, in its order, in a sandbox of its own that starts as a copy of the README's (the
pages build on the README's flow: its pretraining workdir, its images). So a path a command
reads was written by an earlier command of its page or of the README. `/tmp/` in a command is
its sandbox's own `tmp/`, and `python` and `.venv/bin/python` are the test's
interpreter (the package is installed in it; one CPU device, the suite's compiler flags; `configs/` resolves from any folder, and the
repository is on PYTHONPATH for `-m experiments.*` and `-m tests.*`). Nothing else is rewritten.
"""

import dataclasses
import os
import pathlib
import re
import subprocess
import sys
import textwrap
import time

from tests.helpers import xla_env

REPO = pathlib.Path(__file__).resolve().parents[2]
# The README first: the other pages read what its flow writes.
PAGES = ["README.md"] + sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").rglob("*.md"))
MODES = ("run", "ci", "slow", "skip")
# A fenced block, at the top level or indented in a list item (its closing fence as indented).
BLOCK = re.compile(r"^([ \t]*)```(\w*)[^\n]*\n(.*?)^\1```[ \t]*$", re.M | re.S)
_LIST_ITEM = re.compile(r"^([ \t]*)(?:[-*+]|\d+[.)])[ \t]+")
_NOTE = re.compile(r"<!--\s*docs-test\b(.*)-->", re.S)
_LANGS = {"bash": "shell", "sh": "shell", "python": "python"}


@dataclasses.dataclass(frozen=True)
class Command:
  page: str
  line: int  # of the block's opening fence
  kind: str  # 'shell' | 'python'
  text: str  # as written (a shell command on one line, or a Python block)
  mode: str  # one of MODES
  extra: str  # ci / slow: the arguments appended; skip: the reason

  @property
  def where(self) -> str:
    return f"{self.page}:{self.line}"

  @property
  def tier(self) -> str:
    return {"run": "default", "ci": "default", "slow": "slow", "skip": "never"}[self.mode]

  def script(self, sandbox: pathlib.Path) -> str:
    """What runs: the command, the annotation's arguments appended, /tmp/ in the sandbox."""
    text = self.text
    if self.kind == "shell":
      text = re.sub(r"(^|(?<=[\s;&|(]))\.venv/bin/python\b", "python", text)
      if self.extra:
        text = f"{text} {self.extra}"
    return text.replace("/tmp/", f"{sandbox}/tmp/")


class AnnotationError(ValueError):
  pass


def shell_commands(body: str) -> list[str]:
  """The commands of a shell block: continuation lines joined, comments and blank lines dropped."""
  joined = re.sub(r"[ \t]*\\\n\s*", " ", body)
  return [c for c in (drop_comment(line).strip() for line in joined.splitlines()) if c]


def drop_comment(line: str) -> str:
  """`line` without its comment: from a `#` that starts a word outside quotes."""
  quote = None
  for i, char in enumerate(line):
    if quote:
      quote = None if char == quote else quote
    elif char in "'\"":
      quote = char
    elif char == "#" and (i == 0 or line[i - 1].isspace()):
      return line[:i]
  return line


def _parse_note(note: str, where: str) -> list[tuple[str, str]]:
  body = note.strip()
  if body.startswith(":"):
    body = body[1:]
  lines = [part.strip() for line in body.strip().splitlines() for part in line.split(" | ")]
  lines = [line for line in lines if line]
  if not lines:
    raise AnnotationError(f"{where}: empty docs-test annotation")
  parsed = []
  for line in lines:
    mode, _, extra = line.partition(" ")
    mode = mode.rstrip(":")
    extra = extra.strip()
    if mode not in MODES:
      raise AnnotationError(f"{where}: docs-test mode {mode!r}; expected one of {MODES}")
    if mode == "skip":
      extra = extra.lstrip(":").strip()
      if not extra:
        raise AnnotationError(f"{where}: docs-test skip without a reason")
    elif mode == "ci" and not extra:
      raise AnnotationError(f"{where}: docs-test ci without the arguments it appends")
    elif extra and not extra.startswith("-"):
      raise AnnotationError(f"{where}: docs-test {mode} appends arguments (--x=y), got {extra!r}")
    parsed.append((mode, extra))
  return parsed


def page_commands(page: str) -> list[Command]:
  """Every command of `page` with its annotation; AnnotationError for a block without one (or
  with one line per command that does not match the block's commands), and for an indented
  code block (no language, so no annotation: fence it)."""
  text = (REPO / page).read_text()
  indented = indented_code_blocks(text)
  if indented:
    raise AnnotationError(
      f"{page}:{indented[0]}: an indented code block, which no test sees; fence it (```bash "
      "with a docs-test annotation for commands, ``` for a listing)"
    )
  commands = []
  for match in BLOCK.finditer(text):
    kind = _LANGS.get(match.group(2))
    if kind is None:
      continue  # output listings, tables, trees
    line = text.count("\n", 0, match.start()) + 1
    where = f"{page}:{line}"
    before = text[: match.start()].rstrip()
    note = _NOTE.fullmatch(before[before.rfind("<!--") :]) if before.endswith("-->") else None
    if note is None:
      raise AnnotationError(f"{where}: a ```{match.group(2)} block without a docs-test annotation")
    body = textwrap.dedent(match.group(3))
    texts = shell_commands(body) if kind == "shell" else [body]
    notes = _parse_note(note.group(1), where)
    if len(notes) == 1:
      notes = notes * len(texts)
    if len(notes) != len(texts):
      raise AnnotationError(
        f"{where}: {len(notes)} docs-test lines for {len(texts)} commands: {texts}"
      )
    for body_text, (mode, extra) in zip(texts, notes, strict=True):
      commands.append(Command(page, line, kind, body_text, mode, extra))
  return commands


def indented_code_blocks(text: str) -> list[int]:
  """The first lines of the blocks that markdown renders as code for their indentation (four
  spaces beyond the list item they are in, after a blank line): no test sees their commands."""
  masked = BLOCK.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)
  found, content_column, after_blank = [], 0, True
  for number, line in enumerate(masked.split("\n"), 1):
    if not line.strip():
      after_blank = True
      continue
    indent = len(line) - len(line.lstrip(" "))
    item = _LIST_ITEM.match(line)
    if after_blank and indent >= content_column + 4 and not line.lstrip().startswith("<!--"):
      found.append(number)
    elif item:
      content_column = len(item.group(0))
    elif after_blank and indent < content_column:
      content_column = 0  # the list has ended
    after_blank = False
  return found


def all_commands() -> list[Command]:
  return [c for page in PAGES for c in page_commands(page)]


@dataclasses.dataclass
class Outcome:
  command: Command
  seconds: float
  output: str


class CommandFailed(AssertionError):
  pass


def run(command: Command, sandbox: pathlib.Path, timeout_s: float) -> Outcome:
  """Runs `command` in `sandbox` (see the module docstring); CommandFailed with its output's
  tail when it exits non-zero or outlives `timeout_s`."""
  (sandbox / "tmp").mkdir(parents=True, exist_ok=True)
  # One device, as a reader's CPU has (the suite's processes simulate eight), compiled as the
  # suite compiles (tests/helpers/xla_env.py).
  env = xla_env.child_env(1)
  env["PATH"] = f"{os.path.dirname(sys.executable)}{os.pathsep}{env.get('PATH', '')}"
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
  script = command.script(sandbox)
  if command.kind == "python":
    argv = [sys.executable, "-c", script]
  else:
    argv = ["bash", "-o", "pipefail", "-ec", script]
  start = time.perf_counter()
  try:
    done = subprocess.run(
      argv, cwd=sandbox, env=env, capture_output=True, text=True, timeout=timeout_s
    )
  except subprocess.TimeoutExpired as e:
    out = (e.stdout or "") + (e.stderr or "") if isinstance(e.stdout, str) else ""
    raise CommandFailed(
      f"{command.where}: still running after {timeout_s:.0f} s: {script}\n{out[-3000:]}"
    ) from None
  seconds = time.perf_counter() - start
  output = done.stdout + done.stderr
  if done.returncode != 0:
    raise CommandFailed(
      f"{command.where}: exit {done.returncode} after {seconds:.0f} s: {script}\n{output[-4000:]}"
    )
  return Outcome(command, seconds, output)


def summary(commands: list[Command], ran: list[Outcome], tier: str) -> str:
  """How many commands ran as written, ran in CI form, and were left out, with why."""
  as_written = sum(o.command.mode in ("run", "slow") and not o.command.extra for o in ran)
  ci_form = len(ran) - as_written
  left = [c for c in commands if c not in {o.command for o in ran}]
  lines = [
    f"docs commands ({tier} tier): {len(commands)} in {len(PAGES)} pages; "
    f"{as_written} ran as written, {ci_form} in CI form, {len(left)} not run "
    f"({sum(c.mode == 'skip' for c in left)} cannot run here, "
    f"{sum(c.mode != 'skip' for c in left)} in the slow tier)"
  ]
  reasons: dict[str, int] = {}
  for c in left:
    why = c.extra if c.mode == "skip" else "slow tier"
    reasons[why] = reasons.get(why, 0) + 1
  lines += [f"  {n:3d} x {why}" for why, n in sorted(reasons.items(), key=lambda kv: -kv[1])]
  lines += [f"  {o.seconds:6.1f} s  {o.command.where}  {o.command.text[:90]}" for o in ran]
  return "\n".join(lines)


_TEST_FILE = re.compile(r"\btests/(?:helpers/)?test_\w+\.py\b")


def named_tests(reason: str) -> list[str]:
  """The test files a skip reason names (tests/test_x.py)."""
  return _TEST_FILE.findall(reason)


def runs_command(test_text: str, command: Command) -> bool:
  """Whether a test file's source runs `command`: for a Python block, the test reads its page;
  for a shell command, the command's text, or each module it runs (`-m a.b.c`: `a.b.c`, `a/b/c`
  or `from a.b import c`), or else each script it names, is there."""
  if command.kind == "python":
    return pathlib.PurePath(command.page).name in test_text
  if command.text in test_text:
    return True
  modules = re.findall(r"-m\s+([\w.]+)", command.text)
  if not modules:
    scripts = re.findall(r"[\w./-]*\w\.(?:py|sh)\b", command.text)
    return bool(scripts) and all(s.lstrip("./") in test_text for s in scripts)
  for module in modules:
    package, _, name = module.rpartition(".")
    forms = [module, module.replace(".", "/"), f"from {package} import {name}" if package else None]
    if not any(form and re.search(rf"{re.escape(form)}\b", test_text) for form in forms):
      return False
  return True
