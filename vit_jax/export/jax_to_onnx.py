"""Translates a JAX function's jaxpr into an ONNX graph, with a symbolic batch dimension.

docs/export.md ("ONNX") says why a translator of our own and how it works. The function is traced
with `jax.export.symbolic_shape("b")` as its batch size; equations whose inputs are all constants
are evaluated at conversion time, so the graph holds only what depends on the input. Shapes that
depend on the batch become `-1` in a Reshape, or are computed from `Shape(input)` where an
`Expand` needs them. NHWC convolutions and pooling run as ONNX's NCHW ops between transposes.

Unsupported primitives raise NotImplementedError naming them. This module imports onnx (not
TensorFlow) and is imported only by the export tool.
"""

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.extend as jex
import jax.numpy as jnp
import numpy as np
import onnx
from jax import export
from onnx import TensorProto, helper, numpy_helper

# ONNX opset 18: Reduce* ops take their axes as an input (ReduceMax since 18).
OPSET = 18
BATCH = "b"

# jax primitive -> ONNX op of the same inputs and no attributes.
_ELEMENTWISE = {
  p: p.capitalize()
  for p in "exp log tanh sqrt neg abs erf sign floor ceil sin cos not add sub mul div max min pow "
  "and or".split()
}
_ELEMENTWISE.update(logistic="Sigmoid", gt="Greater", lt="Less", ge="GreaterOrEqual")
_ELEMENTWISE.update(le="LessOrEqual", eq="Equal")
_REDUCE = {"reduce_sum": "ReduceSum", "reduce_max": "ReduceMax", "reduce_min": "ReduceMin"}
# Primitives that compute nothing at inference.
_IDENTITY = ("stop_gradient", "copy", "copy_p", "optimization_barrier", "pvary")
# Call primitives, inlined (the callee is their `jaxpr` or `call_jaxpr` parameter).
_CALLS = ("jit", "pjit", "closed_call", "custom_jvp_call", "custom_vjp_call")
_INT64_MAX = np.iinfo(np.int64).max


def _is_static(d: Any) -> bool:
  return isinstance(d, (int, np.integer))


def _dim_at(d: Any, batch: int) -> int:
  """A dimension of a traced shape at a concrete batch size (`d` is an int or a polynomial in
  the batch symbol; jax has no public evaluator for the latter)."""
  return int(d) if _is_static(d) else int(d._evaluate({BATCH: batch}))  # noqa: SLF001


@dataclasses.dataclass
class _Value:
  """A jaxpr variable's value: a numpy constant, or the name of an ONNX tensor."""

  const: np.ndarray | None = None
  name: str | None = None
  # For the output of a constant-valued `pad`: (its operand, padding_config, padding value), so
  # that a max pooling of it can pool the operand instead (see _reduce_window_max).
  padded: tuple["_Value", Any, float] | None = None


class _Builder:
  """Accumulates the ONNX nodes and initializers of one graph."""

  def __init__(self, input_name: str):
    self.nodes: list[onnx.NodeProto] = []
    self.initializers: list[onnx.TensorProto] = []
    self.input_name = input_name
    self._ids = itertools.count()
    self._batch: str | None = None

  def fresh(self, hint: str) -> str:
    return f"{hint}_{next(self._ids)}"

  def node(self, op: str, inputs: Sequence[str], n_out: int = 1, **attrs) -> list[str]:
    outs = [self.fresh(op.lower()) for _ in range(n_out)]
    self.nodes.append(helper.make_node(op, list(inputs), outs, name=outs[0], **attrs))
    return outs

  def one(self, op: str, inputs: Sequence[str], **attrs) -> str:
    return self.node(op, inputs, **attrs)[0]

  def const(self, value: Any, hint: str = "const") -> str:
    name = self.fresh(hint)
    self.initializers.append(numpy_helper.from_array(np.asarray(value), name))
    return name

  def ints(self, values: Any, hint: str = "const") -> str:
    """An int64 constant (shapes, axes, indices)."""
    return self.const(np.array(values, np.int64), hint)

  def name_of(self, value: _Value) -> str:
    if value.name is None:
      value.name = self.const(value.const)
    return value.name

  def batch(self) -> str:
    """The input's batch size, int64 [1]."""
    if self._batch is None:
      shape = self.one("Shape", [self.input_name])
      self._batch = self.one("Slice", [shape, self.ints([0]), self.ints([1])])
    return self._batch

  def shape_tensor(self, dims: Sequence[Any]) -> str:
    """int64 [rank] holding `dims`; dimensions linear in the batch are computed from it."""
    if all(_is_static(d) for d in dims):
      return self.ints([int(d) for d in dims], "shape")
    parts = []
    for d in dims:
      if _is_static(d):
        parts.append(self.ints([int(d)]))
        continue
      slope, offset = _dim_at(d, 1) - _dim_at(d, 0), _dim_at(d, 0)
      if _dim_at(d, 2) != 2 * slope + offset:
        raise NotImplementedError(f"dimension {d} is not linear in the batch size")
      part = self.batch()
      if slope != 1:
        part = self.one("Mul", [part, self.ints([slope])])
      if offset:
        part = self.one("Add", [part, self.ints([offset])])
      parts.append(part)
    return self.one("Concat", parts, axis=0)


