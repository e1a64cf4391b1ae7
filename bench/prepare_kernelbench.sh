#!/usr/bin/env bash
# Materialize KernelBench's problems and harness (its KernelBench/ and src/ folders) into .kb/ at the repo root,
# for bench/kernelbench_sample.py. .kb/ is kept out of git (.git/info/exclude): KernelBench files are never
# committed; carry .kb to a GPU host as an ignored folder.
#
# Usage: bash bench/prepare_kernelbench.sh [KERNELBENCH_GIT_DIR_OR_CHECKOUT] [REV]
#   default: the bare snapshot /work/.mirror/ScalingIntelligence+KernelBench/repo at HEAD.
set -euo pipefail
cd "$(dirname "$0")/.."
src=${1:-/work/.mirror/ScalingIntelligence+KernelBench/repo}
rev=${2:-HEAD}
[ -d "$src/.git" ] && src=$src/.git  # a normal checkout rather than a bare repository
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qxF '/.kb/' "$exclude" 2>/dev/null || echo '/.kb/' >> "$exclude"
rm -rf .kb && mkdir -p .kb
git --git-dir="$src" archive --format=tar "$rev" KernelBench src | tar -x -C .kb
git --git-dir="$src" rev-parse "$rev" > .kb/REVISION
echo "KernelBench $(cat .kb/REVISION) -> $PWD/.kb ($(du -sh .kb | cut -f1); $(ls .kb/KernelBench/level1 | wc -l) level-1 problems)"
