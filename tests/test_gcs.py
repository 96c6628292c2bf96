"""gs:// end to end, against a local GCS API server (tests/helpers/gcs.py): every stage and tool through
its entry point in a child process whose environment points its GCS clients at the server.

Default run: a short pretraining run that reads TFRecord shards on gs:// and writes a gs://
workdir (one run, checked by several tests), `checkpoint.load` of
it, the lock's atomic create, and the one line for a missing client library. Slow: the rest
(make_shards, resume, SIGKILL, fine-tuning, predict, the linear probe, faults).
"""

import json
import pathlib
import random
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from tests.helpers import REPO, fault_injection, random_weights, this_thread, trees, xla_env
from tests.helpers import gcs as harness
from vit_jax import checkpoint
from vit_jax.checkpoint.state import train_state
from vit_jax.runtime import gcs
from vit_jax.runtime import workdir as workdir_lib
from vit_jax.tools import make_shards

BUCKET = "vit-jax-test"
ROOT = f"gs://{BUCKET}"
SHARDS = f"{ROOT}/shards"
PRETRAIN = [
  "--config=configs/pretrain.py:dataset=fashion_mnist,runlocal",
  # The digits written to gs:// by make_shards, through the TFRecord source (as JFT-style shards).
  "--config.dataset.source=tfrecord",
  "--config.dataset.name=digits",
  f"--config.dataset.data_dir={SHARDS}",
  "--config.total_steps=2",  # one save: a save into gs:// takes seconds here
  "--config.checkpoint.every_steps=2",
  "--config.evals.val.every_steps=0",  # the classification evaluator (gs:// test split) at the end
  "--config.evals.fewshot_animal_mnist.every_steps=-1",  # no few-shot (local data; 2 CPU-s)
  "--config.evals.fewshot_mnist_5k.every_steps=-1",
]


@pytest.fixture(scope="module")
def env(local_gcs):
  """A child's environment: the server's variables, one process with one device (the
  compilation cache is the run's, tests/conftest.py)."""
  return xla_env.child_env(1, **local_gcs.env(), TF_CPP_MIN_LOG_LEVEL="2")


def run(env, *args, timeout=400, **fault) -> tuple[int, str]:
  """Runs `python *args` (a module's entry point, or '-c' code) in the checkout; (exit status,
  the terminal's last line). Prints both and the command (shown with -s)."""
  proc = subprocess.run(
    [sys.executable, *args], env=fault_injection.child_env(env, **fault), cwd=REPO,
    capture_output=True, text=True, timeout=timeout,
  )  # fmt: skip
  # The entry points' terminal is stderr (vit_jax.runtime.console); make_shards prints to stdout.
  lines = [x for x in proc.stderr.splitlines() or proc.stdout.splitlines() if x.strip()]
  last = lines[-1] if lines else ""
  shown = " ".join(a if len(a) < 200 else "<code>" for a in args)
  print(f"\n$ python {shown}\nexit {proc.returncode}: {last}")
  if proc.returncode not in (0, -9):
    print("\n".join(lines[-30:]))
  return proc.returncode, last


def main_args(workdir, *extra, config=PRETRAIN):
  return ["-m", "vit_jax.main", *config, f"--workdir={workdir}", *extra]


@pytest.fixture(scope="module")
def shards(local_gcs, tmp_path_factory):
  """The digits as TFRecord shards on gs://.../shards, written locally by make_shards and
  uploaded straight to the server (the make_shards command on gs:// is a slow test); the local
  directory."""
  local = tmp_path_factory.mktemp("shards")
  for split in ("train", "test"):
    make_shards.shard_builtin("digits", split, str(local), num_shards=2)
  for path in sorted(local.iterdir()):
    local_gcs.upload(BUCKET, f"shards/{path.name}", path.read_bytes())
  return local


@pytest.fixture(scope="module")
def pretrained(env, shards):
  """A 2-step pretraining run on the gs:// shards into gs://.../pretrain; the workdir."""
  workdir = f"{ROOT}/pretrain"
  code, last = run(env, *main_args(workdir))
  assert code == 0, last
  return workdir


