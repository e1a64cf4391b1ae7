"""Does a torch.compile in a process make that process's later eager timings noisy? (issue 16, session 18)

tests/test_gpu_pool.py's kept-candidate profile failed 4 of 4 on a 16-core H200 host: the judge's eager ReLU
(1024x1024 fp32, ~6 us) had an IQR up to 13.9 us and its torch.compile series 28-176 us, while the candidate's own
series, timed in another process, stayed within 6.0-7.5 us. This times the same ReLU as KForge does (an L2 flush, then
device events around one call), 400 calls, before and after compiling it in the same process, and counts threads.

    python3 bench/explore/judge_noise.py
"""
import os
import statistics
import threading
import time

import torch


def series(fn, x, n=400):
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    out = []
    for _ in range(n):
        flush.zero_()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn(x)
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e3)
    q = statistics.quantiles(out, n=4)
    return f"median {statistics.median(out):.2f} us, IQR {q[0]:.2f}-{q[2]:.2f}"


def threads():
    return f"{len(os.listdir('/proc/self/task'))} tasks, python threads {[t.name for t in threading.enumerate()]}"


torch.set_num_threads(4)
x = torch.randn(1024, 1024, device="cuda")
model = torch.nn.ReLU()
with torch.no_grad():
    series(model, x, 50)
    print("eager before compile:", series(model, x), "|", threads(), flush=True)
    compiled = torch.compile(model)
    t = time.perf_counter()
    compiled(x)
    torch.cuda.synchronize()
    print(f"compile {time.perf_counter() - t:.2f} s |", threads(), flush=True)
    print("compiled:", series(compiled, x), flush=True)
    print("eager after compile:", series(model, x), "|", threads(), flush=True)
    time.sleep(2)
    print("eager after 2 s idle:", series(model, x), flush=True)
    print("compiled after 2 s idle:", series(compiled, x), flush=True)
