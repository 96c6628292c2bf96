"""Polyak averaging of the parameters: an exponential moving average (EMA) kept beside them.

    ema_0 = params_0;   ema_t = decay · ema_{t-1} + (1 − decay) · params_t

after every optimizer step t. The paper's Table 2 ImageNet fine-tuning adds Polyak & Juditsky
(1992) averaging with a factor of 0.9999 (§4.1). The trainer keeps the
average in its state as `state['ema']` (same shapes, dtypes and shardings as the parameters,
saved and resumed with them), evaluates it instead of the raw parameters, and
`vit_jax.checkpoint.state.train_state.restore_params` returns it to later stages.

Pure jax; no TensorFlow, no state of its own.
"""

from typing import Any

import jax


def enabled(decay: float | None) -> bool:
  """Whether `config.ema_decay` turns averaging on (0 or None: off); a decay outside [0, 1)
  raises ValueError."""
  if not decay:
    return False
  if not 0.0 < float(decay) < 1.0:
    raise ValueError(f"config.ema_decay={decay!r} must be in (0, 1), or 0/None to turn it off")
  return True


def update(ema: Any, params: Any, decay: float) -> Any:
  """One averaging step: decay · ema + (1 − decay) · params, leaf by leaf in the leaf's dtype."""
  return jax.tree_util.tree_map(
    lambda e, p: (decay * e + (1.0 - decay) * p).astype(e.dtype), ema, params
  )


def evaluated(state: dict[str, Any]) -> Any:
  """The parameters a trainer's state is evaluated (and exported) with: the average where the
  state keeps one, else the parameters."""
  return state.get("ema", state["params"])
