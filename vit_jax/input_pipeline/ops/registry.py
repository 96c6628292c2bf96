"""The one registry of preprocessing ops and the one parser of their strings.

A spec is ops joined by `|`: `'decode|resize(224)|value_range(-1, 1)'`. An op is registered by
name for the kind of data it runs on: `tf` (ops/preprocess.py), `pil` (ops/pil.py, predict's),
`segmentation` (ops/segmentation.py, an image and its mask) or `detection` (ops/detection.py, an
image and its boxes). `build(spec, kind)` parses a spec
and binds each op's arguments to its function; an op the kind does not have, or arguments its
function does not take, raise one line naming the op. The grammar: each op a name with an
optional argument list of literals (ints, floats, quoted strings, True/False/None, parenthesised
tuples of them), positional first, then `key=value`. Parsed by hand, not with `ast`: specs are
parsed while input pipelines run, and `ast.parse` is unsafe beside other parsing threads
(examples.py's `graph_fn` says why). Imports neither TensorFlow nor numpy.
"""

import inspect
import re
from collections.abc import Callable
from typing import Any

Op = tuple[str, tuple[Any, ...], dict[str, Any]]

# kind → op name → function; the function's leading parameters are what the kind passes per call
# (LEADING), the spec's arguments follow.
_OPS: dict[str, dict[str, Callable]] = {"tf": {}, "pil": {}, "segmentation": {}, "detection": {}}
# tf: (image, rng, image_size); pil: (image, image_size); segmentation: (image, mask, rng);
# detection: (image, objects, rng, image_size).
LEADING = {"tf": 3, "pil": 2, "segmentation": 3, "detection": 4}
_LABEL = {"tf": "", "pil": "predict ", "segmentation": "segmentation ", "detection": "detection "}


def register(kind: str, name: str | None = None):
  """Registers the decorated function as op `name` (default its own name) of `kind`."""

  def wrap(fn):
    _OPS[kind][name or fn.__name__] = fn
    return fn

  return wrap


_TOKEN = re.compile(
  r"""\s*(?:
    (?P<number>[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?)
  | (?P<string>'[^']*'|"[^"]*")
  | (?P<name>[A-Za-z_]\w*)
  | (?P<punct>[(),=])
  )""",
  re.VERBOSE,
)
_CONSTANTS = {"True": True, "False": False, "None": None}


def _tokens(text: str) -> list[tuple[str, str]]:
  out, pos = [], 0
  text = text.rstrip()
  while pos < len(text):
    m = _TOKEN.match(text, pos)
    if not m or m.end() == pos:
      raise ValueError(f"unexpected {text[pos:].strip()[:20]!r}")
    kind = m.lastgroup
    out.append((kind, m.group(kind)))
    pos = m.end()
  return out


class _Parser:
  def __init__(self, tokens: list[tuple[str, str]]):
    self.tokens, self.i = tokens, 0

  def peek(self) -> tuple[str, str] | None:
    return self.tokens[self.i] if self.i < len(self.tokens) else None

  def take(self, value: str | None = None) -> tuple[str, str]:
    token = self.peek()
    if token is None or (value is not None and token[1] != value):
      raise ValueError(f"expected {value or 'more'}, got {token[1] if token else 'the end'!r}")
    self.i += 1
    return token

  def literal(self) -> Any:
    kind, text = self.take()
    if kind == "number":
      return float(text) if any(c in text for c in ".eE") else int(text)
    if kind == "string":
      return text[1:-1]
    if kind == "name" and text in _CONSTANTS:
      return _CONSTANTS[text]
    if text == "(":
      items = []
      while self.peek() and self.peek()[1] != ")":
        items.append(self.literal())
        if self.peek() and self.peek()[1] == ",":
          self.take(",")
      self.take(")")
      return tuple(items)
    raise ValueError(f"{text!r} is not a literal")

  def call(self) -> Op:
    kind, name = self.take()
    if kind != "name":
      raise ValueError(f"{name!r} is not an op name")
    args, kwargs = [], {}
    if self.peek():
      self.take("(")
      while self.peek() and self.peek()[1] != ")":
        token, after = self.peek(), self.tokens[self.i + 1 : self.i + 2]
        if token[0] == "name" and after and after[0][1] == "=":
          self.i += 2
          kwargs[token[1]] = self.literal()
        elif kwargs:
          raise ValueError("positional argument after keyword argument")
        else:
          args.append(self.literal())
        if self.peek() and self.peek()[1] == ",":
          self.take(",")
      self.take(")")
    if self.peek():
      raise ValueError(f"unexpected {self.peek()[1]!r} after the argument list")
    return name, tuple(args), kwargs


def parse(spec: str, kind: str | None = None, empty_ok: bool = False) -> list[Op]:
  """`'a|b(1, x=2)'` -> [('a', (), {}), ('b', (1,), {'x': 2})]; with `kind`, its ops only.
  ValueError names the op that cannot be parsed or that `kind` does not have, or an empty spec
  (unless `empty_ok`)."""
  ops = []
  for part in filter(None, (p.strip() for p in spec.split("|"))):
    try:
      ops.append(_Parser(_tokens(part)).call())
    except ValueError as e:
      raise ValueError(f"Cannot parse preprocessing op {part!r} in {spec!r}: {e}") from None
  if not ops and not empty_ok:
    raise ValueError("Empty preprocessing spec.")
  for name, _, _ in ops if kind else ():
    if name not in _OPS[kind]:
      raise ValueError(
        f"Unknown {_LABEL[kind]}preprocessing op {name!r} in {spec!r}; known ops: "
        f"{sorted(_OPS[kind])}"
      )
  return ops


def bind(op: Op, kind: str) -> Callable:
  """The function of op (name, args, kwargs) of `kind`, its arguments bound: it takes what the
  kind passes per call (LEADING). TypeError (one line) for arguments the op does not take."""
  name, args, kwargs = op
  fn = _OPS[kind][name]
  try:
    inspect.signature(fn).bind(*([None] * LEADING[kind]), *args, **kwargs)
  except TypeError as e:
    raise TypeError(f"preprocessing op {name!r}: {e}") from None

  def step(*inputs):
    return fn(*inputs, *args, **kwargs)

  return step


def build(spec: str, kind: str, empty_ok: bool = False) -> list[Callable]:
  """The ops of `spec` (see `parse`) as functions of what `kind` passes per call (`bind`)."""
  return [bind(op, kind) for op in parse(spec, kind, empty_ok)]


def resolve_size(size: int | float | None, image_size: int) -> int:
  """A size argument of an op in pixels: None is the dataset's `image_size`, a float a fraction
  of it (`resize(1.143)` before a crop), an int itself."""
  if size is None:
    return image_size
  if isinstance(size, float):
    return int(round(size * image_size))
  return int(size)
