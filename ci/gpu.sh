#!/usr/bin/env bash
# The GPU machine's one call: build and install (or install a wheel built elsewhere), then the GPU
# suite, the demo, the benchmark and the sanitizers. Logs go to $OUT.
# Usage: ci/gpu.sh [--wheel WHEEL] [build] [test] [frameworks] [demo] [bench] [sanitize] [floor] [accum]
#                  [stores] [cluster] [wgmma]
# (default: all but frameworks and the probes; floor: the narrow kernels' gather floor on the serving
# shapes, which needs the peers' compare.py in $PEERS, default .peers; accum: how FP8 wgmma sums, for
# precision "fast": ci/probes/fp8_accumulator.py; stores: what an item's out costs to store,
# ci/probes/out_stores.cu; cluster: a partial S's round trip between a cluster's two CTAs,
# ci/probes/cluster_exchange.cu; wgmma: the tensor cores' rate by an FP8 wgmma's N,
# ci/probes/wgmma_rate.cu).
# --wheel WHEEL: the build step installs WHEEL (e.g. the cp312-abi3 one from ci/release.sh) instead
# of building, and always runs (`ci/gpu.sh --wheel W test` installs W, then tests it). A wheel built
# with --no-build-isolation where jaxlib is missing has no JAX primitive, and the JAX tests fail on it.
# A GPU machine without a package registry gets the CuTe/CUTLASS headers from a wheel carried in .whl/
# (pip download --no-deps nvidia-cutlass==4.2.0.0 -d .whl).
set -uo pipefail
wheel=""
if [ "${1:-}" = --wheel ]; then wheel=$(realpath "$2"); shift 2; fi
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/sparse-mla-gpu}
mkdir -p "$OUT"
steps=${*:-build test demo bench sanitize}
[ -z "$wheel" ] || steps="build $steps"
export PYTHONUNBUFFERED=1
status=0
step() { case " $steps " in *" $1 "*) return 0 ;; esac; return 1; }
record() { local rc=$1 name=$2; echo "== $name: rc=$rc"; [ "$rc" = 0 ] || status=1; }

if step build; then
  if [ -n "$wheel" ]; then
    python3 -m pip install --no-index --no-deps --force-reinstall "$wheel" > "$OUT/build.log" 2>&1
    record $? "install $(basename "$wheel")"
  else
    if compgen -G ".whl/*.whl" > /dev/null; then python3 -m pip install -q --no-index --no-deps .whl/*.whl; fi
    python3 -m pip install -v --no-build-isolation --no-deps . > "$OUT/build.log" 2>&1
    record $? build
    grep -E "registers|spill|serialized" "$OUT/build.log" | sort | uniq -c
  fi
  # The matrix work must be Hopper's warpgroup MMA (QGMMA for fp8, HGMMA for fp16), not HMMA/FFMA.
  for f in $(python3 -c "import sparse_mla_fp8; print(' '.join(c['fatbin'] for c in sparse_mla_fp8.capabilities()))" | tr ' ' '\n' | sort -u); do
    echo "$(basename "$f"): $(cuobjdump --dump-sass "$f" | grep -oE '\b(QGMMA|HGMMA|HMMA|QMMA)[.A-Z0-9]*' | sort | uniq -c | tr -s ' \n' ' ')"
  done
fi
(cd / && python3 -m sparse_mla_fp8 info)
if step test; then
  # the installed package (python/ is not importable from here); the CMake tests are the CPU CI's
  python3 -m pytest -rs -m "not source_build" tests 2>&1 | tee "$OUT/tests.log" | grep -E "^sparse_mla_fp8 from|^(FAILED|ERROR|SKIPPED)|passed|failed" | tail -25
  record "${PIPESTATUS[0]}" tests
fi
if step frameworks; then  # (also in `test`) the framework operators alone, with their skip reasons
  python3 -m pytest -q -rs tests/test_frameworks.py tests/test_jax.py 2>&1 | tee "$OUT/frameworks.log" | tail -15
  record "${PIPESTATUS[0]}" frameworks
fi
if step demo; then
  (cd / && python3 -m sparse_mla_fp8 demo) 2>&1 | tee "$OUT/demo.log"
  record "${PIPESTATUS[0]}" demo
fi
if step bench; then
  (cd / && python3 -m sparse_mla_fp8 bench --json "$OUT/bench.json") 2>&1 | tee "$OUT/bench.log"
  record "${PIPESTATUS[0]}" bench
fi
if step sanitize; then
  for tool in memcheck racecheck; do
    compute-sanitizer --tool $tool --error-exitcode 9 python3 ci/sanitize_case.py > "$OUT/$tool.log" 2>&1
    record $? "compute-sanitizer $tool"
    tail -3 "$OUT/$tool.log"
  done
fi
cutlass_include() {  # the CuTe/CUTLASS headers' folder (from .whl/ if need be)
  python3 -c "import cutlass_library" 2> /dev/null || python3 -m pip install -q --no-index --no-deps .whl/*.whl
  python3 -c "import importlib.util, os; print(os.path.join(importlib.util.find_spec('cutlass_library').submodule_search_locations[0], 'source', 'include'))"
}
probe_fatbin() {  # ci/probes/$1.cu into $OUT/$1.fatbin
  nvcc -fatbin -gencode=arch=compute_90a,code=sm_90a -std=c++17 -O3 --use_fast_math --expt-relaxed-constexpr \
       -Ikernels -I"$(cutlass_include)" -o "$OUT/$1.fatbin" "ci/probes/$1.cu"
}
if step floor; then
  probe_fatbin narrow_gather &&
    python3 ci/probes/narrow_gather.py "$OUT/narrow_gather.fatbin" "${PEERS:-.peers}" 2>&1 | tee "$OUT/floor.log"
  record $? "gather floor"
fi
if step accum; then
  probe_fatbin fp8_accumulator &&
    python3 ci/probes/fp8_accumulator.py "$OUT/fp8_accumulator.fatbin" 2>&1 | tee "$OUT/accum.log"
  record $? "FP8 accumulator probe"
fi
probe_program() {  # ci/probes/$1.cu, a program of its own, built and run; its output to $OUT/$2.log
  nvcc -O3 -arch=sm_90a -std=c++17 --expt-relaxed-constexpr -I"$(cutlass_include)" -o "/tmp/$1" "ci/probes/$1.cu" &&
    "/tmp/$1" 2>&1 | tee "$OUT/$2.log"
}
if step stores; then
  probe_program out_stores stores
  record $? "out stores probe"
fi
if step cluster; then
  probe_program cluster_exchange cluster
  record $? "cluster exchange probe"
fi
if step wgmma; then
  probe_program wgmma_rate wgmma
  record $? "wgmma rate probe"
fi
exit $status