def _reshape_target(shape: Sequence[Any]) -> np.ndarray:
  symbolic = [i for i, d in enumerate(shape) if not _is_static(d)]
  if len(symbolic) > 1:
    raise NotImplementedError(f"reshape to {shape}: more than one batch-dependent dimension")
  return np.array([-1 if i in symbolic else int(d) for i, d in enumerate(shape)], np.int64)


def _needed(steps: Sequence[Any], outputs: Any, outs: Callable, ins: Callable) -> tuple[list, set]:
  """The steps (jaxpr equations, ONNX nodes) that `outputs` depend on, and every name they read:
  the example ids that the ViT derives from the batch size feed only dropout, absent here, and a
  pad that a max pooling replaced is left behind unused."""
  needed, kept = set(outputs), []
  for step in reversed(steps):
    if any(o in needed for o in outs(step)):
      kept.append(step)
      needed.update(ins(step))
  return kept[::-1], needed


def _vars(vs: Sequence[Any]) -> list[Any]:
  return [v for v in vs if not isinstance(v, jex.core.Literal)]


class _Translator:
  def __init__(self, builder: _Builder):
    self.b = builder

  def run(self, jaxpr: jex.core.Jaxpr, consts: Sequence[Any], args: Sequence[_Value]):
    env: dict[Any, _Value] = {}
    for var, c in zip(jaxpr.constvars, consts, strict=True):
      env[var] = _Value(const=np.asarray(c))
    for var, a in zip(jaxpr.invars, args, strict=True):
      env[var] = a

    def read(v):
      if isinstance(v, jex.core.Literal):
        return _Value(const=np.asarray(v.val, dtype=v.aval.dtype))
      return env[v]

    eqns, _ = _needed(
      jaxpr.eqns, _vars(jaxpr.outvars), lambda e: e.outvars, lambda e: _vars(e.invars)
    )
    for eqn in eqns:
      ins = [read(v) for v in eqn.invars]
      outs = self.equation(eqn, ins)
      for var, out in zip(eqn.outvars, outs, strict=True):
        env[var] = out
    return [read(v) for v in jaxpr.outvars]

  def equation(self, eqn, ins: list[_Value]) -> list[_Value]:
    name = eqn.primitive.name
    if name in _CALLS:
      sub = eqn.params["jaxpr" if "jaxpr" in eqn.params else "call_jaxpr"]
      return self.run(sub.jaxpr, sub.consts, ins)
    # Constant inputs and a shape that does not depend on the batch: evaluated here.
    static = all(_is_static(d) for v in eqn.outvars for d in v.aval.shape)
    if static and all(v.const is not None for v in ins):
      outs = eqn.primitive.bind(*[v.const for v in ins], **eqn.params)
      outs = outs if eqn.primitive.multiple_results else [outs]
      return [_Value(const=np.asarray(o)) for o in outs]
    if name in _IDENTITY:
      return ins
    handler = getattr(self, f"_{name}", None)
    if handler is None:
      raise NotImplementedError(f"jax primitive {name!r} has no ONNX translation")
    names = [self.b.name_of(v) for v in ins]
    out = handler(eqn, names, ins)
    outs = [_Value(name=o) for o in (out if isinstance(out, list) else [out])]
    if name == "pad" and ins[1].const is not None:
      outs[0].padded = (ins[0], eqn.params["padding_config"], float(ins[1].const))
    return outs

  # -- elementwise -----------------------------------------------------------------------------

  def __getattr__(self, attr: str) -> Callable[..., Any]:
    prim = attr[1:]
    if prim in _ELEMENTWISE:
      return lambda eqn, names, ins: self.b.one(_ELEMENTWISE[prim], names)
    if prim in _REDUCE:
      return lambda eqn, names, ins: self.b.one(
        _REDUCE[prim], [names[0], self.b.ints(eqn.params["axes"])], keepdims=0
      )
    raise AttributeError(attr)

  def _rsqrt(self, eqn, names, ins):
    return self.b.one("Reciprocal", [self.b.one("Sqrt", names)])

  def _erfc(self, eqn, names, ins):
    one = self.b.const(np.array(1, eqn.invars[0].aval.dtype))
    return self.b.one("Sub", [one, self.b.one("Erf", names)])

  def _square(self, eqn, names, ins):
    return self.b.one("Mul", [names[0], names[0]])

  def _integer_pow(self, eqn, names, ins):
    y, x = eqn.params["y"], names[0]
    if y == 2:
      return self.b.one("Mul", [x, x])
    if y == 3:
      return self.b.one("Mul", [self.b.one("Mul", [x, x]), x])
    return self.b.one("Pow", [x, self.b.const(np.array(y, eqn.invars[0].aval.dtype))])

  def _ne(self, eqn, names, ins):
    return self.b.one("Not", [self.b.one("Equal", names)])

  def _select_n(self, eqn, names, ins):
    if len(names) != 3:
      raise NotImplementedError("select_n with more than two cases")
    pred = names[0]
    if eqn.invars[0].aval.dtype != np.bool_:
      pred = self.b.one("Cast", [pred], to=TensorProto.BOOL)
    return self.b.one("Where", [pred, names[2], names[1]])

  def _convert_element_type(self, eqn, names, ins):
    to = helper.np_dtype_to_tensor_dtype(np.dtype(eqn.params["new_dtype"]))
    return self.b.one("Cast", names, to=to)

  # -- shapes ----------------------------------------------------------------------------------

  def _reshape(self, eqn, names, ins):
    return self.b.one(
      "Reshape", [names[0], self.b.const(_reshape_target(eqn.params["new_sizes"]), "shape")]
    )

  def _transpose(self, eqn, names, ins):
    return self.b.one("Transpose", names, perm=list(eqn.params["permutation"]))

  def _squeeze(self, eqn, names, ins, op="Squeeze"):
    return self.b.one(op, [names[0], self.b.ints(eqn.params["dimensions"])])

  def _expand_dims(self, eqn, names, ins):
    return self._squeeze(eqn, names, ins, op="Unsqueeze")

  def _broadcast_in_dim(self, eqn, names, ins):
    shape, dims = eqn.params["shape"], eqn.params["broadcast_dimensions"]
    src = eqn.invars[0].aval.shape
    ranked = [src[dims.index(i)] if i in dims else 1 for i in range(len(shape))]
    x = names[0]
    if len(ranked) != len(src):
      x = self.b.one("Reshape", [x, self.b.const(_reshape_target(ranked), "shape")])
    if all(_same(r, s) for r, s in zip(ranked, shape, strict=True)):
      return x
    target = [1 if _same(r, s) else s for r, s in zip(ranked, shape, strict=True)]
    return self.b.one("Expand", [x, self.b.shape_tensor(target)])

  def _concatenate(self, eqn, names, ins):
    return self.b.one("Concat", names, axis=int(eqn.params["dimension"]))

  def _stack(self, eqn, names, ins):
    axis = self.b.ints([eqn.params["axis"]])
    return self.b.one(
      "Concat", [self.b.one("Unsqueeze", [n, axis]) for n in names], axis=eqn.params["axis"]
    )

  def _slice(self, eqn, names, ins):
    shape = eqn.invars[0].aval.shape
    starts, limits = eqn.params["start_indices"], eqn.params["limit_indices"]
    strides = eqn.params["strides"] or (1,) * len(starts)
    ends = []
    for limit, full in zip(limits, shape, strict=True):
      if _is_static(limit):
        ends.append(int(limit))
      elif _same(limit, full):
        ends.append(_INT64_MAX)
      else:
        raise NotImplementedError(f"slice ending at the batch-dependent {limit}")
    args = [[int(s) for s in starts], ends, list(range(len(starts))), strides]
    return self.b.one("Slice", [names[0], *(self.b.ints(a) for a in args)])

  def _pad(self, eqn, names, ins):
    config = eqn.params["padding_config"]
    if any(interior for _, _, interior in config) or any(lo < 0 or hi < 0 for lo, hi, _ in config):
      raise NotImplementedError(f"pad with interior or negative padding {config}")
    pads = self.b.ints([lo for lo, _, _ in config] + [hi for _, hi, _ in config])
    return self.b.one("Pad", [names[0], pads, names[1]], mode="constant")

  # -- contractions ----------------------------------------------------------------------------

  def _dot_general(self, eqn, names, ins):
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    lhs, rhs = eqn.invars[0].aval, eqn.invars[1].aval
    l_free = [i for i in range(lhs.ndim) if i not in lc and i not in lb]
    r_free = [i for i in range(rhs.ndim) if i not in rc and i not in rb]
    # x [..., K] @ W [K, N] (Dense layers, the 2-D form of vit's matmul_2d): MatMul.
    if not lb and len(lc) == 1 and lc[0] == lhs.ndim - 1 and rhs.ndim == 2:
      w = self._transposed(ins[1], names[1], (1, 0) if rc[0] == 1 else (0, 1))
      return self.b.one("MatMul", [names[0], w])
    # Batched [B.., M, K] @ [B.., K, N] with leading batch dimensions (attention): MatMul.
    k = len(lb)
    if (
      tuple(lb) == tuple(range(k))
      and tuple(rb) == tuple(range(k))
      and len(lc) == len(rc) == len(l_free) == len(r_free) == 1
    ):
      a = self._transposed(ins[0], names[0], (*range(k), l_free[0], lc[0]))
      w = self._transposed(ins[1], names[1], (*range(k), rc[0], r_free[0]))
      return self.b.one("MatMul", [a, w])
    letters = iter("abcdefghijklmnopqrstuvwxyz")
    lhs_l = [next(letters) for _ in range(lhs.ndim)]
    rhs_l = [next(letters) for _ in range(rhs.ndim)]
    for i, j in zip(lc, rc, strict=True):
      rhs_l[j] = lhs_l[i]
    for i, j in zip(lb, rb, strict=True):
      rhs_l[j] = lhs_l[i]
    out = [lhs_l[i] for i in lb] + [lhs_l[i] for i in l_free] + [rhs_l[i] for i in r_free]
    equation = f"{''.join(lhs_l)},{''.join(rhs_l)}->{''.join(out)}"
    return self.b.one("Einsum", names, equation=equation)

  def _transposed(self, value: _Value, name: str, perm: Sequence[int]) -> str:
    if tuple(perm) == tuple(range(len(perm))):
      return name
    if value.const is not None:
      return self.b.const(np.ascontiguousarray(np.transpose(value.const, perm)))
    return self.b.one("Transpose", [name], perm=list(perm))

  def _conv_general_dilated(self, eqn, names, ins):
    p = eqn.params
    if p["batch_group_count"] != 1 or any(d != 1 for d in p["lhs_dilation"]):
      raise NotImplementedError("transposed or batch-grouped convolutions")
    lhs_spec, rhs_spec, out_spec = p["dimension_numbers"]
    x = self._transposed(ins[0], names[0], lhs_spec)  # → N, C, spatial
    w = self._transposed(ins[1], names[1], rhs_spec)  # → O, I, spatial
    pads = [lo for lo, _ in p["padding"]] + [hi for _, hi in p["padding"]]
    y = self.b.one(
      "Conv",
      [x, w],
      strides=list(p["window_strides"]),
      pads=pads,
      dilations=list(p["rhs_dilation"]),
      group=int(p["feature_group_count"]),
    )
    return self.b.one("Transpose", [y], perm=list(np.argsort(out_spec)))

  def _reduce_window_max(self, eqn, names, ins):
    """MaxPool between transposes. Of a constant-padded map (BiT's root), it pools the unpadded
    map and takes the maximum with the padding value at the windows that reach into the padding,
    so that onnxruntime's Pad+MaxPool fusion (padding as -inf) finds no Pad (docs/export.md)."""
    p = eqn.params
    window, strides, padding = p["window_dimensions"], p["window_strides"], p["padding"]
    rank = len(window)
    spatial = [i for i in range(rank) if window[i] != 1 or strides[i] != 1 or padding[i] != (0, 0)]
    channels = [i for i in range(1, rank) if i not in spatial]
    dilated = any(d != 1 for d in (*p["base_dilation"], *p["window_dilation"]))
    if 0 in spatial or len(channels) != 1 or dilated:
      raise NotImplementedError(f"max pooling over window {window}")
    perm = [0, channels[0], *spatial]
    source, pad_config, pad_value = ins[0].padded or (None, None, None)
    extra = [(0, 0)] * rank
    if source is not None and all(pad_config[i][:2] == (0, 0) for i in (0, channels[0])):
      extra = [(lo, hi) for lo, hi, _ in pad_config]
      x = self.b.one("Transpose", [self.b.name_of(source)], perm=perm)
    else:
      source = None
      x = self.b.one("Transpose", names, perm=perm)
    pads = [padding[i][e] + extra[i][e] for e in (0, 1) for i in spatial]  # all starts, then ends
    kernel, stride = [window[i] for i in spatial], [strides[i] for i in spatial]
    y = self.b.one("MaxPool", [x], kernel_shape=kernel, strides=stride, pads=pads)
    if source is not None:
      out_shape = eqn.outvars[0].aval.shape
      touches = np.zeros([int(out_shape[i]) for i in spatial], bool)
      for axis, i in enumerate(spatial):
        lo, hi = extra[i]
        size = int(eqn.invars[0].aval.shape[i]) - lo - hi  # of the unpadded map
        # Each window's first row/column in the unpadded map's coordinates: does the window
        # overlap the constant padding [-lo, 0) or [size, size + hi)?
        start = np.arange(touches.shape[axis]) * strides[i] - padding[i][0] - lo
        end = start + window[i]
        hit = ((start < 0) & (end > -lo)) | ((end > size) & (start < size + hi))
        touches |= np.expand_dims(hit, [a for a in range(len(spatial)) if a != axis])
      dtype = eqn.invars[0].aval.dtype
      mask = np.where(touches, np.asarray(pad_value, dtype), np.asarray(-np.inf, dtype))
      y = self.b.one("Max", [y, self.b.const(mask[None, None], "pad_mask")])
    return self.b.one("Transpose", [y], perm=list(np.argsort(perm)))

  def _argmax(self, eqn, names, ins):
    (axis,) = eqn.params["axes"]
    out = self.b.one("ArgMax", names, axis=int(axis), keepdims=0)
    to = helper.np_dtype_to_tensor_dtype(np.dtype(eqn.params["index_dtype"]))
    return self.b.one("Cast", [out], to=to)

  def _top_k(self, eqn, names, ins):
    k = self.b.ints([eqn.params["k"]])
    values, indices = self.b.node("TopK", [names[0], k], n_out=2, axis=-1, largest=1, sorted=1)
    return [values, self.b.one("Cast", [indices], to=TensorProto.INT32)]


