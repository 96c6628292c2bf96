"""The linear-probe stage on an Orbax workdir, and its backbone handling."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax import checkpoint, evaluators, linear_probe, models
from vit_jax.checkpoint.state import train_state
from vit_jax.configs import linear_probe as linear_probe_config


def _backbone(image_size=16, num_classes=10, **overrides):
  model = models.get_model("testing", num_classes, **overrides)
  images = jnp.zeros((1, image_size, image_size, 3))
  return model, model.init(jax.random.key(0), images, train=False)["params"]


def _orbax_workdir(path, params, image_size):
  """What a trainer run leaves: checkpoints/<step>/state (+ data) and config.json."""
  checkpointer = train_state.Checkpointer(str(path), every_steps=1, keep=1, asynchronous=False)
  state = dict(step=jnp.int32(7), params=params, opt_state={}, rng=jax.random.PRNGKey(0))
  checkpointer.save(7, state, {"num_records": 0}, force=True)
  checkpointer.wait()
  checkpointer.close()
  config = {
    "stage": "pretrain",
    "model": dict(models.get_model_config("testing").to_dict(), representation_size=24),
    "dataset": {"name": "fashion_mnist", "image_size": image_size},
  }
  (path / "config.json").write_text(json.dumps(config))


def _probe_config(tmp_path, arg: str = ""):
  """The stage's runlocal config on digits, probing a random-init 'testing' backbone saved as a
  trainer's workdir (pre-logits of width 24)."""
  _, params = _backbone(image_size=16, representation_size=24)
  _orbax_workdir(tmp_path / "pretrain", params, image_size=16)
  config = linear_probe_config.get_config("dataset=digits,runlocal" + arg)
  config.model_init = str(tmp_path / "pretrain")
  config.probe.max_examples = 200
  return config


def test_run_on_an_orbax_workdir_writes_results(tmp_path):
  config = _probe_config(tmp_path)
  workdir = tmp_path / "probe"
  results = linear_probe.run(config, str(workdir))

  assert results["linear_probe/representation_size"] == 24  # the pre-logits of the backbone
  assert results["linear_probe/num_train"] == 200
  # digits' test split: the last 10% of each class of scikit-learn's 1,797 (18 x 9 + 17 for 8).
  assert results["linear_probe/num_test"] == 179
  # A random-init backbone's features beat chance (0.1) clearly: measured 0.307 (ridge) and 0.341
  # (logreg) for this init, 0.279-0.469 over 11 inits (keys 0-10); a chance-level probe on 179
  # examples has sd 0.022, so 0.2 is 4.5 sd above chance and 0.08 below the worst init.
  for probe in ("ridge", "logreg"):
    assert results[f"linear_probe/{probe}_accuracy"] > 0.2, probe
  saved = linear_probe.read_results(str(workdir))
  assert saved["model_init"] == str(tmp_path / "pretrain") and saved["dataset"] == "digits"
  assert saved["linear_probe/ridge_accuracy"] == results["linear_probe/ridge_accuracy"]
  assert json.loads((workdir / "config.json").read_text())["stage"] == "linear_probe"


@pytest.mark.parametrize("scan", [False, True])
def test_model_config_from_params(scan):
  _, params = _backbone(scan=scan, classifier="gap")
  config = checkpoint.model_config_from_params(jax.tree.map(np.asarray, params))
  expected = models.get_model_config("testing")
  for key in ("patch_size", "hidden_size", "mlp_dim", "num_heads", "num_layers"):
    assert config[key] == expected[key], key
  assert config.scan == scan and config.classifier == "gap"
  assert config.representation_size is None


def test_representation_model_resizes_posemb_and_picks_the_layer():
  model, params = _backbone(image_size=16, representation_size=24)
  params = jax.tree.map(np.asarray, params)
  config = models.get_model_config("testing")
  images = np.random.default_rng(0).uniform(-1, 1, (2, 24, 24, 3)).astype(np.float32)

  rep_model, rep_params = checkpoint.representation_model(config, params, "pre_logits", 24)
  assert "head" not in rep_params
  assert rep_params["Transformer"]["posembed_input"]["pos_embedding"].shape == (1, 37, 32)
  assert params["Transformer"]["posembed_input"]["pos_embedding"].shape == (1, 17, 32)  # intact
  assert rep_model.apply({"params": rep_params}, images, train=False)[0].shape == (2, 24)

  pooled_model, pooled_params = checkpoint.representation_model(config, params, "pooled", 16)
  assert "pre_logits" not in pooled_params
  out, _ = pooled_model.apply({"params": pooled_params}, images[:, :16, :16], train=False)
  full = model.apply({"params": params}, images[:, :16, :16], train=False)[1]["pre_logits"]
  assert out.shape == (2, 32)
  # pre_logits = tanh(Dense(pooled)): the pooled token is what the pre-logits layer reads.
  dense = params["pre_logits"]
  np.testing.assert_allclose(
    np.tanh(np.asarray(out) @ dense["kernel"] + dense["bias"]), full, rtol=1e-4, atol=1e-5
  )
  with pytest.raises(ValueError, match="representation"):
    checkpoint.representation_model(config, params, "logits", 16)


@pytest.mark.parametrize("preset", ["testing", "R26x1"])
def test_blocks_representation_is_every_blocks_mean_map_in_order(preset):
  """representation=blocks: each block's output averaged over its map, concatenated in block
  order; against the maps themselves averaged in float64."""
  overrides = dict(block_units=(1, 1)) if preset == "R26x1" else {}
  model = models.get_model(preset, 10, **overrides)
  images = jnp.asarray(np.random.default_rng(0).uniform(-1, 1, (3, 16, 16, 3)), jnp.float32)
  params = model.init(jax.random.key(0), images, train=False)["params"]
  features = np.asarray(evaluators.representation_fn(model, "blocks")(params, images))
  depth = model.num_layers if preset == "testing" else len(model.block_units)
  maps = model.apply({"params": params}, images, train=False)[1]["blocks"]
  expected = np.concatenate([np.asarray(m, np.float64).mean(axis=(1, 2)) for m in maps], -1)
  assert len(maps) == depth >= 2 and features.shape == expected.shape
  np.testing.assert_allclose(features, expected, rtol=1e-4, atol=1e-5)
  # Not the model's own representation: that is the last block's pooled token, normalised.
  own = evaluators.representation_fn(model)(params, images)
  assert own.shape[1] == maps[-1].shape[-1] < features.shape[1]


def test_the_stage_probes_every_blocks_features(tmp_path):
  config = _probe_config(tmp_path, ",representation=blocks")
  results = linear_probe.run(config, str(tmp_path / "probe"))
  testing = models.get_model_config("testing")
  assert results["linear_probe/representation_size"] == testing.num_layers * testing.hidden_size
  # Measured 0.430 (ridge) and 0.492 (logreg) for this init (0.307 and 0.341 from its pre-logits).
  assert results["linear_probe/logreg_accuracy"] > 0.2
  config.representation = "tokens"
  with pytest.raises(ValueError, match="representation='tokens'"):
    linear_probe.run(config, str(tmp_path / "probe2"))
