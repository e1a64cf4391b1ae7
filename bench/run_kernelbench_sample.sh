#!/usr/bin/env bash
# Run bench/kernelbench_sample.py on a GPU host from a plain checkout, as scripts/run_gpu_tests.sh runs the tests:
# the checkout is exposed as the package `kforge` through a symlink, and the wheels the host lacks (mcp,
# pydantic, ...) come from .whl/ (../shared/gpu/fetch-wheels.sh; add einops for KernelBench's Mamba2 problems,
# level3/48-49). Needs .kb/ (bench/prepare_kernelbench.sh),
# carried beside the checkout. Arguments go to the script; results go to $OUT when set, else bench/out/.
#
#   bash bench/run_kernelbench_sample.sh --resume        # again until it prints "all problems done"
#   KB_SHARDS=4 bash bench/run_kernelbench_sample.sh     # the sample split over GPUs 0-3, one shard each, side by
#                                                        # side; then one merged table (kernelbench-sample.md)
#   bash bench/run_kernelbench_sample.sh --sweep --problems 'level3/*'   # held-out problems: verify + profile each
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
out=${OUT:-$repo/bench/out}
mkdir -p "$out" /tmp/kforge-pkg
[ -d .kb/KernelBench ] || { echo "no .kb/KernelBench here: run bash bench/prepare_kernelbench.sh and carry .kb" >&2; exit 2; }
if [ -d .whl ]; then bash .whl/install.sh && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}; fi
ln -sfn "$repo" /tmp/kforge-pkg/kforge
export PYTHONPATH=/tmp/kforge-pkg:${PYTHONPATH:-}
export PYTHONUNBUFFERED=1
shards=${KB_SHARDS:-1}
if [ "$shards" -le 1 ]; then
    python3 bench/kernelbench_sample.py --kernelbench .kb "$@" 2>&1 | tee -a "$out/kernelbench-sample.log"
    exit "${PIPESTATUS[0]}"
fi
export CUDA_DEVICE_ORDER=PCI_BUS_ID  # CUDA's numbering as nvidia-smi's (the bench polls the shard's GPU by index)
pids=()
for ((k = 0; k < shards; k++)); do
    CUDA_VISIBLE_DEVICES=$k python3 bench/kernelbench_sample.py --kernelbench .kb --shard "$k/$shards" "$@" \
        >> "$out/kernelbench-sample-shard${k}of${shards}.log" 2>&1 &  # appended: --resume runs continue it
    pids+=($!)
done
rc=0
for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
tail -n 3 "$out"/kernelbench-sample-shard*of"${shards}".log
python3 bench/kernelbench_sample.py --out "$out" --merge "$out"/kernelbench-sample-shard*of"${shards}".json
exit "$rc"
