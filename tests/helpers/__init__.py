"""What the tests share, apart from the tests themselves (imported as `tests.helpers.<name>`).

compiled_step           the trainer's step compiled for a set of devices (planner references)
doc_commands            the commands of README.md and docs/, as tests/test_docs.py runs them
doc_figures             the measured figures of README.md and docs/ and what backs each one
experiment_run          an experiment's command run as a user runs it (its --quick fingerprint)
fault_injection         `python -m vit_jax.main` with a fault injected at a chosen point
float64_reference       float64 runs of the trainer, what float32 runs are measured against
gcs                     a Google Cloud Storage API on loopback (also `python -m tests.helpers.gcs`)
invariance_config       the pretraining run of the topology tests, by name for the entry point
libtpu_process          running the tests that compile with libtpu, one process at a time
local_cluster           N local JAX processes meeting at a coordinator on 127.0.0.1
numpy_vit               an independent float64 numpy forward pass of the ViT and the hybrid
random_weights          random weights in the published layout
small_disk              a small tmpfs disk, as any user, for the full-disk tests
synthetic_data          small synthetic datasets: id-labelled records, image folders, a split read back
this_thread             a patched process-wide function that only the test's own thread sees
timm_vit_jax_constants  timm's R50 hybrid made to compute vit_jax's stem (slow timm tests)
trees                   trees compared leaf by leaf, and two workdirs' parameters
xla_env                 XLA_FLAGS for the test processes and their children

`REPO`: the checkout's root, which every test that reads its files or runs its commands uses.
"""

import pathlib

REPO = pathlib.Path(__file__).resolve().parents[2]
