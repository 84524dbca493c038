#!/usr/bin/env bash
# Gather into DIR the pure-Python wheels that a GPU image with torch + transformers (and numpy, pandas, matplotlib,
# tqdm, pyyaml, packaging, scipy, scikit-learn) lacks for a run of the harness: the core's hydra-core, omegaconf and
# antlr4-python3-runtime 4.9.3 (PyPI has only an sdist of 4.9.3, so it is built here into a wheel), and two
# optional extras whose own dependencies such an image has: gguf (the main job's GGUF model) and
# bayesian-optimization (SWIFT's search). Run it on a machine with network; on the GPU node, with no network:
#
#   pip install --no-index --no-deps --target SITE DIR/*.whl
#   PYTHONPATH=.:SITE python -m fafo.bench.gpu_check --out OUT
#
# Usage: scripts/gpu_wheels.sh DIR [REQUIREMENT ...]   (more pure-Python packages; every wheel must be
# py3-none-any). Versions come from constraints.txt; PYTHON picks the interpreter whose pip builds (default: the
# project's .venv, else python3; `pip wheel` is allowed on a system Python that refuses installs).
set -euo pipefail

if [ $# -lt 1 ] || [ "${1:0:1}" = "-" ]; then
  echo "usage: $0 DIR [REQUIREMENT ...]" >&2
  exit 2
fi
dir=$1
shift
root="$(cd "$(dirname "$0")/.." && pwd)"
if [ -z "${PYTHON:-}" ]; then
  if [ -x "$root/.venv/bin/python" ]; then PYTHON="$root/.venv/bin/python"; else PYTHON=python3; fi
fi
if ! "$PYTHON" -m pip --version >/dev/null 2>&1; then
  echo "error: $PYTHON has no pip; set PYTHON to an interpreter with pip (or run make install first)" >&2
  exit 2
fi
wanted=(hydra-core omegaconf antlr4-python3-runtime gguf bayesian-optimization "$@")
limit=$((5 * 1024 * 1024))

mkdir -p "$dir"
for name in "${wanted[@]}"; do  # an older version of one of these left in DIR would be installed beside the new one
  stem=$(printf '%s' "$name" | sed -E 's/[<>=!~;[ ].*//; s/[-.]+/_/g')
  find "$dir" -maxdepth 1 -iname "${stem}-*.whl" -delete
done
"$PYTHON" -m pip wheel -q --no-deps -c "$root/constraints.txt" -w "$dir" "${wanted[@]}"

status=0
total=0
for whl in "$dir"/*.whl; do
  case "$(basename "$whl")" in
    *-py3-none-any.whl | *-py2.py3-none-any.whl) ;;
    *) echo "error: $(basename "$whl") is not a pure-Python (py3-none-any) wheel; it would not install on" \
            "another Python or platform" >&2; status=1 ;;
  esac
  total=$((total + $(wc -c < "$whl")))
done
(cd "$dir" && ls -l -- *.whl | awk '{printf "%9d  %s\n", $5, $NF}')
echo "$(ls "$dir"/*.whl | wc -l) wheels, $total bytes ($(awk -v b="$total" 'BEGIN{printf "%.2f", b/1048576}') MiB) in $dir"
if [ "$total" -ge "$limit" ]; then
  echo "error: the wheel folder is over 5 MiB" >&2
  status=1
fi
exit "$status"
