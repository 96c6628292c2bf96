"""The planner: HLO collectives and loops, what-would-fit logic, and compiling the trainer's step.

The parser and the fit logic run everywhere; the compile path runs on the eight simulated CPU
devices of conftest (the same code as for a TPU topology), and on a real TPU topology when
libtpu is installed (`pip install -e ".[tpu]"`); the paper configs on a v3 slice are slow tests.

The tests that compile for a topology (`libtpu_test`) each run in a pytest process of their own
(tests/helpers/libtpu_process.py says why).
"""

import json
import re
import subprocess
import sys

import jax
import pytest

from experiments import fingerprint, pod_plan
from tests.helpers import REPO, compiled_step
from tests.helpers.libtpu_process import libtpu_test, needs_libtpu, run_with_libtpu
from vit_jax.configs import pretrain
from vit_jax.cost import compiled_stats
from vit_jax.tools import plan as planner

GiB = 2**30


# A loop of 4 iterations holding an all-gather, a dot, a reduce-scatter and an all-reduce, then an
# async all-reduce over pairs and an all-to-all over every device, on an 8-device program.
HLO = """\
HloModule test, entry_computation_layout={(f32[64,128]{1,0})->f32[64,128]{1,0}}

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %sum = f32[] add(%x, %y)
}

%cond (p: (s32[], f32[64,128])) -> pred[] {
  %p = (s32[], f32[64,128]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(4)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%body (p.1: (s32[], f32[64,128])) -> (s32[], f32[64,128]) {
  %p.1 = (s32[], f32[64,128]{1,0}) parameter(0)
  %i.1 = s32[] get-tuple-element(%p.1), index=0
  %w = f32[64,128]{1,0:T(8,128)} get-tuple-element(%p.1), index=1
  %ag = f32[512,128]{1,0:T(8,128)} all-gather(%w), channel_id=1, replica_groups=[1,8]<=[8], dimensions={0}
  %c0 = f32[] constant(0)
  %lhs = f32[64,512]{1,0} broadcast(%c0), dimensions={}
  %d = f32[64,128]{1,0} dot(%lhs, %ag), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %rs = f32[8,128]{1,0} reduce-scatter(%d), channel_id=2, replica_groups={{0,1,2,3,4,5,6,7}}, dimensions={0}, to_apply=%add
  %ar = f32[64,128]{1,0} all-reduce(%d), channel_id=3, replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_1'}, to_apply=%add
  %one = s32[] constant(1)
  %next = s32[] add(%i.1, %one)
  ROOT %t = (s32[], f32[64,128]{1,0}) tuple(%next, %ar)
}

ENTRY %main (a: f32[64,128]) -> f32[64,128] {
  %a = f32[64,128]{1,0} parameter(0)
  %zero = s32[] constant(0)
  %init = (s32[], f32[64,128]{1,0}) tuple(%zero, %a)
  %loop = (s32[], f32[64,128]{1,0}) while(%init), condition=%cond, body=%body
  %out = f32[64,128]{1,0} get-tuple-element(%loop), index=1
  %b = bf16[1024]{0} convert(%out)
  %ars = bf16[1024]{0} all-reduce-start(bf16[1024]{0} %b), replica_groups={{0,1},{2,3},{4,5},{6,7}}, to_apply=%add
  %ard = bf16[1024]{0} all-reduce-done(%ars)
  %a2a = f32[64,128]{1,0} all-to-all(%out), replica_groups={}, dimensions={0}
  ROOT %r = f32[64,128]{1,0} copy(%a2a)
}
"""