def _restore_local(local_gcs, prefix, tmp_path):
  """The parameters of the workdir `prefix`, read from a local copy of its objects."""
  local = tmp_path / prefix.replace("/", "_")
  local_gcs.copy_to(BUCKET, prefix, local)
  return train_state.restore_params(local)


@pytest.mark.long
def test_pretraining_reads_and_writes_gcs(pretrained, local_gcs, monkeypatch, tmp_path):
  """The run read the gs:// shards and wrote its workdir (metrics, config.json, its checkpoint
  committed, the lock released); `checkpoint.load('gs://...')` in this process gives the
  parameters a local copy of the same objects gives. One test, so that pytest -n does not run
  the pretraining on both workers."""
  objects = local_gcs.objects(BUCKET)
  run_objects = [o.removeprefix("pretrain/") for o in objects if o.startswith("pretrain/")]
  assert {"config.json", "final_metrics.json"} <= set(run_objects)
  assert any(o.startswith("events.out.tfevents.") for o in run_objects)  # the metrics
  assert workdir_lib.LOCK_FILE not in run_objects  # taken, then released
  # The step committed (Orbax's commit marker on an object store), nothing half-written.
  assert "checkpoints/2/commit_success.txt" in run_objects
  assert not any(".orbax-checkpoint-tmp" in o for o in run_objects)
  metrics = json.loads(local_gcs.download(BUCKET, "pretrain/final_metrics.json"))
  assert np.isfinite(metrics["loss"]) and "val/accuracy" in metrics
  config = json.loads(local_gcs.download(BUCKET, "pretrain/config.json"))
  assert config["dataset"]["data_dir"] == SHARDS and config["dataset"]["name"] == "digits"
  # The evaluator read the gs:// test split: 179 digits, of which runlocal's val takes 64.
  assert metrics["val/num_examples"] == 64

  for key, value in local_gcs.env().items():
    monkeypatch.setenv(key, value)
  params = checkpoint.load(pretrained)
  assert params["Transformer"]["posembed_input"]["pos_embedding"].shape == (1, 17, 32)
  trees.assert_equal(params, _restore_local(local_gcs, "pretrain", tmp_path))
  assert train_state.committed_steps(pretrained) == [2]


def test_lock_create_is_atomic_on_gcs(local_gcs, monkeypatch):
  """Of threads creating the same lock object at once, exactly one wins (each round)."""
  for key, value in local_gcs.env().items():
    monkeypatch.setenv(key, value)
  for round_ in range(4):
    path = f"{ROOT}/race-{round_}/{workdir_lib.LOCK_FILE}"
    barrier, won = threading.Barrier(4), []

    def take(i, path=path, barrier=barrier, won=won):
      barrier.wait()
      if gcs.create_exclusive(path, f'{{"pid": {i}}}'):
        won.append(i)

    threads = [threading.Thread(target=take, args=(i,)) for i in range(4)]
    for t in threads:
      t.start()
    for t in threads:
      t.join()
    assert len(won) == 1, won
    assert local_gcs.download(BUCKET, f"race-{round_}/lock.json") == f'{{"pid": {won[0]}}}'.encode()


