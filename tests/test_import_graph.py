"""The package's modules import one another without a cycle (data flows one way): the import
graph of vit_jax/, read from the source with `ast` (no module is imported), has none."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _modules() -> dict[str, pathlib.Path]:
  """Dotted name → file, for every module of vit_jax (a package by its __init__.py)."""
  found = {}
  for path in (ROOT / "vit_jax").rglob("*.py"):
    parts = path.relative_to(ROOT).with_suffix("").parts
    found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
  return found


def import_graph() -> dict[str, set[str]]:
  """Module → the package's modules it imports, anywhere in its file (in functions too: a lazy
  import is still a dependency). `from a.b import c` names the module a.b.c if there is one,
  else a.b; importing a submodule runs its package's __init__ first, which is not counted (a
  package naming its own modules is no cycle unless a module imports the package back)."""
  modules = _modules()
  graph = {}
  for name, path in modules.items():
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    edges = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
      if isinstance(node, ast.Import):
        edges.update(a.name for a in node.names if a.name in modules)
      elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
          anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
          base = ".".join(anchor + ([node.module] if node.module else []))
        for alias in node.names:
          target = f"{base}.{alias.name}"
          if target in modules:
            edges.add(target)
          elif base in modules:
            edges.add(base)
    graph[name] = edges - {name}
  return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components of more than one module (Tarjan's algorithm)."""
  index, low, stack, on_stack, found = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in sorted(graph[v]):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        found.append(sorted(component))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return found


def test_the_package_has_no_import_cycle():
  graph = import_graph()
  assert len(graph) > 100 and "vit_jax.input_pipeline.sources.registry" in graph
  # The graph is read as intended: the registry names its sources' modules, and an import
  # inside a function counts (the package's __init__ imports the pipeline on first use).
  registry = graph["vit_jax.input_pipeline.sources.registry"]
  assert "vit_jax.input_pipeline.sources.shards" in registry
  assert "vit_jax.input_pipeline.pipeline" in graph["vit_jax.input_pipeline"]
  assert cycles(graph) == []


def test_a_cycle_is_found():
  graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
  assert cycles(graph) == [["a", "b", "c"]]
  assert cycles({"a": {"b"}, "b": set()}) == []
