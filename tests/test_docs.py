"""The docs run: every command of README.md and docs/**/*.md (tests/helpers/doc_commands.py).

The default tier checks every page's annotations and runs the commands marked `run` and `ci`;
the slow tier (`pytest -m slow tests/test_docs.py`) runs those marked `slow` too, in the pages'
order, so that a command that reads a path finds it written by an earlier one. Each prints how
many commands ran as written, ran in CI form and were left out, and why.
"""

import pathlib
import re
import shutil

import pytest

from tests.helpers import doc_commands

# One command may take a few minutes in the slow tier (an experiment's --quick profile).
_TIMEOUT_S = {"default": 240, "slow": 1200}


def test_every_block_is_annotated():
  commands = doc_commands.all_commands()  # raises AnnotationError naming the first culprit
  assert {c.page for c in commands} >= {"README.md", "docs/training.md"}
  for c in commands:
    if c.mode == "skip" or c.kind != "shell":
      continue
    # A template is not a command: placeholders, variables a reader sets, a cloud bucket.
    assert not re.search(r"<[a-z][^>]*>|\$[A-Z]|gs://|\.\.\.", c.text), (
      f"{c.where}: {c.text!r} is a template or needs the cloud; mark it skip with the reason"
    )


def test_annotations_are_checked(tmp_path, monkeypatch):
  """The parser refuses a block without an annotation and a count that does not match."""
  page = tmp_path / "page.md"
  monkeypatch.setattr(doc_commands, "REPO", tmp_path)
  page.write_text("```bash\necho a\n```\n")
  with pytest.raises(doc_commands.AnnotationError, match="without a docs-test annotation"):
    doc_commands.page_commands("page.md")
  page.write_text("<!-- docs-test\nrun\nskip: x\n-->\n```bash\necho a\n```\n")
  with pytest.raises(doc_commands.AnnotationError, match="2 docs-test lines for 1 commands"):
    doc_commands.page_commands("page.md")
  page.write_text("<!-- docs-test: skip -->\n```bash\necho a\n```\n")
  with pytest.raises(doc_commands.AnnotationError, match="skip without a reason"):
    doc_commands.page_commands("page.md")
  page.write_text(
    "<!-- docs-test: run -->\n```python\nx = 1\n```\n<!-- docs-test\nci --n=2\nskip: why\n-->\n"
    "```sh\npython -m a /tmp/b \\\n  --c  # d\n# e\ncurl x\n```\n"
  )
  got = doc_commands.page_commands("page.md")
  assert [(c.kind, c.mode, c.text, c.extra) for c in got] == [
    ("python", "run", "x = 1\n", ""),
    ("shell", "ci", "python -m a /tmp/b --c", "--n=2"),
    ("shell", "skip", "curl x", "why"),
  ]
  assert got[1].script(pathlib.Path("/s")) == "python -m a /s/tmp/b --c --n=2"


def _results_files() -> dict[str, tuple[int, int]]:
  """(mtime, size) of every file under experiments/results/, the folder experiments write to by
  default: a docs command must write into its sandbox, never over the committed results."""
  root = doc_commands.REPO / "experiments" / "results"
  return {str(p): (p.stat().st_mtime_ns, p.stat().st_size) for p in root.rglob("*") if p.is_file()}


def _run_pages(tmp_path, tier: str, record_property) -> None:
  results = _results_files()
  commands = doc_commands.all_commands()
  modes = {"default": ("run", "ci"), "slow": ("run", "ci", "slow")}[tier]
  readme = tmp_path / "README"
  (readme / "tmp").mkdir(parents=True)
  ran = []
  for page in doc_commands.PAGES:
    sandbox = readme
    if page != "README.md":  # a copy of what the README's commands wrote
      sandbox = tmp_path / page.replace("/", "_")
      shutil.copytree(readme, sandbox, symlinks=True)
    for command in (c for c in commands if c.page == page and c.mode in modes):
      ran.append(doc_commands.run(command, sandbox, _TIMEOUT_S[tier]))
  text = doc_commands.summary(commands, ran, tier)
  record_property("docs_summary", text)
  print(text)
  changed = sorted(set(results.items()) ^ set(_results_files().items()))
  assert not changed, f"docs commands wrote into experiments/results/: {changed}"


@pytest.mark.long
def test_docs_commands_quick(tmp_path, record_property):
  _run_pages(tmp_path, "default", record_property)


@pytest.mark.slow
def test_docs_commands_all(tmp_path, record_property):
  _run_pages(tmp_path, "slow", record_property)


def test_skip_reasons_that_name_a_test_are_true():
  """A skip that says a test runs the command names a test file that does (its text, its
  module or its script appears in the test; a Python block's test reads its page)."""
  named = 0
  for c in doc_commands.all_commands():
    for test in doc_commands.named_tests(c.extra) if c.mode == "skip" else []:
      path = doc_commands.REPO / test
      assert path.exists(), f"{c.where}: the skip reason names {test}, which does not exist"
      assert doc_commands.runs_command(path.read_text(), c), (
        f"{c.where}: the skip reason names {test}, which does not run {c.text[:80]!r}"
      )
      named += 1
  assert named >= 3


def test_a_false_skip_reason_and_an_indented_block_are_caught(tmp_path, monkeypatch):
  monkeypatch.setattr(doc_commands, "REPO", tmp_path)
  (tmp_path / "page.md").write_text("Run:\n\n    python -m vit_jax.main --config=x\n")
  with pytest.raises(doc_commands.AnnotationError, match="page.md:3: an indented code block"):
    doc_commands.page_commands("page.md")
  (tmp_path / "page.md").write_text(
    "- item:\n\n  <!-- docs-test: skip: tests/test_x.py runs it -->\n  ```bash\n"
    "  python -m experiments.benchmarks.bench_export --n=1\n  ```\n"
  )
  (command,) = doc_commands.page_commands("page.md")
  assert (
    command.text == "python -m experiments.benchmarks.bench_export --n=1"
  )  # fenced in a list item
  assert doc_commands.runs_command("from experiments.benchmarks import bench_export\n", command)
  assert not doc_commands.runs_command(
    "from experiments.benchmarks import benchmark_model\n", command
  )
