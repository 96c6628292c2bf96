"""The README's Python example runs as written (offline, on the CPU)."""

import pathlib
import re

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def test_readme_python_example_runs():
  blocks = re.findall(r"^```python\n(.*?)^```", README.read_text(), flags=re.M | re.S)
  assert len(blocks) == 1, "the README keeps one Python example"
  namespace = {}
  exec(compile(blocks[0], str(README), "exec"), namespace)  # noqa: S102
  # What the example claims to produce.
  assert namespace["logits"].shape == (2, 10)
  assert namespace["attention"].shape == (1, 2, 257, 257)
  assert set(namespace["params"]) >= {"embedding", "cls", "Transformer", "head"}
