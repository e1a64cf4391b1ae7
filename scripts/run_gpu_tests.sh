#!/usr/bin/env bash
# Run the GPU tests (and the rest of the suite) on a GPU host.
#
# Works from a plain checkout without installing: the checkout is exposed as the package `kforge`
# through a symlink, and wheels the host lacks (mcp, pydantic-settings, ...) come from .whl/
# (made here with ../shared/gpu/fetch-wheels.sh platformdirs ninja). Writes results under $OUT
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
python3 -m pytest -p no:cacheprovider -m gpu -v "$@" 2>&1 | tee "$out/gpu-tests.log"
exit "${PIPESTATUS[0]}"
