#!/usr/bin/env bash
# Run the GPU tests on a GPU host: every tests/test_gpu_*.py, or the files (and file::test ids) given, one pytest
# each; other arguments go to each pytest (e.g. --durations=8).
#
# GPU_LANES=N (on a host of N or more GPUs) runs the single-GPU files in N lanes side by side, lane i alone on GPU i
# (CUDA_VISIBLE_DEVICES=i), the longest files spread first; the files that need several GPUs (MULTI_GPU_FILES) run
# after the lanes, with every GPU. Each lane logs to gpu-tests-lane<i>.log; gpu-tests.log is all of them in order.
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
files=() opts=()
for a in "$@"; do
    if [ -e "${a%%::*}" ]; then files+=("$a"); else opts+=("$a"); fi
done
[ ${#files[@]} -gt 0 ] || files=(tests/test_gpu_*.py)

# One pytest per test file, so that a run cut by the device tool's limit has already printed (and logged) the
# failures of every file before the one it was cut in: pytest prints a failure's text only at the end of its run.
run_files() {  # log file, then test files; prints the worst exit status
    local log=$1 rc=0 code f; shift
    : > "$log"
    for f in "$@"; do
        python3 -m pytest -p no:cacheprovider -m gpu -v "${opts[@]}" "$f" >> "$log" 2>&1
        code=$?
        [ "$code" -eq 5 ] && code=0  # no test selected in that file (a CPU host, or none marked gpu)
        [ "$code" -gt "$rc" ] && rc=$code
    done
    echo "$rc"
}

multi=(${MULTI_GPU_FILES:-tests/test_gpu_devices.py})
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
lanes=${GPU_LANES:-1}
[ "$lanes" -gt "$gpus" ] && lanes=$gpus
if [ "$lanes" -le 1 ]; then
    rc=$(run_files "$out/gpu-tests.log" "${files[@]}"); cat "$out/gpu-tests.log"
    exit "$rc"
fi
# Seconds per file on an H200 (the s23/s24 logs), to spread the longest first; a file not listed counts 60 s.
plan=$(python3 - "$lanes" "${multi[*]}" "${files[@]}" <<'PY'
import sys
lanes, multi, files = int(sys.argv[1]), set(sys.argv[2].split()), sys.argv[3:]
took = {"adversarial": 400, "cuda": 371, "analyst": 181, "ncu_sandbox": 93, "pool": 77, "warmup": 75,
        "triton": 54, "sandbox_devices": 45, "handoff": 10, "models": 5, "placement": 5}
def cost(f):
    name = f.split("::")[0].rsplit("/", 1)[-1].removeprefix("test_gpu_").removesuffix(".py")
    return took.get(name, 60)
load, lane_files = [0] * lanes, [[] for _ in range(lanes)]
for f in sorted((f for f in files if f.split("::")[0] not in multi), key=cost, reverse=True):
    i = load.index(min(load))
    load[i] += cost(f)
    lane_files[i].append(f)
print("\n".join(" ".join(fs) for fs in lane_files))
PY
)
i=0
while read -r lane_files; do
    [ -n "$lane_files" ] && echo "lane $i (GPU $i): $lane_files"
    # shellcheck disable=SC2086
    [ -n "$lane_files" ] && (CUDA_VISIBLE_DEVICES=$i run_files "$out/gpu-tests-lane$i.log" $lane_files > "$out/.rc$i") &
    i=$((i + 1))
done <<< "$plan"
wait
rc=0
: > "$out/gpu-tests.log"
for ((j = 0; j < lanes; j++)); do
    [ -f "$out/.rc$j" ] || continue
    code=$(cat "$out/.rc$j"); rm -f "$out/.rc$j"
    [ "$code" -gt "$rc" ] && rc=$code
    { echo "##### lane $j (GPU $j)"; cat "$out/gpu-tests-lane$j.log"; } >> "$out/gpu-tests.log"
done
want_multi=()
for f in "${files[@]}"; do
    for m in "${multi[@]}"; do [ "${f%%::*}" = "$m" ] && want_multi+=("$f"); done
done
if [ ${#want_multi[@]} -gt 0 ]; then
    code=$(run_files "$out/gpu-tests-multi.log" "${want_multi[@]}")
    [ "$code" -gt "$rc" ] && rc=$code
    { echo "##### every GPU"; cat "$out/gpu-tests-multi.log"; } >> "$out/gpu-tests.log"
fi
grep -E "^(#####|=+ .*(passed|failed|error).* =+$)|(PASSED|FAILED|ERROR) " "$out/gpu-tests.log"
exit "$rc"
