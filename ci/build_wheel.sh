#!/usr/bin/env bash
# Builds the wheel, checks it holds one fatbin per head dim plus the manifest, installs it into a fresh
# venv and checks that `info` lists the table there. Usage: ci/build_wheel.sh [VENV_DIR] [extra pip args]
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-/tmp/sparse-mla-venv}
shift || true
dims=${SPARSE_MLA_HEAD_DIMS:-512;576}

python3 -m venv --clear "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
rm -rf dist
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$venv/bin/python" -m pip wheel -v --no-deps -w dist "$@" . > "$log" 2>&1 || { tail -40 "$log"; exit 1; }
wheel=$(ls dist/sparse_mla_fp8-*.whl)
echo "built $wheel"
# ptxas serializes a kernel's wgmmas when it runs short of registers for them (its C7512 info): 30%
# slower in one trial (kernels/sm90/PERF-HISTORY.md, v22), and silent otherwise
if grep "wgmma.mma_async instructions are serialized" "$log"; then echo "ptxas serialized wgmmas"; exit 1; fi

listing=$("$venv/bin/python" -m zipfile -l "$wheel")
grep -q "sparse_mla_fp8/_manifest.json" <<<"$listing" || { echo "no manifest in $wheel"; exit 1; }
grep -q "sparse_mla_fp8/_C\." <<<"$listing" || { echo "no native module in $wheel"; exit 1; }
if command -v nvcc >/dev/null; then
  IFS=';' read -ra want <<<"$dims"
  for d in "${want[@]}"; do
    grep -q "sparse_mla_fp8/sparse_mla_fp8_d${d}.fatbin" <<<"$listing" || { echo "no fatbin for d_qk=$d in $wheel"; exit 1; }
  done
fi

"$venv/bin/python" -m pip install -q "$wheel"
info=$(cd / && "$venv/bin/python" -m sparse_mla_fp8 info)
echo "$info"
# the d_qk column of the table's rows (every row also prints d_v 512, so a bare grep proves nothing)
listed=$(awk '/^capability table:/ {table = 1; getline; next} table && /^ / {print $2; next} {table = 0}' <<<"$info" | sort -un)
asked=$(tr ';' '\n' <<<"$dims" | sort -un)
[ "$listed" = "$asked" ] || { echo "info lists d_qk $(echo $listed) for a build of $(echo $asked)"; exit 1; }
grep -q "JAX primitive (XLA FFI): built" <<<"$info" || { echo "the wheel has no JAX primitive (no jaxlib in the build)"; exit 1; }
echo "wheel check passed"
