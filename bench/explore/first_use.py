"""Which first uses does a warm worker still pay inside a job? (issue 16: verify's calibrate and profile's first
check took 0.27-0.45 s on GEMM problems where later calls took 0.01-0.06 s.)

Each step runs in a fresh process forked from a parent that preloaded what the pool's zygote preloads, readied
as the pool readies a forked worker (`_warm_device`, and in the second column also `_warm_libraries`), then
runs the step twice: the first time pays what is still cold, the second is the step's own cost. Printed as a
table and as JSON. Run on a GPU host with the checkout importable as `kforge` (as scripts/run_gpu_tests.sh
arranges): python3 bench/explore/first_use.py
"""

from __future__ import annotations

import copy
import json
import multiprocessing as mp
import time

N = 4096  # level1/1's size: KernelBench's square matmul


def _setup(libraries: bool):
    import torch

    from kforge.backends import load_backend
    from kforge.tools.harness.worker import _warm_device, _warm_libraries

    backend = load_backend("cuda")
    backend.setup()
    _warm_device(backend)
    if libraries:
        _warm_libraries(backend)
    return torch, backend


def compare_fp32(torch, backend):
    from kforge.tools.harness.compare import compare_outputs

    e = torch.randn(N, N, device="cuda")
    g = e + 1e-6
    compare_outputs([e], [g], exact=[e.double()], device="cuda")


def compare_no_exact(torch, backend):
    from kforge.tools.harness.compare import compare_outputs

    e = torch.randn(N, N, device="cuda")
    compare_outputs([e], [e.clone()], device="cuda")


def linear_bf16(torch, backend):
    m = torch.nn.Linear(N, N, device="cuda")
    b = copy.deepcopy(m).to(torch.bfloat16)
    with torch.no_grad():
        b(torch.randn(N, N, device="cuda", dtype=torch.bfloat16))
    torch.cuda.synchronize()


def matmul_fp64(torch, backend):
    a = torch.randn(N, N, device="cuda", dtype=torch.float64)
    (a @ a).sum().item()


def matmul_fp32(torch, backend):
    a = torch.randn(N, N, device="cuda")
    (a @ a).sum().item()


def conv2d_fp32(torch, backend):
    x = torch.randn(16, 64, 64, 64, device="cuda")
    w = torch.randn(64, 64, 3, 3, device="cuda")
    torch.nn.functional.conv2d(x, w).sum().item()


def mean64(torch, backend):
    from kforge.tools.harness.judge import _mean64

    _mean64(torch.randn(N, N, device="cuda"))


def flop_count_meta(torch, backend):
    from torch.utils.flop_counter import FlopCounterMode

    m = torch.nn.Linear(N, N, device="meta")
    with FlopCounterMode(display=False) as fc:
        m(torch.empty(N, N, device="meta"))
    fc.get_total_flops()


def build_linear(torch, backend):
    """A KernelBench GEMM layer built on the device from a seed, as `inputs.build_model` does (uniform_ init)."""
    torch.manual_seed(0)
    with torch.device("cuda"):
        torch.nn.Linear(8192, 8192)


def seeded_randn(torch, backend):
    """Inputs made on the device from a seed, as `inputs.seeded_inputs` does."""
    torch.manual_seed(0)
    with torch.device("cuda"):
        torch.randn(1024, 8192)
        torch.rand(1024, 8192)


def gemm_max_sub_gelu(torch, backend):
    """level2/80's forward at its published size (fp32, TF32 off as in the judge)."""
    w = torch.randn(8192, 8192, device="cuda")
    x = torch.randn(1024, 8192, device="cuda")
    y = torch.nn.functional.linear(x, w)
    y = torch.max(y, dim=1, keepdim=True).values
    torch.nn.functional.gelu(y - y.mean(dim=1, keepdim=True))


def elementwise_reductions(torch, backend):
    """Common elementwise ops and reductions on a large tensor (their kernels load lazily, one by one)."""
    x = torch.randn(1 << 22, device="cuda")
    for y in (torch.relu(x), torch.nn.functional.gelu(x), torch.sigmoid(x), torch.tanh(x), x * 2 + 1, x.exp()):
        y.sum(), y.amax(), y.mean()


def digest(torch, backend):
    """The judge's first output digest (`check` of the first trial)."""
    from kforge.tools.harness.output_contract import digest_weights, value_digest

    value_digest(torch.randn(N, N, device="cuda"), digest_weights("cuda"))


def repeat_identical(torch, backend):
    """The judge's first check of a repeat: bitwise the first run's outputs (`same_values`), then the release of the
    memory it held (the first check's `repeat_and_release` took 0.06-0.11 s on a fresh server, 0.01 s after)."""
    from kforge.tools.harness.handoff import return_free_memory
    from kforge.tools.harness.output_contract import same_values

    e = torch.randn(N, N, device="cuda")
    same_values(e, e.clone())
    del e
    return_free_memory(backend)