def test_parse_hlo_counts_collectives_and_matmuls_per_loop_iteration():
  stats = compiled_stats.parse_hlo(HLO, num_devices=8)
  assert stats.loops == [("body", 4)]
  c = stats.collectives
  # all-gather of a [512, 128] f32 result over 8 devices: each sends 7/8 of it, 4 times.
  assert c["all-gather"] == {"count": 4, "bytes": 4 * 512 * 128 * 4 * 7 / 8}
  # reduce-scatter to [8, 128]: the input is 8× the result, each device sends 7/8 of it.
  assert c["reduce-scatter"] == {"count": 4, "bytes": 4 * 8 * 128 * 4 * 8 * 7 / 8}
  # all-reduce over the 4 devices of 'axis_1' in the loop (2 × 3/4 of the buffer), plus the
  # async bf16 one over pairs (2 × 1/2 of 2 KiB); the -done half is not counted again.
  assert c["all-reduce"] == {"count": 5, "bytes": 4 * 2 * 64 * 128 * 4 * 3 / 4 + 2 * 2048 / 2}
  # replica_groups={} is every device.
  assert c["all-to-all"] == {"count": 1, "bytes": 64 * 128 * 4 * 7 / 8}
  assert c["collective-permute"] == {"count": 0, "bytes": 0}
  # The same bytes by element type: the one bf16 all-reduce, the rest f32.
  assert stats.ici_dtypes == pytest.approx(
    {"bf16": 2 * 2048 / 2, "f32": sum(v["bytes"] for v in c.values()) - 2 * 2048 / 2}
  )
  # The dot: [64, 512] × [512, 128], 2 FLOPs per multiply-add, once per iteration.
  assert stats.matmul_flops_once == 2 * 64 * 128 * 512
  assert stats.matmul_flops == 4 * 2 * 64 * 128 * 512


# What the TPU compiler makes of an all-reduce across 2 slices (from a v5e:4x4 x 2 compile): an
# all-reduce inside the slice, then a host transfer to the other slice through the megascale
# runtime (and its recv).
MULTISLICE_HLO = HLO.replace(
  "  ROOT %r = f32[64,128]{1,0} copy(%a2a)",
  """  %aa = token[] after-all(), frontend_attributes={MegascaleRendezvousKeyName="all-reduce.53_0"}
  %send = (f32[64,128]{1,0:T(8,128)}, u32[], token[]) send(%a2a, %aa), channel_id=9, is_host_transfer=true, frontend_attributes={_xla_host_transfer_handler_name="xla_megascale_runtime",_xla_host_transfer_rendezvous="all-reduce.53_0",_xla_megascale_reduce_operation="SUM",_xla_megascale_target="{1,2}x{0:15}",_xla_megascale_transfer_type="ALL_REDUCE"}
  %send-done = token[] send-done(%send), channel_id=9, is_host_transfer=true
  %recv = (f32[64,128]{1,0:T(8,128)}, u32[], token[]) recv(%aa), channel_id=10, is_host_transfer=true, frontend_attributes={_xla_host_transfer_handler_name="xla_megascale_runtime",_xla_megascale_transfer_type="ALL_REDUCE"}
  ROOT %r = f32[64,128]{1,0} copy(%a2a)""",
)


def test_parse_hlo_counts_the_bytes_between_slices_apart():
  """The megascale send of an f32[64, 128] all-reduce across 2 slices: 2 x (2 - 1) / 2 of its
  32 KiB over the data-centre network (its recv not counted again); the collectives inside the
  slice are the interconnect's."""
  stats = compiled_stats.parse_hlo(MULTISLICE_HLO, num_devices=8, slices=2)
  assert stats.dcn_bytes == 64 * 128 * 4 and stats.dcn_dtypes == {"f32": 64 * 128 * 4}
  assert stats.ici_bytes == sum(v["bytes"] for v in stats.collectives.values()) > 0
  assert compiled_stats.parse_hlo(MULTISLICE_HLO, 8, slices=4).dcn_bytes == 64 * 128 * 4 * 1.5
  assert compiled_stats.parse_hlo(HLO, num_devices=8).dcn_bytes == 0


def test_parse_hlo_trip_count_from_backend_config_and_unknown_loops():
  text = HLO.replace(
    "condition=%cond, body=%body",
    'condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"6"}}',
  )
  assert compiled_stats.parse_hlo(text, 8).loops == [("body", 6)]
  unknown = HLO.replace("direction=LT", "direction=NE")
  stats = compiled_stats.parse_hlo(unknown, 8)
  assert stats.loops == [("body", None)]
  assert stats.collectives["all-gather"]["count"] == 1  # counted once, and reported as unknown


