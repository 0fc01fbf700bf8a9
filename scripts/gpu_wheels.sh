#!/usr/bin/env bash
# The wheels scripts/gpu_smoke.sh needs on an offline GPU machine that has python3.12 with CUDA torch, transformers,
# peft, accelerate, numpy, sympy, pyyaml, safetensors, tokenizers, msgpack, ninja, py-cpuinfo, nvidia-ml-py and einops
# but none of the packages below (versions: those of the CPU environment the tests run in). Run in the repository
# root with a python that has torch (DeepSpeed's source distribution needs it to build): PY=.venv/bin/python.
# It fills .whl/ (git-ignored through the repository's info/exclude), prints its size (the tree that travels to a lent
# GPU may hold 64 MiB in all) and the line that installs the wheels there; gpu_smoke.sh runs that line itself.
# DeepSpeed is built with no pre-compiled ops (its accelerator is found at run time: CUDA there). bitsandbytes keeps
# only its CPU and CUDA 13.0/13.2 libraries (the full wheel is about 41 MiB).
# Usage: scripts/gpu_wheels.sh [extra==version ...]
set -euo pipefail
PY=${PY:-.venv/bin/python}
PYV=${PYV:-3.12}   # the GPU machine's python
exclude="$(git rev-parse --git-common-dir)/info/exclude"
grep -qx '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >> "$exclude"
mkdir -p .whl
PKGS=(hydra-core==1.3.8 omegaconf==2.3.1 antlr4-python3-runtime==4.9.3 pydantic==2.14.4 pydantic-core==2.50.5
      annotated-types==0.8.0 typing-inspection==0.4.5 math-verify==0.9.0 latex2sympy2_extended==1.11.0 hjson==3.1.0 "$@")
PLAT=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64 any; do
  PLAT+=(--platform "$p")
done
get() { python3 -m pip download -q --no-deps --python-version "$PYV" --implementation cp "${PLAT[@]}" "$@"; }
for p in "${PKGS[@]}"; do
  get --only-binary=:all: -d .whl "$p" 2>/dev/null || get -d .whl "$p" || { echo "could not fetch $p" >&2; exit 1; }
done
for sd in .whl/*.tar.gz; do  # a source distribution (antlr4's runtime) cannot be built there without an index
  [ -e "$sd" ] || continue
  python3 -m pip wheel -q --no-deps -w .whl "$sd" && rm -f "$sd"
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! ls .whl/deepspeed-0.19.8-*.whl >/dev/null 2>&1; then  # DeepSpeed 0.19.8: a source distribution only
  python3 -m pip download -q --no-deps --no-binary :all: -d "$tmp" deepspeed==0.19.8
  DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps --no-build-isolation -w .whl "$tmp"/deepspeed-0.19.8.tar.gz
fi
if ! ls .whl/bitsandbytes-0.50.2-*.whl >/dev/null 2>&1; then
  get --only-binary=:all: -d "$tmp" bitsandbytes==0.50.2
  python3 - "$tmp" <<'PYCUT'
import glob, sys, zipfile
src = glob.glob(sys.argv[1] + "/bitsandbytes-*.whl")[0]
keep = ("libbitsandbytes_cpu.so", "libbitsandbytes_cuda130.so", "libbitsandbytes_cuda132.so")
with zipfile.ZipFile(src) as zi, zipfile.ZipFile(".whl/" + src.rsplit("/", 1)[1], "w", zipfile.ZIP_DEFLATED) as zo:
    drop = {n for n in zi.namelist() if n.endswith(".so") and not n.endswith(keep)}
    for n in zi.namelist():
        if n in drop:
            continue
        data = zi.read(n)
        if n.endswith(".dist-info/RECORD"):
            data = "\n".join(r for r in data.decode().splitlines() if r.split(",")[0] not in drop).encode() + b"\n"
        zo.writestr(zi.getinfo(n), data)
PYCUT
fi
echo "$(du -sb .whl | cut -f1) bytes in .whl ($(ls .whl/*.whl | wc -l) wheels); the limit for what travels: 67108864"
echo 'install line there (scripts/gpu_smoke.sh runs it):'
echo 'python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .whl/site .whl/*.whl'
