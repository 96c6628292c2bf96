"""A JSON file of a known shape: read it, or say in one line why it is not one; set one aside.

Every file a run reads from its workdir when it (re)starts is read through `read`, with the
shape its writer gives it: a file that does not decode (bytes that are not UTF-8, a write cut
short, another program's file) or whose JSON has another shape (`{"attempts": "x"}`, null, a
list) raises `InvalidFile`, a ValueError whose one line names the file and what is wrong with
it. What happens next is the decision of the file's owner, written in its docstring: use what
is there, `set_aside` the file (renamed beside itself, never deleted) where that loses nothing
the run needs, or refuse to start in one line naming the file and the way out.

A shape is written as the JSON it describes:

  a type, or a tuple of types   `isinstance` (None stands for null; True and False are no
                                numbers; an integer must fit in 64 bits)
  {key: shape}                  an object that has these keys ('key?': optional; '*': every
                                value); other keys are allowed (a newer writer's)
  [shape]                       an array whose items all have that shape
  a function                    value -> None, or what is wrong with it ('is not a process id')

This file must not import TensorFlow.
"""

import json
import time
from collections.abc import Callable
from typing import Any

from absl import logging
from etils import epath

NUMBER = (int, float)
_INT_LIMIT = 2**63  # what a reader may convert to a float or a C integer without overflow

_KINDS = {
  type(None): "null",
  bool: "true or false",
  int: "an integer",
  float: "a number",
  str: "a string",
  list: "an array",
  dict: "an object",
}


class InvalidFile(ValueError):
  """A file that is not of its expected shape; its message is one line naming it and why."""

  def __init__(self, path: Any, why: str):
    super().__init__(f"{path}: {why}")
    self.path, self.why = path, why


def _kind(value: Any) -> str:
  return _KINDS.get(type(value), type(value).__name__)


def _expected(types: tuple[type, ...]) -> str:
  if float in types and int in types:
    types = tuple(t for t in types if t is not int)
  return " or ".join(_KINDS.get(t, t.__name__) for t in types)


def problem(value: Any, shape: Any, where: str = "") -> str | None:
  """What is wrong with `value` as JSON of `shape` (see the module docstring), or None.

  `where` names `value` in the message ('attempts[2].end'); '' is the file's top level.
  """
  name = where or "its top level"
  if isinstance(shape, type | tuple):
    types = shape if isinstance(shape, tuple) else (shape,)
    types = tuple(type(None) if t is None else t for t in types)
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
      return f"{name} is {_kind(value)}, not {_expected(types)}"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= _INT_LIMIT:
      return f"{name} is an integer out of range"
    return None
  if isinstance(shape, dict):
    if not isinstance(value, dict):
      return f"{name} is {_kind(value)}, not an object"
    for key, sub in shape.items():
      bare = key.removesuffix("?")
      if key == "*":
        items = list(value.items())
      elif bare in value:
        items = [(bare, value[bare])]
      elif key.endswith("?"):
        continue
      else:
        return f"{where + '.' if where else ''}{key} is missing"
      for k, v in items:
        why = problem(v, sub, f"{where}.{k}" if where else str(k))
        if why:
          return why
    return None
  if isinstance(shape, list):
    if not isinstance(value, list):
      return f"{name} is {_kind(value)}, not an array"
    for i, item in enumerate(value):
      why = problem(item, shape[0], f"{where}[{i}]")
      if why:
        return why
    return None
  if callable(shape):
    why = shape(value)
    return f"{name} {why}" if why else None
  raise TypeError(f"not a shape: {shape!r}")


def decode(data: bytes | str, shape: Any, path: Any) -> Any:
  """The JSON value of `data` (the contents of `path`) if it has `shape`.

  Raises:
    InvalidFile: it is not JSON, or not of that shape.
  """
  try:
    value = json.loads(data)
  except (ValueError, RecursionError) as e:  # UnicodeDecodeError and JSONDecodeError included
    reason = str(e).splitlines()[0] if str(e).strip() else type(e).__name__
    raise InvalidFile(path, f"not JSON ({reason})") from None
  why = problem(value, shape)
  if why:
    raise InvalidFile(path, why)
  return value


def read(path: str | epath.PathLike, shape: Any) -> Any:
  """The JSON value of the file at `path` if it has `shape`; None if there is no file.

  Raises:
    InvalidFile: the file is not JSON, or not of that shape.
    OSError: it could not be read (left to the caller: a storage error is no evidence about
      the file).
  """
  path = epath.Path(path)
  if not path.exists():
    return None
  return decode(path.read_bytes(), shape, path)


def set_aside(path: str | epath.PathLike, why: str, then: str = "") -> epath.Path:
  """Renames the file at `path` to `<name>.bad-<time>` beside it, with a warning naming both,
  `why` and what happens `then`; returns the new path.

  Raises:
    OSError: it could not be renamed (the file is then where it was).
  """
  path = epath.Path(path)
  stamp = time.strftime("%Y%m%d-%H%M%S")
  aside = path.parent / f"{path.name}.bad-{stamp}"
  n = 1
  while aside.exists():  # two in one second: keep both
    n += 1
    aside = path.parent / f"{path.name}.bad-{stamp}-{n}"
  path.rename(aside)
  logging.warning("%s: %s; set aside as %s%s", path, why, aside.name, f"; {then}" if then else "")
  return aside


def checked(test: Callable[[Any], bool], what: str) -> Callable[[Any], str | None]:
  """A shape function: `value` passes `test`, else 'is not <what>' (for ids, tokens, ...)."""

  def check(value: Any) -> str | None:
    try:
      ok = bool(test(value))
    except (TypeError, ValueError, ArithmeticError):
      ok = False
    return None if ok else f"is not {what}"

  return check
