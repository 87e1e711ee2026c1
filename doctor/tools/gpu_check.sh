#!/usr/bin/env bash
# The GPU check's two halves (doctor/tools/gpu_check.py; docs/doctor.md, "JAX"):
#   doctor/tools/gpu_check.sh prepare   here, with the registry: the doctor's wheel, and Keras's with the needs
#                                       the GPU image lacks (namex, optree), for Python 3.12 on x86-64, into .whl/
#                                       (about 3 MB: xprof is not needed, a JAX-made profile is read from its trace)
#   doctor/tools/gpu_check.sh run OUT   on the GPU host (nothing to fetch there): installs .whl/ beside the
#                                       machine's own JAX and runs the check into OUT
set -euo pipefail
cd "$(dirname "$0")/../.."
case "${1:-}" in
prepare)
    rm -rf .whl && mkdir -p .whl
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
    source=$(mktemp -d)  # pip builds in the folder it builds from: a copy keeps the checkout clean
    cp -r doctor "$source/doctor" && rm -rf "$source/doctor/tests" "$source/doctor/build"
    python3 -m pip wheel -q --no-deps -w .whl "$source/doctor"
    rm -rf "$source"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d .whl -c constraints.txt keras namex optree
    du -sh .whl
    ;;
run)
    out="${2:?name the output folder}"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
    python3 doctor/tools/gpu_check.py --out "$out"
    ;;
*)
    echo "usage: $0 prepare | run OUT" >&2
    exit 2
    ;;
esac
