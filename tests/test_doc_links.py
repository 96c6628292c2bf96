"""Every relative link and image in README.md and docs/**/*.md points at a file that exists."""

import glob
import os
import re

from tests.helpers import REPO

# [text](target) and ![alt](target), the target up to a space or ')'; `[name]: target` lines.
_INLINE = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^\s*\[[^\]]+\]:\s*(\S+)", re.M)


def relative_links(text: str) -> list[str]:
  """The link targets of a markdown text that are paths in the repository (no URL, no anchor
  within the page), without their '#fragment'; code spans and fenced blocks are skipped."""
  text = re.sub(r"```.*?```", "", text, flags=re.S)
  text = re.sub(r"`[^`\n]*`", "", text)
  targets = _INLINE.findall(text) + _REFERENCE.findall(text)
  paths = [t.split("#", 1)[0] for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t)]
  return [p for p in paths if p]


def test_the_link_finder():
  text = (
    "See [a](docs/a.md#x), ![img](../r/p.png), [web](https://x.org), [top](#here),\n"
    "`[not](code.md)` and\n```\n[neither](block.md)\n```\n[ref]: ../b.md\n"
  )
  assert relative_links(text) == ["docs/a.md", "../r/p.png", "../b.md"]


def test_relative_links_in_the_docs_resolve():
  pages = [os.path.join(REPO, "README.md")]
  pages += glob.glob(os.path.join(REPO, "docs", "**", "*.md"), recursive=True)
  broken = []
  for page in sorted(pages):
    with open(page) as f:
      for target in relative_links(f.read()):
        if not os.path.exists(os.path.join(os.path.dirname(page), target)):
          broken.append(f"{os.path.relpath(page, REPO)}: {target}")
  assert len(pages) > 5
  assert not broken, "\n".join(broken)