# A TPU weight gradient of a [1576, 768] x [768, 3, 12, 64] projection, as the TPU compiler writes
# it: a convolution whose 3x12 window runs over a 1x1 input padded to 5x23 (so each output
# element reads one real input position, the rest is padding).
TPU_CONV_HLO = """\
HloModule conv

ENTRY %main (a: bf16[1576,768,1,1], b: bf16[3,12,64,1576]) -> bf16[768,3,12,64] {
  %a = bf16[1576,768,1,1]{1,0,2,3:T(8,128)(2,1)} parameter(0)
  %b = bf16[3,12,64,1576]{3,2,1,0:T(8,128)(2,1)} parameter(1)
  ROOT %c = bf16[768,3,12,64]{0,3,2,1:T(8,128)(2,1)} convolution(%a, %b), window={size=3x12 pad=2_2x11_11 rhs_reversal=1x1}, dim_labels=fb01_01oi->b01f
}
"""


def test_parse_hlo_counts_a_padded_window_convolution_as_the_matmul_it_is():
  stats = compiled_stats.parse_hlo(TPU_CONV_HLO, 8)
  assert stats.matmul_flops == 2 * 1576 * 768 * 3 * 12 * 64


@pytest.mark.parametrize(
  "stride,padding,lhs_dilation,rhs_dilation",
  [
    ((16, 16), "VALID", (1, 1), (1, 1)),  # the patch embedding
    ((1, 1), "SAME", (1, 1), (1, 1)),
    ((2, 1), ((3, 3), (0, 2)), (1, 1), (1, 1)),  # a ResNet stem's padding, uneven
    ((1, 1), ((1, 1), (2, 2)), (1, 1), (2, 3)),  # atrous
    ((1, 1), ((1, 1), (1, 1)), (2, 2), (1, 1)),  # transposed (input dilation)
  ],
)
def test_parse_hlo_convolution_flops_count_only_real_input_taps(
  stride, padding, lhs_dilation, rhs_dilation
):
  """The count equals an oracle: conv of all-ones (one feature) gives each output's real taps."""
  batch, cin, cout, size, window = 2, 3, 5, (32, 20), (16, 16) if stride[0] == 16 else (7, 3)

  def conv(x, k):
    return jax.lax.conv_general_dilated(
      x, k, stride, padding, lhs_dilation, rhs_dilation, ("NHWC", "HWIO", "NHWC")
    )

  x = jax.ShapeDtypeStruct((batch, *size, cin), "float32")
  k = jax.ShapeDtypeStruct((*window, cin, cout), "float32")
  text = jax.jit(conv).lower(x, k).compile().as_text()
  taps = conv(jax.numpy.ones((1, *size, 1)), jax.numpy.ones((*window, 1, 1))).sum()
  assert compiled_stats.parse_hlo(text, 1).matmul_flops == 2 * batch * cin * cout * int(taps)