def test_an_expired_lease_is_taken_over_once_on_gcs(local_gcs, monkeypatch):
  """A foreign lock object whose lease (3 s) has run out: of threads taking it over at once,
  exactly one wins (a write conditional on the generation it read), each round; a live lease
  is refused, and renewed."""
  from vit_jax.runtime import workdir_lock

  for key, value in local_gcs.env().items():
    monkeypatch.setenv(key, value)
  foreign = json.dumps({"host": "t1v-n-old-w-0", "pid": 4242, "lease_s": 3})
  for round_ in range(2):
    workdir = f"{ROOT}/lease-{round_}"
    local_gcs.upload(BUCKET, f"lease-{round_}/{workdir_lib.LOCK_FILE}", foreign.encode())
    with pytest.raises(workdir_lib.WorkdirLocked, match="pid 4242 on t1v-n-old-w-0"):
      with workdir_lib.lock(workdir):
        pass
    time.sleep(3.5)
    barrier, outcomes = threading.Barrier(4), []

    def take(i, workdir=workdir, barrier=barrier, outcomes=outcomes):
      store = workdir_lock._store(workdir_lock.epath.Path(workdir) / workdir_lib.LOCK_FILE)
      barrier.wait()
      outcomes.append(workdir_lock._acquire(store, dict(pid=i, token=f"t{i}"), workdir, 60))

    threads = [threading.Thread(target=take, args=(i,)) for i in range(4)]
    for t in threads:
      t.start()
    for t in threads:
      t.join()
    assert sum(o is None for o in outcomes) == 1, outcomes
    held = json.loads(local_gcs.download(BUCKET, f"lease-{round_}/{workdir_lib.LOCK_FILE}"))
    assert held["token"] in {f"t{i}" for i in range(4)}
  # A live holder renews (a write conditional on its own generation): never older than its lease.
  live = f"{ROOT}/lease-live"
  with workdir_lib.lock(live, lease_s=4):
    time.sleep(3.0)  # renewed every second: the object is younger than the lock
    _, _, age = gcs.read_versioned(f"{live}/{workdir_lib.LOCK_FILE}")
    assert age < 2.5, age
    # Another VM, seen by this thread only: the live holder's renewals (another thread) stay ours.
    another = this_thread.only(lambda: "another-vm", workdir_lock.socket.gethostname)
    monkeypatch.setattr(workdir_lock.socket, "gethostname", another)
    with pytest.raises(workdir_lib.WorkdirLocked, match="lease renewed"):
      with workdir_lib.lock(live, lease_s=4):
        pass
  assert f"lease-live/{workdir_lib.LOCK_FILE}" not in local_gcs.objects(BUCKET, "lease-live")


def test_missing_client_library_is_one_line(monkeypatch):
  """A gs:// workdir without google-cloud-storage: an ImportError of one line saying what to
  install, before anything is written (main.py prints it as the run's last line)."""
  from vit_jax import stages
  from vit_jax.configs import pretrain

  monkeypatch.setitem(sys.modules, "google.cloud.storage", None)  # as if not installed
  with pytest.raises(ImportError) as raised:
    stages.run(pretrain.get_config("dataset=fashion_mnist,runlocal"), f"{ROOT}/no-client")
  message = str(raised.value)
  assert "\n" not in message and gcs.CLIENT_REQUIREMENT in message, message
  assert message.startswith(f"{ROOT}/no-client is on Google Cloud Storage"), message
  with pytest.raises(ImportError, match="needs the google-cloud-storage library"):
    train_state.Checkpointer(f"{ROOT}/no-client", 1, 1)


# ---------------------------------------------------------------------------------------------
# Slow: more runs of the entry points.

TOTAL = 8
RESUMABLE = [
  *PRETRAIN[:4],
  f"--config.total_steps={TOTAL}",
  "--config.checkpoint.every_steps=2",
  "--config.checkpoint.keep=10",
  *PRETRAIN[6:],
]


@pytest.fixture(scope="module")
def reference(env, shards):
  """An uninterrupted 8-step run on gs:// shards into a gs:// workdir."""
  workdir = f"{ROOT}/reference"
  code, last = run(env, *main_args(workdir, config=RESUMABLE))
  assert code == 0, last
  return workdir


@pytest.mark.slow
def test_rerun_and_sigkill_resume_bitwise(env, pretrained, reference, local_gcs, tmp_path):
  """SIGKILL at a random step, then the same command: the final parameters are bitwise those
  of the uninterrupted gs:// run, which are those of the same run into a local workdir."""
  local = tmp_path / "local"
  code, last = run(env, *main_args(local, config=RESUMABLE))
  assert code == 0, last
  expected = train_state.restore_params(local)
  trees.assert_equal(_restore_local(local_gcs, "reference", tmp_path), expected)

  at = random.Random().randint(2, TOTAL - 1)
  workdir = f"{ROOT}/killed-{at}"
  code, last = run(
    env, "-c", fault_injection.PROGRAM, *RESUMABLE, f"--workdir={workdir}", signal="SIGKILL", at=at
  )
  print(f"SIGKILL at batch {at}: exit {code}")
  assert code == -9, last
  prefix = workdir.removeprefix(f"{ROOT}/")
  # The lock of the killed process stays: the rerun (same host, process gone) takes it over.
  assert f"{prefix}/{workdir_lib.LOCK_FILE}" in local_gcs.objects(BUCKET, prefix)
  code, last = run(env, *main_args(workdir, config=RESUMABLE))
  assert code == 0, last
  trees.assert_equal(_restore_local(local_gcs, prefix, tmp_path), expected)

  # The rerun of the 2-step run, to 6 steps: resumes from step 2 on gs://.
  code, last = run(env, *main_args(pretrained, config=[*PRETRAIN, "--config.total_steps=6"]))
  assert code == 0, last
  assert "pretrain/checkpoints/6/commit_success.txt" in local_gcs.objects(BUCKET, "pretrain")