STEPS = [digest, repeat_identical, compare_fp32, compare_no_exact, linear_bf16, matmul_fp64, matmul_fp32, conv2d_fp32, mean64, flop_count_meta,
         build_linear, seeded_randn, gemm_max_sub_gelu, elementwise_reductions]


def _run(name: str, libraries: bool, q) -> None:
    t0 = time.perf_counter()
    torch, backend = _setup(libraries)
    ready = time.perf_counter() - t0
    step = {s.__name__: s for s in STEPS}[name]
    times = []
    for _ in range(2):
        t = time.perf_counter()
        step(torch, backend)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    q.put({"step": name, "libraries_warmed": libraries, "ready_s": round(ready, 3), "first_s": round(times[0], 4), "second_s": round(times[1], 4)})


def _ops(torch):
    """Ops of KernelBench's level-1/2 problems at a size of theirs, each a callable (first uses one by one)."""
    f = torch.nn.functional
    x = torch.randn(1024, 8192, device="cuda")
    w = torch.randn(8192, 8192, device="cuda")
    a = torch.randn(4096, 4096, device="cuda")
    b3 = torch.randn(16, 512, 512, device="cuda")
    img = torch.randn(16, 64, 128, 128, device="cuda")
    return {
        "linear 1024x8192x8192": lambda: f.linear(x, w), "matmul 4096^2": lambda: a @ a,
        "bmm 16x512^3": lambda: torch.bmm(b3, b3), "relu": lambda: f.relu(x), "gelu": lambda: f.gelu(x),
        "sigmoid": lambda: torch.sigmoid(x), "tanh": lambda: torch.tanh(x), "softmax": lambda: f.softmax(x, -1),
        "log_softmax": lambda: f.log_softmax(x, -1), "layer_norm": lambda: f.layer_norm(x, x.shape[-1:]),
        "sum dim 1": lambda: x.sum(1), "mean dim 1": lambda: x.mean(1), "max dim 1": lambda: torch.max(x, 1).values,
        "argmax dim 1": lambda: x.argmax(1), "sum dim 0": lambda: x.sum(0), "cumsum": lambda: x.cumsum(1),
        "batch_norm 2d": lambda: f.batch_norm(img, None, None, training=True),
        "group_norm": lambda: f.group_norm(img, 8), "max_pool2d": lambda: f.max_pool2d(img, 2),
        "avg_pool2d": lambda: f.avg_pool2d(img, 2), "conv2d 3x3": lambda: f.conv2d(img, img[:64, :, :3, :3]),
        "hardtanh": lambda: f.hardtanh(x), "swish": lambda: x * torch.sigmoid(x), "clamp": lambda: x.clamp(-1, 1),
    }


def _run_ops(libraries: bool, q) -> None:
    torch, backend = _setup(libraries)
    rows = {}
    for name, op in _ops(torch).items():
        times = []
        for _ in range(2):
            t = time.perf_counter()
            op()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
        rows[name] = (round(times[0], 4), round(times[1], 4))
    q.put({"libraries_warmed": libraries, "ops": rows})


def main() -> None:
    import os

    from kforge.tools.harness.worker import _fork_server_env, _preload

    guard = _fork_server_env("cuda")
    os.environ.update(guard)  # as the zygote: asking whether CUDA exists must not start it
    _preload("cuda")
    for name in guard:
        os.environ.pop(name)
    ctx = mp.get_context("fork")
    rows = []
    for libraries in (False, True):
        for s in STEPS:
            q = ctx.Queue()
            p = ctx.Process(target=_run, args=(s.__name__, libraries, q))
            p.start()
            rows.append(q.get(timeout=300))
            p.join()
    print("| step | warmed | ready s | first use s | again s | first - again s |\n|---|---|---|---|---|---|")
    for r in rows:
        warmed = "device + libraries" if r["libraries_warmed"] else "device"
        print(f"| {r['step']} | {warmed} | {r['ready_s']} | {r['first_s']} | {r['second_s']} | "
              f"{r['first_s'] - r['second_s']:.3f} |")
    print(json.dumps(rows))
    by_op = []
    for libraries in (False, True):  # each op's first use, one process a mode, ops in a row
        q = ctx.Queue()
        p = ctx.Process(target=_run_ops, args=(libraries, q))
        p.start()
        by_op.append(q.get(timeout=300))
        p.join()
    print("\n| op | first - again ms (device) | first - again ms (device + libraries) |\n|---|---|---|")
    for name in by_op[0]["ops"]:
        cells = [f"{1e3 * (r['ops'][name][0] - r['ops'][name][1]):.1f}" for r in by_op]
        print(f"| {name} | {cells[0]} | {cells[1]} |")
    print(json.dumps(by_op))


if __name__ == "__main__":
    main()