def _suggest(state, act, hbm=16, remat=False, scan=False, accum=1, per_device=8, fsdp=1):
  return planner.suggest(
    state_bytes=state * GiB,
    activation_bytes=act * GiB,
    fixed_bytes=0.1 * GiB,
    hbm=hbm * GiB,
    settings=dict(
      batch_size=per_device * 512, per_device_batch=per_device, accum_steps=accum, remat=remat,
      scan=scan,
    ),
    mesh=dict(data=512 // fsdp, fsdp=fsdp, model=1),
    num_layers=32,
  )  # fmt: skip


def test_suggest_nothing_when_it_fits():
  assert _suggest(state=10, act=5) == []


def test_suggest_fsdp_when_the_state_does_not_fit():
  overrides = [o for o, _ in _suggest(state=20, act=2)]
  assert overrides[0] == {"model.remat": True}
  # Halving 20 GiB of state leaves 10 + 2 + 0.1 GiB, within 90% of 16 GiB: FSDP over 2, no remat.
  assert {"mesh.fsdp": 2, "mesh.data": -1} in overrides
  # Accumulation cannot help: the state alone is over the budget.
  assert not any("accum_steps" in o for o in overrides)
  assert {"model.scan": True, "model.remat": True} in overrides
  assert overrides[-1] == {"batch_size": 4 * 512}
  # With 40 GiB of state, FSDP must go to 4 and also needs remat for the 12 GiB of activations.
  overrides = [o for o, _ in _suggest(state=40, act=12)]
  assert {"mesh.fsdp": 4, "mesh.data": -1, "model.remat": True} in overrides


def test_suggest_accumulation_when_activations_do_not_fit():
  overrides = [o for o, _ in _suggest(state=4, act=20, remat=True, scan=True)]
  # 4 + 20/2 + 0.1 GiB fits 90% of 16 GiB; FSDP cannot (the activations alone are too big).
  assert overrides == [{"accum_steps": 2}, {"batch_size": 4 * 512}]
  # Already accumulating over 2: the next step is 4 (micro-batches of 2 of the 8 per device).
  assert [{"accum_steps": 4}] == [
    o for o, _ in _suggest(state=4, act=20, remat=True, scan=True, accum=2) if "accum_steps" in o
  ]


def test_topology_errors_are_one_line():
  with pytest.raises(ValueError, match=r"--topology='v3-8'"):
    planner.parse_topology("v3-8")
  assert planner.parse_topology("v4:4x4x8") == ("v4", (4, 4, 8))
  assert planner.accelerator_type("v3:16x16") == "v3-512"
  assert planner.accelerator_type("v5e:4x4") == "v5litepod-16"


def test_missing_libtpu_says_how_to_install(monkeypatch):
  monkeypatch.setattr(planner, "libtpu_available", lambda: False)
  with pytest.raises(RuntimeError, match=r'pip install -e "\.\[tpu\]"'):
    planner.topology_devices("v3:2x2")


def _small_config(**fields):
  config = pretrain.get_config("dataset=jft,model=testing,epochs=7,lr=1e-3")
  config.dataset.image_size = 32
  config.batch_size = 16
  return planner.apply_overrides(config, fields)


def _forward_matmul_flops(config, num_classes: int) -> tuple[int, int]:
  """The analytic matmul FLOPs of one image's forward pass, and those of its patch embedding.

  2 FLOPs per multiply-add. Per image of N = (size / P)^2 patches and T = N + 1 tokens (the
  class token), width D, MLP width M, L layers, pre-logits width R and K classes:
    patch embedding 2·N·(3·P²)·D
    + L · (2·T·(3·D² + D² + 2·D·M)   QKV, output projection, MLP: 2 × weights per token
           + 4·T²·D)                 QKᵀ and AV, all heads together
    + 2·D·R + 2·R·K                  pre-logits and head, on the class token.
  """
  m = config.model
  p, d, mlp, layers = m.patch_size, m.hidden_size, m.mlp_dim, m.num_layers
  n = (config.dataset.image_size // p) ** 2
  t = n + (m.classifier == "token")
  rep = m.representation_size or d
  embed = 2 * n * 3 * p * p * d
  forward = embed + layers * (2 * t * (4 * d * d + 2 * d * mlp) + 4 * t * t * d)
  return forward + 2 * d * rep + 2 * rep * num_classes, embed


def _train_matmul_flops(config, num_classes: int, examples: int) -> int:
  """The analytic matmul FLOPs of a train step on `examples` images: 3 × forward (forward, and
  the backward's input and weight gradients) less the patch embedding's input gradient, which
  nothing needs (the images are not trained)."""
  forward, embed = _forward_matmul_flops(config, num_classes)
  return examples * (3 * forward - embed)


def _assert_compiler_memory(p, compiled):
  mem = compiled.memory_analysis()
  s = p.stats
  assert (s.argument, s.output, s.alias, s.temp, s.code) == (
    mem.argument_size_in_bytes,
    mem.output_size_in_bytes,
    mem.alias_size_in_bytes,
    mem.temp_size_in_bytes,
    mem.generated_code_size_in_bytes,
  )
  report = planner.format_plan(p)
  assert f"temporaries       {planner._gib(mem.temp_size_in_bytes)}" in report
  assert f"total             {planner._gib(s.total)}" in report


def test_plan_on_cpu_devices_reports_the_compilers_memory_and_loop_corrected_flops():
  devices = jax.devices()[:8]
  config = _small_config(**{"mesh.fsdp": 2})
  p = planner.plan(config, "cpu", num_classes=10, devices=devices)
  assert p.mesh == {"data": 4, "fsdp": 2, "model": 1}
  assert p.settings["per_device_batch"] == 2
  compiled = compiled_step.compile_step(config, devices, 10)
  _assert_compiler_memory(p, compiled)
  # The compiled step's dots and convolutions are the model's matmuls, 2 images per device:
  # 20,071,680 FLOPs, exactly the analytic count (XLA may rewrite a one-row product as a multiply
  # and a sum, hence the tolerance).
  matmuls = _train_matmul_flops(config, 10, examples=2)
  assert compiled_stats.parse_hlo(compiled.as_text(), 8).matmul_flops == pytest.approx(
    matmuls, rel=1e-3
  )
  # On the CPU arguments are not padded: parameters, optimizer state, batch, the step counter
  # and rng (4 + 8 bytes) and the metrics window (5 float32 sums and an int32: 24 bytes).
  assert p.stats.argument == p.stats.params + p.stats.opt_state + p.stats.batch + 4 + 8 + 24
  # FSDP over 2 shards the encoder's kernels: the sharded state is smaller than replicated.
  unsharded = planner.plan(_small_config(), "cpu", num_classes=10, devices=devices)
  assert p.stats.params < unsharded.stats.params
  assert p.stats.collectives["all-gather"]["count"] > 0
  assert unsharded.stats.collectives["all-reduce"]["count"] > 0
  # The same step as a scan over layers and two micro-batches: XLA's cost analysis counts the
  # loop bodies once, the corrected count agrees with the unrolled step.
  looped = planner.plan(
    _small_config(**{"model.scan": True, "accum_steps": 2}), "cpu", num_classes=10, devices=devices
  )
  assert looped.stats.flops_xla < 0.7 * unsharded.stats.flops
  # (Within 15%: elementwise work inside loops stays counted once, a large share of the FLOPs
  # of this 32-wide model, a few percent of B/16.) Every layer's and micro-batch's matmuls are
  # counted: uncorrected, XLA's count is a third of them.
  assert looped.stats.flops == pytest.approx(unsharded.stats.flops, rel=0.15)
  assert looped.stats.flops > matmuls > 2 * looped.stats.flops_xla
  assert sorted(t for _, t in looped.stats.loops) == [2, 2, 2]
  # The model FLOPs of MFU are the analytic matmul count (vit_jax.cost.flops: 3 x forward, the
  # embedding's input gradient included) for the 2 images of a device, scanned or not, and
  # whichever attention and LayerNorm kernels the compiled step runs.
  model = 3 * 2 * _forward_matmul_flops(config, 10)[0]
  for plan_ in (p, unsharded, looped):
    assert plan_.model_flops == model


def test_planner_command_needs_libtpu_or_prints_a_report(tmp_path):
  cmd = [
    sys.executable,
    "-m",
    "vit_jax.tools.plan",
    "--config=configs/pretrain.py:dataset=jft,model=testing,epochs=7,lr=1e-3",
    "--config.dataset.image_size=32",
    "--config.batch_size=16",
    "--topology=v3:2x2",
  ]
  # Bad input is one line naming the culprit (the command shape of vit_jax.runtime.cli).
  for args, line in [
    ([*cmd[:-1], "--topology=v3-8"], "plan: error: ValueError: --topology='v3-8': expected"),
    (cmd[:-1], "plan: error: IllegalFlagValueError: flag --topology=None"),
    ([*cmd, "--config.model.nope=1"], "plan: error: UnknownFieldError: --config.model.nope"),
  ]:
    bad = subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert bad.returncode == 1 and bad.stderr.strip().splitlines()[-1].startswith(line), bad.stderr
    assert "Traceback" not in bad.stderr
  if not planner.libtpu_available():
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("plan: error: RuntimeError: libtpu is not installed"), out.stderr
    assert 'pip install -e ".[tpu]"' in last
    return
  out = run_with_libtpu(cmd, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.startswith("v3:2x2: 8 × TPU v3, mesh {'data': 8, 'fsdp': 1, 'model': 1}")
  assert re.search(r"^  total .* of 16 GiB HBM: fits", out.stdout, re.M), out.stdout
  assert "It does not fit" not in out.stdout


@libtpu_test
def test_small_model_on_a_v3_8():
  config = _small_config()
  p = planner.plan(config, "v3:2x2", num_classes=10)
  assert (p.num_devices, p.device_kind, p.hbm) == (8, "TPU v3", 16 * GiB)
  assert p.fits and planner.suggestions_for(p, config) == []
  assert p.stats.flops > 0 and p.step_seconds > 0 and 0 < p.mfu < 1
  devices = planner.topology_devices("v3:2x2")
  compiled = compiled_step.compile_step(config, devices, 10)
  _assert_compiler_memory(p, compiled)
  # The TPU compiler writes some matmuls as convolutions over padded windows: counted as the
  # matmuls they are, the unrolled and the scanned step each have exactly the model's matmul
  # FLOPs (2 images per core: 20,071,680), the scanned one with its loop's trips multiplied in.
  matmuls = _train_matmul_flops(config, 10, examples=2)
  assert compiled_stats.parse_hlo(compiled.as_text(), 8).matmul_flops == matmuls
  scanned = _small_config(**{"model.scan": True})
  hlo = compiled_stats.parse_hlo(compiled_step.compile_step(scanned, devices, 10).as_text(), 8)
  assert hlo.matmul_flops == matmuls and hlo.matmul_flops_once < 0.6 * matmuls
  # The planner's loop-corrected count of the scanned step agrees with the unrolled one.
  looped = planner.plan(scanned, "v3:2x2", num_classes=10)
  assert looped.stats.flops_xla < 0.7 * p.stats.flops
  assert looped.stats.flops == pytest.approx(p.stats.flops, rel=0.15)
  assert looped.stats.flops > matmuls and p.stats.flops > matmuls


def _fake_plan(total_gib, flops, **settings):
  stats = compiled_stats.StepStats(
    argument=int(total_gib * GiB), output=0, alias=0, temp=0, code=0, params=int(4 * GiB),
    opt_state=int(8 * GiB), batch=0, gradients=0, flops=flops, flops_xla=flops,
    collectives={}, loops=[],
  )  # fmt: skip
  return planner.Plan(
    topology="v3:16x16", device_kind="TPU v3", num_devices=512,
    mesh=dict(data=512, fsdp=1, model=1),
    settings=dict(batch_size=4096, per_device_batch=8, accum_steps=1, remat=False, scan=True,
                  **settings),
    stats=stats, hbm=16 * GiB, peak_flops=61.5e12, model_flops=flops, efficiency=0.5,
    compile_seconds=1.0,
  )  # fmt: skip


def test_search_prefers_the_fastest_setting_that_leaves_headroom(monkeypatch):
  config = pretrain.get_config("dataset=jft,model=H/14")
  base = _fake_plan(24, 3e12)  # 12 GiB of state and 12 of activations: does not fit
  base.stats.temp, base.stats.argument = int(12 * GiB), int(12 * GiB)
  # Compiled (remat, FSDP degree, accum_steps, batch) → (GiB, FLOPs per step).
  trials = {
    (True, 1, 1, 4096): (15.9, 3.9e12),  # fits, but at 99% of the HBM
    (True, 2, 1, 4096): (9.0, 4.0e12),
    (True, 1, 8, 4096): (14.0, 3.95e12),
  }

  def fake(config_, topology, devices=None, **kwargs):
    c = config_
    key = (bool(c.model.remat), int(c.mesh.fsdp), int(c.accum_steps), int(c.batch_size))
    return _fake_plan(*trials.get(key, (30, 3e12)))

  monkeypatch.setattr(planner, "plan", fake)
  found = planner.search(config, "v3:16x16", base, max_trials=8)
  # Proposed: remat, FSDP 2 with remat, accum_steps 8 (alone and with remat), a smaller batch.
  # The tight remat plan has the fewest FLOPs; those with a tenth of the HBM free come first.
  assert [p.stats.total / GiB for _, p in found] == pytest.approx([14.0, 9.0, 15.9])


def test_a_refused_compile_reads_as_a_plan_that_does_not_fit():
  message = (
    "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
    "temporaries (18.61G) exceeds available HBM (15.48G).\nmore detail"
  )
  assert compiled_stats.temporaries_refused(message) == int(18.61 * GiB)
  assert compiled_stats.temporaries_refused("INTERNAL: something else") is None
  # libtpu's later wording: the whole use, of which the arguments are a part.
  later = (
    "RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: XLA:TPU compile permanent error. Ran out of "
    "memory in memory space hbm. Used 15.93G of 15.75G hbm. Exceeded hbm capacity by 185.82M."
  )
  used = int(15.93 * GiB)
  assert compiled_stats.temporaries_refused(later, arguments=GiB) == used - GiB


@libtpu_test
def test_a_step_the_tpu_compiler_refuses_is_planned_as_not_fitting():
  """4,096 images of 224px per v3 core: the compiler refuses; the plan says by how much."""
  config = _small_config(
    **{"batch_size": 8 * 4096, "dataset.image_size": 224, "model.hidden_size": 256}
  )
  p = planner.plan(config, "v3:2x2", num_classes=10)
  assert p.refused.startswith("RESOURCE_EXHAUSTED") and not p.fits
  assert p.stats.temp > 16 * GiB and p.step_seconds is None
  assert "DOES NOT FIT" in planner.format_plan(p)
  # Activations dominate: remat and gradient accumulation are proposed.
  proposed = [o for o, _ in planner.suggestions_for(p, config)]
  assert {"model.remat": True} in proposed
  assert any("accum_steps" in o for o in proposed)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["B/16", "L/16", "H/14"])
@libtpu_test
def test_paper_pretraining_fits_a_v3_slice(model):
  """batch 4096 on a v3-512 (8 images per core), with the planner's recommended settings.

  Scanned blocks (experiments/pod_plan.py's setting): an unrolled B/16 takes 16 minutes to
  compile for 512 devices on a 2-core machine, a scanned one about a minute.
  """
  config = pretrain.get_config(f"dataset=jft,model={model}")
  config.model.scan = True
  p = planner.plan(config, "v3:16x16")
  if not p.fits:
    found = planner.search(config, "v3:16x16", p, max_trials=2)
    assert found, f"{model}: nothing the planner proposes fits ({p.stats.total / GiB:.1f} GiB)"
    overrides, p = found[0]
    config = planner.apply_overrides(config, overrides)
  assert p.stats.total <= 16 * GiB
  compiled = compiled_step.compile_step(config, planner.topology_devices("v3:16x16"), 18_291)
  _assert_compiler_memory(p, compiled)


POD_PLAN = REPO / "experiments/results/pod_plan/results.json"


@pytest.mark.slow  # one compile of B/32 for 32 TPU v3 cores (half a minute on 2 cores)
@needs_libtpu
def test_quick_pod_plan_matches_the_committed_fingerprint(tmp_path):
  """experiments/pod_plan.py --quick: the TPU compiler's memory and FLOPs of its one row are
  the committed results' fingerprint (experiments/fingerprint.py)."""
  out = run_with_libtpu(
    [sys.executable, "-m", "experiments.pod_plan", "--quick", f"--out_dir={tmp_path}"],
    timeout=900,
  )
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  results = json.loads((tmp_path / "results.json").read_text())
  (row,) = results["rows"].values()
  assert row["chosen"]["fits"] and row["chosen"]["num_devices"] == 32
  assert (tmp_path / "table.md").read_text() == pod_plan.table([row])
  fingerprint.check(json.loads(POD_PLAN.read_text()), results, "python -m experiments.pod_plan")


def test_pod_plan_committed_results_were_made_with_todays_configs():
  today = fingerprint.configs(pod_plan.stage_configs(pod_plan.RUNS))
  committed = json.loads(POD_PLAN.read_text())
  fingerprint.check_configs(committed, today, "python -m experiments.pod_plan")