@pytest.mark.slow
def test_make_shards_command_writes_gcs(env, shards, local_gcs, tmp_path):
  """`tools.make_shards --out_dir=gs://...` writes the same files as a local run: the same
  dataset_info.json, and shards holding the same examples in the same order (compared parsed:
  a tf.train.Example's feature map is serialised in an order that varies between processes)."""
  import tensorflow as tf

  code, last = run(
    env, "-m", "vit_jax.tools.make_shards", "--dataset=digits", "--split=train,test",
    f"--out_dir={ROOT}/made", "--num_shards=2",
  )  # fmt: skip
  assert code == 0, last
  made = [o for o in local_gcs.objects(BUCKET, "made/") if not o.endswith("/")]
  assert sorted(o.removeprefix("made/") for o in made) == sorted(p.name for p in shards.iterdir())

  def examples(path):
    return [tf.train.Example.FromString(r) for r in tf.compat.v1.io.tf_record_iterator(str(path))]

  for name in made:
    local, copy = shards / name.removeprefix("made/"), tmp_path / name.removeprefix("made/")
    copy.write_bytes(local_gcs.download(BUCKET, name))
    if name.endswith(".json"):
      assert json.loads(copy.read_text()) == json.loads(local.read_text())
    else:
      assert examples(copy) == examples(local), name


_SEG_SHARDS_READ = """
import sys
import numpy as np
from vit_jax import input_pipeline
from tests.helpers import synthetic_data
config = lambda **kw: input_pipeline.dataset_config(name="mnist_seg", image_size=48, pp_eval="", **kw)
a = synthetic_data.split_examples(config(source="seg_shards", data_dir=sys.argv[1]), "val[:50]")
b = synthetic_data.split_examples(config(source="seg_builtin"), "val[:50]")
assert len(a[0]) == 50
for x, y in zip(a, b, strict=True):
  np.testing.assert_array_equal(x, y)
"""


@pytest.mark.slow
def test_segmentation_shards_on_gcs(env, local_gcs):
  """`make_shards --task=segmentation` into gs://, streamed back by the seg_shards source: the
  synthetic task's examples, bitwise."""
  code, last = run(
    env, "-m", "vit_jax.tools.make_shards", "--dataset=mnist_seg", "--split=val",
    f"--out_dir={ROOT}/segshards", "--num_shards=2",
  )  # fmt: skip
  assert code == 0, last
  assert "segshards/dataset_info.json" in local_gcs.objects(BUCKET, "segshards")
  code, last = run(env, "-c", _SEG_SHARDS_READ, f"{ROOT}/segshards")
  assert code == 0, last


def _image(tmp_path) -> pathlib.Path:
  from PIL import Image

  path = tmp_path / "digit.png"
  Image.fromarray(np.random.default_rng(0).integers(0, 255, (20, 20, 3), np.uint8)).save(path)
  return path


