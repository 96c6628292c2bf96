"""The trainer's step compiled for a set of devices without the planner: the reference the
planner's figures (test_plan) and the step-memory bounds (test_step_memory) are read from."""

from vit_jax import sharding, train
from vit_jax.checkpoint.state import train_state
from vit_jax.tools import plan as planner


def compile_step(config, devices, num_classes: int):
  """The compiled train step of `config` on `devices` (abstract state and batch, nothing run)."""
  mesh = sharding.make_mesh(config.mesh, devices)
  built = train.build(config, mesh, num_classes)
  state = train_state.abstract_tree(built.abstract_state, built.state_shardings)
  batch = planner.abstract_batch(config, mesh, num_classes)
  return built.jit_step(batch).lower(state, batch, train.abstract_window(mesh)).compile()
