# Sourced by the GPU scripts (gpu_vs_timm.sh, small_data_gpu.sh), from the repository root:
# installs the wheels carried in .whl/ (e.g. ml_collections, which the lent machine's image
# lacks) into /tmp/site, puts it on PYTHONPATH, then checks that the modules named import.
#   gpu_site NAME "module, module, ..."     (exits 2 with one line naming NAME if one is missing)
gpu_site() {
  if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
  fi
  python3 -c "import $2" || {
    echo "$1: one of $2 is missing (see its header)" >&2
    exit 2
  }
}
