"""Where a judge's first torch.compile spends its time (issue 16, must-hold 4): a KernelBench-like model compiled
in a fresh process, cold, against the same after the process compiled a tiny function first (what a worker could pay
before its job). Each variant runs in its own process with its own empty Inductor cache, as a KForge judge does.

    python3 bench/explore/compile_first_use.py   # on a GPU host; prints a table
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

MODELS = {
    "conv2d (level1/63-like)": "torch.nn.Conv2d(16, 128, 3)",
    "conv2d+tanh+softplus+bn (level2/52-like)": "Fused()",
    "matmul (level1/4-like)": "Mm()",
}

CHILD = r'''
import json, sys, time
t0 = time.perf_counter()
import torch, torch._dynamo, torch._inductor.compile_fx
class Fused(torch.nn.Module):
    def __init__(self):
        super().__init__(); self.conv = torch.nn.Conv2d(64, 128, 3); self.bn = torch.nn.BatchNorm2d(128)
    def forward(self, x):
        x = self.conv(x); return self.bn(torch.multiply(torch.tanh(torch.nn.functional.softplus(x)), x))
class Mm(torch.nn.Module):
    def forward(self, a, b): return torch.matmul(a, b)
imported = time.perf_counter() - t0
torch.ones(1, device="cuda").sum().item()
warm_s = None
if sys.argv[2] == "warm":
    t = time.perf_counter()
    torch.compile(lambda x: torch.relu(x) + 1)(torch.ones(256, device="cuda")); torch.cuda.synchronize()
    warm_s = time.perf_counter() - t
model = eval(sys.argv[1]).cuda()
args = ([torch.randn(8, 16 if "Conv2d(16" in sys.argv[1] else 64, 256, 256, device="cuda")] if "Mm" not in sys.argv[1]
        else [torch.randn(2048, 4096, device="cuda"), torch.randn(4096, 1, device="cuda")])
t = time.perf_counter()
with torch.no_grad():
    torch.compile(model)(*args)
torch.cuda.synchronize()
first = time.perf_counter() - t
t = time.perf_counter()
with torch.no_grad():
    torch.compile(model)(*[a + 0 for a in args])  # a second torch.compile of it in this process (Dynamo's cache)
torch.cuda.synchronize()
print(json.dumps({"import_s": imported, "warm_s": warm_s, "first_compile_s": first,
                  "again_s": time.perf_counter() - t}))
'''


def run(model: str, mode: str) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "TRITON_CACHE_DIR": os.path.join(cache, "triton")}
        out = subprocess.run([sys.executable, "-c", CHILD, model, mode], env=env, capture_output=True, text=True,
                             timeout=300)
        if out.returncode:
            return {"error": out.stderr[-400:]}
        return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    print("| model | mode | import s | tiny compile first s | model's first compile+call s |")
    print("|---|---|---|---|---|")
    for name, expr in MODELS.items():
        for mode in ("cold", "warm", "cold", "warm"):
            r = run(expr, mode)
            if "error" in r:
                print(f"| {name} | {mode} | error: {r['error']!r} |||")
                continue
            ws = f"{r['warm_s']:.2f}" if r["warm_s"] is not None else "-"
            print(f"| {name} | {mode} | {r['import_s']:.2f} | {ws} | {r['first_compile_s']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
