"""Each package's `__init__.py` docstring is the index of its folder (STYLE.md: a package says
what each of its modules is for).

The packages: vit_jax/, every vit_jax/<name>/ with an `__init__.py`, experiments/, every
experiments/<name>/ with one, and tests/helpers/. A module is a `.py` file of the folder (`__init__.py` aside, `__main__.py`
included) or a subfolder with an `__init__.py`. The docstring names a module by its bare name
(`npz`, `__main__`), its file name (`npz.py`) or its dotted name in the package
(`vit_jax.checkpoint.weights.npz`), not as part of a path (`configs/pretrain.py` names no module of the
folder it is written in). It names no module that is not there: a
`name.py` of its own (not part of a path), the first word of an index line (at the margin or
two spaces in, the name, two or more spaces, its description) and a dotted `vit_jax.<package>.<name>` of its own
package are all modules of the folder.
"""

import ast
import pathlib
import re

import pytest

from tests.helpers import REPO

_NOT_PART_OF_A_NAME = r"(?<![\w/.-])"
# An index line: at the margin or two spaces in, the module's name, two or more spaces, what it
# is for (deeper lines are code or an interface's members).
_INDEX_LINE = re.compile(r"^(?:  )?(\w+)[ \t]{2,}\S", re.M)
_FILE_NAME = re.compile(_NOT_PART_OF_A_NAME + r"(\w+)\.py\b")


def _packages() -> list[pathlib.Path]:
  folders = [REPO / "vit_jax"]
  folders += sorted(p.parent for p in (REPO / "vit_jax").glob("*/**/__init__.py"))
  folders += [REPO / "experiments"]
  folders += sorted(p.parent for p in (REPO / "experiments").glob("*/**/__init__.py"))
  return folders + [REPO / "tests" / "helpers"]


def modules(folder: pathlib.Path) -> set[str]:
  """The modules of `folder`: its .py files but `__init__.py`, and its subpackages."""
  names = {p.stem for p in folder.glob("*.py") if p.name != "__init__.py"}
  if folder == REPO / "vit_jax":  # setup.py's package_dir installs configs/ as vit_jax.configs
    names.add("configs")
  return names | {p.parent.name for p in folder.glob("*/__init__.py")}


def index_faults(package: str, docstring: str, present: set[str]) -> list[str]:
  """What the docstring of `package` (dotted) gets wrong about the modules `present`."""
  faults = [
    f"{package}: its docstring does not name its module {name!r}"
    for name in sorted(present)
    if not re.search(_NOT_PART_OF_A_NAME + re.escape(name) + r"(?![\w-])", docstring)
    and f"{package}.{name}" not in docstring
  ]
  named = set(_INDEX_LINE.findall(docstring)) | set(_FILE_NAME.findall(docstring))
  named |= set(re.findall(re.escape(package) + r"\.(\w+)", docstring))
  faults += [
    f"{package}: its docstring names {name!r}, which is no module of its folder"
    for name in sorted(named - present)
  ]
  return faults


@pytest.mark.parametrize("folder", _packages(), ids=lambda f: str(f.relative_to(REPO)))
def test_each_package_docstring_indexes_its_modules(folder):
  docstring = ast.get_docstring(ast.parse((folder / "__init__.py").read_text()))
  package = ".".join(folder.relative_to(REPO).parts)
  assert docstring, f"{package}/__init__.py: no docstring (the index of its modules)"
  faults = index_faults(package, docstring, modules(folder))
  assert not faults, "\n".join(faults)


def test_the_check_catches_a_module_left_out_and_one_that_is_gone():
  docstring = (
    "A package.\n\n"
    "  npz      parameter files\n"
    "  loader   any of the above\n\n"
    "`layouts.py` renames; configs/pretrain.py is elsewhere; vit_jax.pkg.adapt fits.\n"
  )
  present = {"npz", "loader", "layouts", "adapt"}
  assert index_faults("vit_jax.pkg", docstring, present) == []
  faults = index_faults("vit_jax.pkg", docstring, present | {"timm_hf"})
  assert faults == ["vit_jax.pkg: its docstring does not name its module 'timm_hf'"]
  faults = index_faults("vit_jax.pkg", docstring, present - {"loader", "layouts", "adapt"})
  assert [f.split("names ")[1].split(",")[0] for f in faults] == [
    "'adapt'",
    "'layouts'",
    "'loader'",
  ]


def test_the_tests_map_names_every_test_file_once_and_every_part_of_the_package():
  table = (REPO / "tests" / "README.md").read_text().split("| part |", 1)[1]
  listed = re.findall(r"\btest_\w+", table)
  files = sorted(p.stem for p in (REPO / "tests").glob("test_*.py"))
  assert sorted(listed) == files, "tests/README.md: " + str(set(files) ^ set(listed))
  parts = modules(REPO / "vit_jax") - {"__main__", "configs"}
  assert not [p for p in sorted(parts) if f"`vit_jax/{p}`" not in table], "tests/README.md"