def _same(a: Any, b: Any) -> bool:
  if _is_static(a) and _is_static(b):
    return int(a) == int(b)
  if _is_static(a) != _is_static(b):
    return False
  return all(_dim_at(a, n) == _dim_at(b, n) for n in (0, 1, 2))


def convert(
  fn: Callable[[jax.Array], Any],
  example_shape: Sequence[int],
  *,
  input_name: str = "images",
  output_names: Sequence[str],
  dtype: Any = jnp.float32,
  doc: str = "",
  metadata: dict[str, str] | None = None,
) -> onnx.ModelProto:
  """An ONNX model computing `fn` on inputs [batch, *example_shape[1:]] of any batch size.

  `fn` takes one array and returns an array or a tuple of arrays; its closed-over parameters
  become the graph's initializers. `metadata` is stored in the model's `metadata_props`.
  """
  (batch,) = export.symbolic_shape(BATCH)
  shape = (batch, *example_shape[1:])
  closed = jax.make_jaxpr(fn)(jax.ShapeDtypeStruct(shape, dtype))
  builder = _Builder(input_name)
  outs = _Translator(builder).run(closed.jaxpr, closed.consts, [_Value(name=input_name)])
  if len(outs) != len(output_names):
    raise ValueError(f"{len(outs)} outputs, {len(output_names)} output names")
  outputs = []
  for value, name, var in zip(outs, output_names, closed.jaxpr.outvars, strict=True):
    builder.nodes.append(helper.make_node("Identity", [builder.name_of(value)], [name], name=name))
    dims = ["batch" if not _is_static(d) else int(d) for d in var.aval.shape]
    outputs.append(
      helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(var.aval.dtype), dims)
    )
  inputs = [
    helper.make_tensor_value_info(
      input_name,
      helper.np_dtype_to_tensor_dtype(np.dtype(dtype)),
      ["batch", *(int(d) for d in example_shape[1:])],
    )
  ]
  nodes, needed = _needed(builder.nodes, output_names, lambda n: n.output, lambda n: n.input)
  initializers = [t for t in builder.initializers if t.name in needed]
  graph = helper.make_graph(nodes, "vit_jax", inputs, outputs, initializers)
  model = helper.make_model(
    graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="vit_jax", doc_string=doc
  )
  model.ir_version = 8  # read by onnxruntime 1.14 and later
  for key, value in (metadata or {}).items():
    entry = model.metadata_props.add()
    entry.key, entry.value = key, value
  onnx.checker.check_model(model)
  return model
