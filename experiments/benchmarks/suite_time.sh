#!/usr/bin/env bash
# The README's test command from a fresh clone of this checkout's HEAD, timed: what the README
# states as the suite's time. Run it on a quiet machine (nothing else running); it appends one
# record (commit, date, CPU, load averages before, the install's and the suite's wall times,
# pytest's closing line and its failures) to experiments/results/suite_time/runs.log; the whole
# output is kept as /tmp/vit_jax_suite_<time>.log.
#
#   bash experiments/benchmarks/suite_time.sh [runs]      # runs: how many fresh clones, one after another
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
log="$repo/experiments/results/suite_time/runs.log"
mkdir -p "$(dirname "$log")"
runs="${1:-1}"
for i in $(seq 1 "$runs"); do
  dir="$(mktemp -d /tmp/vit_jax_clone.XXXXXX)"
  git clone -q "$repo" "$dir/vit_jax"
  cd "$dir/vit_jax"
  load="$(cut -d' ' -f1-3 /proc/loadavg)"
  start=$(date +%s)
  ./install.sh --test >"$dir/install.log" 2>&1
  installed=$(date +%s)
  set +e
  .venv/bin/python -m pytest -n 2 >"$dir/pytest.log" 2>&1
  status=$?
  set -e
  end=$(date +%s)
  {
    echo "commit $(git rev-parse HEAD) date $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "  cpu $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores, avx512f: $(grep -qw avx512f /proc/cpuinfo && echo yes || echo no), load before $load"
    echo "  install $((installed - start)) s, suite $((end - installed)) s, exit $status: $(tail -n 1 "$dir/pytest.log")"
    grep -E '^(FAILED|ERROR) ' "$dir/pytest.log" | sed 's/^/  /' || true
  } | tee -a "$log"
  cd "$repo"
  cp "$dir/pytest.log" "/tmp/vit_jax_suite_$(date +%s).log"  # the whole output, for a failure
  rm -rf "$dir"
done