@pytest.mark.slow
def test_stages_and_tools_read_gcs_checkpoints(env, pretrained, local_gcs, tmp_path):
  """Fine-tuning from a gs:// workdir and from a gs:// .npz, the linear probe, predict and the
  analysis tool on gs:// checkpoints, each into (or read from) gs://."""
  npz = random_weights.random_npz(str(tmp_path / "testing.npz"), seed=0)
  local_gcs.upload(BUCKET, "models/ViT-testing.npz", pathlib.Path(npz).read_bytes())
  finetune = ["--config=configs/finetune.py:dataset=animal_mnist,runlocal"]
  for name, init in (("ft-workdir", pretrained), ("ft-npz", f"{ROOT}/models/ViT-testing.npz")):
    code, last = run(
      env, *main_args(f"{ROOT}/{name}", f"--config.model_init={init}", config=finetune)
    )
    assert code == 0, last
    assert f"{name}/final_metrics.json" in local_gcs.objects(BUCKET, name)
  # The run from the .npz started from its weights: its config.json names it.
  saved = json.loads(local_gcs.download(BUCKET, "ft-npz/config.json"))
  assert saved["model_init"] == f"{ROOT}/models/ViT-testing.npz"

  probe = ["--config=configs/linear_probe.py:dataset=fashion_mnist,runlocal"]
  code, last = run(
    env, *main_args(f"{ROOT}/probe", f"--config.model_init={pretrained}", config=probe)
  )
  assert code == 0, last
  results = json.loads(local_gcs.download(BUCKET, "probe/linear_probe.json"))
  assert results["model_init"] == pretrained and results["linear_probe/ridge_accuracy"] > 0

  image = _image(tmp_path)
  proc = subprocess.run(
    [sys.executable, "-m", "vit_jax.predict", f"--checkpoint={ROOT}/ft-workdir", str(image)],
    env=env, cwd=REPO, capture_output=True, text=True, timeout=600,
  )  # fmt: skip
  print(f"\n$ python -m vit_jax.predict --checkpoint={ROOT}/ft-workdir {image}")
  print(f"exit {proc.returncode}: {proc.stdout.strip().splitlines()[-1:]}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert str(image) in proc.stdout and "%" in proc.stdout

  code, last = run(
    env, "-m", "vit_jax.analysis", f"--checkpoint={pretrained}", f"--images={image}",
    f"--out={tmp_path / 'analysis'}",
  )  # fmt: skip
  assert code == 0, last
  assert (tmp_path / "analysis" / "analysis.json").exists()


_LOCKER = textwrap.dedent(
  """
  import pathlib, sys, time
  from vit_jax.runtime import workdir
  ready = pathlib.Path(sys.argv[2])
  (ready / sys.argv[3]).touch()
  while len(list(ready.iterdir())) < 2:  # both processes imported: go together
    time.sleep(0.001)
  try:
    with workdir.lock(sys.argv[1]):
      print("won", flush=True)
      time.sleep(5)
  except workdir.WorkdirLocked as e:
    print("lost:", e)
  """
)


@pytest.mark.slow
def test_two_launches_race_for_a_gcs_workdir(env, local_gcs, tmp_path):
  """Two processes taking the lock of one gs:// workdir at the same moment: exactly one wins,
  the other names it; the lock is released after."""
  for attempt in range(2):
    workdir = f"{ROOT}/race-{attempt}"
    ready = tmp_path / f"ready-{attempt}"
    ready.mkdir()
    procs = [
      subprocess.Popen(
        [sys.executable, "-c", _LOCKER, workdir, str(ready), str(i)],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
      )  # fmt: skip
      for i in range(2)
    ]
    outs = [p.communicate(timeout=300)[0].strip() for p in procs]
    print(f"race {attempt}: {outs}")
    assert sorted(o.split()[0] for o in outs) == ["lost:", "won"], outs
    assert "is in use by another run: pid" in [o for o in outs if o.startswith("lost")][0]
    assert f"race-{attempt}/lock.json" not in local_gcs.objects(BUCKET, f"race-{attempt}")


@pytest.mark.slow
def test_gcs_faults_end_in_one_line(env, local_gcs, tmp_path):
  """A bucket that does not exist, no credentials, permission denied on write: exit 1, one line."""
  code, last = run(env, *main_args("gs://no-such-bucket-here/run"))
  assert code == 1 and last.startswith("vit_jax: error: "), last
  assert "no-such-bucket-here" in last, last

  code, last = run(
    env,
    "-m",
    "vit_jax.tools.make_shards",
    "--dataset=digits",
    "--out_dir=gs://no-such-bucket-here/s",
  )
  assert code == 1 and last.startswith(
    "make_shards: error: FileNotFoundError: gs://no-such-bucket-here/s: the bucket"
  )

  # No credentials: the server's token and endpoint unset (google-cloud-storage then looks for
  # credentials as on a real machine), no credentials file, the metadata server refusing.
  home = tmp_path / "home"
  home.mkdir()
  drop = {
    "GOOGLE_AUTH_TOKEN_FOR_TESTING",
    "STORAGE_EMULATOR_HOST",
    "GOOGLE_APPLICATION_CREDENTIALS",
  }
  bare = {k: v for k, v in env.items() if k not in drop}
  bare.update(HOME=str(home), GCE_METADATA_HOST="127.0.0.1:9", GCE_METADATA_IP="127.0.0.1:9")
  code, last = run(bare, *main_args(f"{ROOT}/no-credentials"))
  assert code == 1 and last.startswith("vit_jax: error: PermissionError: "), last
  assert "no Google Cloud credentials found" in last, last
  assert "gcloud auth application-default login" in last, last

  with local_gcs.faults(lambda method, path: 403 if method in ("POST", "PUT") else None):
    code, last = run(env, *main_args(f"{ROOT}/read-only"))
  assert code == 1 and last.startswith("vit_jax: error: "), last
  assert "403" in last or "ermission" in last, last


@pytest.mark.slow
def test_transient_errors_are_retried_and_a_failing_save_keeps_the_last_step(
  env, reference, local_gcs, tmp_path
):
  """503 / 429 answers and dropped connections on every 10th request: the run finishes with the
  parameters of the undisturbed run. 403 on every write of step 6: one line naming the step,
  step 4 intact."""
  with local_gcs.faults(harness.burst([503, 429, "drop"], every=10)):
    code, last = run(env, *main_args(f"{ROOT}/flaky", config=RESUMABLE))
  faults = [r for r in local_gcs.requests if r[2] in (503, 429, "drop")]
  print(f"injected {len(faults)} faults")
  assert code == 0, last
  trees.assert_equal(
    _restore_local(local_gcs, "flaky", tmp_path), _restore_local(local_gcs, "reference", tmp_path)
  )

  def step_6_denied(method, path):
    return 403 if method in ("POST", "PUT") and "checkpoints%2F6" in path else None

  with local_gcs.faults(step_6_denied):
    code, last = run(env, *main_args(f"{ROOT}/denied", config=RESUMABLE))
  assert code == 1 and "step 6" in last, last
  denied = tmp_path / "denied"
  local_gcs.copy_to(BUCKET, "denied", denied)
  assert train_state.committed_steps(denied) == [2, 4]
  assert train_state.restore_params(denied)["head"]["kernel"].shape == (32, 10)


@pytest.mark.slow
def test_sigterm_saves_and_a_broken_step_is_moved_aside_on_gcs(env, reference, local_gcs, tmp_path):
  """SIGTERM at step 5 saves it (exit 143); with a data file of step 5 truncated on gs://, the
  rerun moves the step aside to broken_checkpoints/ and resumes from step 4, ending bitwise as
  the uninterrupted run."""
  workdir, prefix = f"{ROOT}/sigterm", "sigterm"
  code, last = run(
    env, "-c", fault_injection.PROGRAM, *RESUMABLE, f"--workdir={workdir}", signal="SIGTERM", at=5
  )
  assert code == 143, last
  assert last.startswith(f"vit_jax: stopped by SIGTERM at step 5 of {TOTAL}; saved to "), last
  objects = local_gcs.objects(BUCKET, prefix)
  assert f"{prefix}/checkpoints/5/commit_success.txt" in objects
  assert f"{prefix}/{workdir_lib.LOCK_FILE}" not in objects  # released
  data = [o for o in objects if o.startswith(f"{prefix}/checkpoints/5/state/") and "/d/" in o]
  largest = max(data, key=lambda o: len(local_gcs.download(BUCKET, o)))
  local_gcs.upload(BUCKET, largest, local_gcs.download(BUCKET, largest)[:10])
  code, last = run(env, *main_args(workdir, config=RESUMABLE))
  assert code == 0, last
  objects = local_gcs.objects(BUCKET, prefix)
  assert any(o.startswith(f"{prefix}/broken_checkpoints/5/") for o in objects)
  assert not any(o.startswith(f"{prefix}/checkpoints/5/") for o in objects)
  trees.assert_equal(
    _restore_local(local_gcs, prefix, tmp_path), _restore_local(local_gcs, "reference", tmp_path)
  )


@pytest.mark.slow
def test_transfer_suite_into_a_gcs_workdir(env, local_gcs, tmp_path):
  """The transfer command from a gs:// .npz into a gs:// workdir (one grid run, the final run,
  results.json and table.md); its rerun finds every run finished."""
  npz = random_weights.random_npz(str(tmp_path / "testing.npz"), seed=1)
  local_gcs.upload(BUCKET, "models/transfer.npz", pathlib.Path(npz).read_bytes())
  args = [
    "-m", "vit_jax.tools.transfer", f"--checkpoint={ROOT}/models/transfer.npz",
    "--suite=animal_mnist", "--grid=0.01", "--runlocal", f"--workdir={ROOT}/transfer",
    "--config_override=total_steps=3",
  ]  # fmt: skip
  code, last = run(env, *args)
  assert code == 0, last
  objects = local_gcs.objects(BUCKET, "transfer/")
  assert {"transfer/results.json", "transfer/table.md"} <= set(objects)
  assert any(o.startswith("transfer/animal_mnist/final/checkpoints/") for o in objects)
  results = json.loads(local_gcs.download(BUCKET, "transfer/results.json"))
  code, last = run(env, *args)
  assert code == 0, last
  assert json.loads(local_gcs.download(BUCKET, "transfer/results.json")) == results


# A small tfds dataset (random 16x16 images of 10 classes) prepared into the data_dir argv[1].
_PREPARE_TFDS = textwrap.dedent(
  """
  import sys
  import numpy as np
  import tensorflow_datasets as tfds

  class GcsTiny(tfds.core.GeneratorBasedBuilder):
    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
      return tfds.core.DatasetInfo(
        builder=self,
        features=tfds.features.FeaturesDict(
          {"image": tfds.features.Image(shape=(16, 16, 3)), "label": tfds.features.ClassLabel(num_classes=10)}
        ),
        supervised_keys=("image", "label"),
      )

    def _split_generators(self, dl_manager):
      return {"train": self._generate_examples(0, 80), "test": self._generate_examples(1, 40)}

    def _generate_examples(self, seed, n):
      rng = np.random.default_rng(seed)
      for i in range(n):
        yield i, {"image": rng.integers(0, 255, (16, 16, 3), np.uint8), "label": i % 10}

  builder = GcsTiny(data_dir=sys.argv[1])
  builder.download_and_prepare()
  print("prepared", builder.data_dir, builder.info.splits["train"].num_examples)
  """
)


@pytest.mark.slow
def test_tfds_dataset_prepared_and_read_on_gcs(env, local_gcs):
  """A tfds dataset prepared into data_dir=gs://... (download_and_prepare), then pretraining
  reading it from there with source='tfds' (tfds opens it from its files)."""
  data_dir = f"{ROOT}/tfds"
  code, last = run(env, "-c", _PREPARE_TFDS, data_dir)
  assert code == 0, last
  assert any(o.startswith("tfds/gcs_tiny/1.0.0/") for o in local_gcs.objects(BUCKET, "tfds/"))
  config = [
    "--config=configs/pretrain.py:dataset=fashion_mnist,runlocal",
    "--config.dataset.source=tfds",
    "--config.dataset.name=gcs_tiny",
    f"--config.dataset.data_dir={data_dir}",
    "--config.dataset.train_split=train",
    "--config.dataset.eval_split=test",
    *PRETRAIN[4:],
  ]
  code, last = run(env, *main_args(f"{ROOT}/tfds-pretrain", config=config))
  assert code == 0, last
  metrics = json.loads(local_gcs.download(BUCKET, "tfds-pretrain/final_metrics.json"))
  assert metrics["val/num_examples"] == 40
