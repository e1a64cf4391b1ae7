#!/usr/bin/env bash
# Run the GPU tests on a GPU host: every tests/test_gpu_*.py, or the files (and file::test ids) given, one pytest
# each; other arguments go to each pytest (e.g. --durations=8).
#
# Works from a plain checkout without installing: the checkout is exposed as the package `kforge`
# through a symlink, and wheels the host lacks (mcp, pydantic-settings, ...) come from .whl/
# (made here with ../shared/gpu/fetch-wheels.sh platformdirs ninja pyseccomp pytest pytest-timeout). Writes results under $OUT
# when set (the device tool's output folder), else under bench/out/.
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
out=${OUT:-$repo/bench/out}
mkdir -p "$out" /tmp/kforge-pkg
if [ -d .whl ]; then bash .whl/install.sh && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}; fi
ln -sfn "$repo" /tmp/kforge-pkg/kforge
export PYTHONPATH=/tmp/kforge-pkg:${PYTHONPATH:-}
export PYTHONUNBUFFERED=1
python3 -c "import torch, kforge; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
python3 -m kforge.server.cli doctor | tee "$out/doctor.txt"
# One pytest per test file, so that a run cut by the device tool's limit has already printed (and logged) the
# failures of every file before the one it was cut in: pytest prints a failure's text only at the end of its run.
files=() opts=()
for a in "$@"; do
    if [ -e "${a%%::*}" ]; then files+=("$a"); else opts+=("$a"); fi
done
[ ${#files[@]} -gt 0 ] || files=(tests/test_gpu_*.py)
: > "$out/gpu-tests.log"
rc=0
for f in "${files[@]}"; do
    python3 -m pytest -p no:cacheprovider -m gpu -v "${opts[@]}" "$f" 2>&1 | tee -a "$out/gpu-tests.log"
    code=${PIPESTATUS[0]}
    [ "$code" -eq 5 ] && code=0  # no test selected in that file (a CPU host, or none marked gpu)
    [ "$code" -gt "$rc" ] && rc=$code
done
exit "$rc"
