"""Exploration: where load_inline's time goes and what the leads buy (fresh process per variant)."""
import json, os, subprocess, sys, tempfile, textwrap, time
from pathlib import Path

KB_CU = r'''
#include <torch/extension.h>
#include <cuda_runtime.h>
__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { float v = x[i]; y[i] = v > 0.f ? v : 0.f; }
}
torch::Tensor relu_cuda(torch::Tensor x) {
    auto out = torch::empty_like(x);
    int n = x.numel();
    relu_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}
'''
KB_CPP = "torch::Tensor relu_cuda(torch::Tensor x);"
SPLIT_CU = r'''
#include <cuda_runtime.h>
__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { float v = x[i]; y[i] = v > 0.f ? v : 0.f; }
}
void relu_launch(const float* x, float* y, int n, cudaStream_t s) { relu_kernel<<<(n + 255) / 256, 256, 0, s>>>(x, y, n); }
'''
SPLIT_CPP = r'''
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
void relu_launch(const float* x, float* y, int n, cudaStream_t s);
torch::Tensor relu_cuda(torch::Tensor x) {
    auto out = torch::empty_like(x);
    relu_launch(x.data_ptr<float>(), out.data_ptr<float>(), x.numel(), c10::cuda::getCurrentCUDAStream());
    return out;
}
'''
NVRTC_K = r'''
extern "C" __global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { float v = x[i]; y[i] = v > 0.f ? v : 0.f; }
}
'''
CPU_CPP = r'''
#include <torch/extension.h>
torch::Tensor relu_cpu(torch::Tensor x) {
    auto out = torch::empty_like(x);
    auto* a = x.data_ptr<float>(); auto* b = out.data_ptr<float>();
    int64_t n = x.numel();
    #pragma omp parallel for
    for (int64_t i = 0; i < n; ++i) b[i] = a[i] > 0.f ? a[i] : 0.f;
    return out;
}
'''

def child(kind, tag, ext_dir, extra):
    code = textwrap.dedent(f"""
    import time, json, os, sys
    t0 = time.perf_counter()
    import torch
    t_import = time.perf_counter() - t0
    from torch.utils.cpp_extension import load_inline
    kind, tag, extra = {kind!r}, {tag!r}, {extra!r}
    out = {{}}
    if kind.startswith('cuda') or kind == 'nvrtc':
        t = time.perf_counter(); torch.empty(1, device='cuda'); torch.cuda.synchronize(); out['cuda_init_s'] = time.perf_counter() - t
    t1 = time.perf_counter()
    x = None
    if kind == 'cuda_kb':
        cu = {KB_CU!r}.replace('<torch/extension.h>', extra.get('cu_header', '<torch/extension.h>')) + '// ' + tag
        m = load_inline(name='r_' + tag, cpp_sources={KB_CPP!r}, cuda_sources=cu, functions=['relu_cuda'],
                        use_pch=extra.get('pch', False), extra_cuda_cflags=extra.get('cuflags', []))
        x = torch.randn(1 << 20, device='cuda'); y = m.relu_cuda(x)
    elif kind == 'cuda_split':
        m = load_inline(name='s_' + tag, cpp_sources={SPLIT_CPP!r} + '// ' + tag, cuda_sources={SPLIT_CU!r} + '// ' + tag,
                        functions=['relu_cuda'], use_pch=extra.get('pch', False), no_implicit_headers=extra.get('nih', False))
        x = torch.randn(1 << 20, device='cuda'); y = m.relu_cuda(x)
    elif kind == 'nvrtc':
        k = torch.cuda._compile_kernel({NVRTC_K!r} + '// ' + tag, 'relu_kernel')
        out['compile_only_s'] = time.perf_counter() - t1
        x = torch.randn(1 << 20, device='cuda'); y = torch.empty_like(x)
        k(grid=((x.numel() + 255) // 256, 1, 1), block=(256, 1, 1), args=[x, y, x.numel()])
    elif kind == 'cpu':
        m = load_inline(name='c_' + tag, cpp_sources={CPU_CPP!r} + '// ' + tag, functions=['relu_cpu'],
                        extra_cflags=['-O3', '-fopenmp'], extra_ldflags=['-fopenmp'], use_pch=extra.get('pch', False))
        x = torch.randn(1 << 20); y = m.relu_cpu(x)
    if x is not None:
        if x.is_cuda: torch.cuda.synchronize()
        out['correct'] = bool(torch.equal(y, torch.relu(x)))
    out['build_s'] = time.perf_counter() - t1
    out['import_torch_s'] = t_import
    print('RESULT ' + json.dumps(out))
    """)
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": ext_dir}
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t
    line = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
    res = json.loads(line[0][7:]) if line else {"error": (p.stderr or p.stdout)[-1500:]}
    res["process_s"] = wall
    # ninja's own per-target times
    logs = list(Path(ext_dir).glob("*/.ninja_log"))
    for lg in logs:
        for row in lg.read_text().splitlines()[1:]:
            parts = row.split("\t")
            if len(parts) >= 4 and tag in str(lg.parent):
                res.setdefault("ninja", {})[parts[3]] = (int(parts[1]) - int(parts[0])) / 1000
    return res

def main():
    which = sys.argv[1]
    out = {}
    base = Path(tempfile.mkdtemp(prefix="kfx-"))
    runs = []
    if which == "cuda":
        runs = [("cuda_kb", "plain1", {}), ("cuda_kb", "plain2", {}),
                ("cuda_kb", "types", {"cu_header": "<torch/types.h>"}),
                ("cuda_kb", "aten", {"cu_header": "<ATen/ATen.h>"}),
                ("cuda_kb", "pchfirst", {"pch": True}), ("cuda_kb", "pchsecond", {"pch": True}),
                ("cuda_split", "split_pch", {"pch": True}), ("cuda_split", "split_nih_pch", {"pch": True, "nih": True}),
                ("cuda_split", "split_plain", {}),
                ("nvrtc", "nvrtc1", {}), ("nvrtc", "nvrtc2", {})]
    else:
        runs = [("cpu", "plain1", {}), ("cpu", "pchfirst", {"pch": True}), ("cpu", "pchsecond", {"pch": True})]
    for kind, tag, extra in runs:
        r = child(kind, tag, str(base / tag), extra)
        print(kind, tag, json.dumps(r), flush=True)
        out[f"{kind}:{tag}"] = r
    Path(os.environ.get("OUT", "/tmp"), f"explore-{which}.json").write_text(json.dumps(out, indent=1))

main()
