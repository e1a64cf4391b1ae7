"""CUDA, matmul: shared-memory tiled fp32 matmul, 64x64 tiles, 4x4 outputs per thread; no cuBLAS, no TF32 (`matmul` problem)."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>

// A block of 16x16 threads computes a BM x BN tile of C; thread (ty, tx) owns rows ty + 16*i, cols tx + 16*j.
constexpr int BM = 64, BN = 64, BK = 16, T = 16, R = 4;  // R = BM / T = BN / T

__global__ void matmul_kernel(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
                              int M, int N, int K) {
    __shared__ float As[BK][BM];
    __shared__ float Bs[BK][BN];
    const int tx = threadIdx.x % T, ty = threadIdx.x / T;
    const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
    float acc[R][R] = {};

    for (int k0 = 0; k0 < K; k0 += BK) {
        for (int i = threadIdx.x; i < BM * BK; i += T * T) {  // A tile, read along K (coalesced)
            const int m = i / BK, k = i % BK, gm = row0 + m, gk = k0 + k;
            As[k][m] = (gm < M && gk < K) ? A[(int64_t)gm * K + gk] : 0.f;
        }
        for (int i = threadIdx.x; i < BK * BN; i += T * T) {  // B tile, read along N (coalesced)
            const int k = i / BN, n = i % BN, gk = k0 + k, gn = col0 + n;
            Bs[k][n] = (gk < K && gn < N) ? B[(int64_t)gk * N + gn] : 0.f;
        }
        __syncthreads();
        for (int k = 0; k < BK; ++k) {
            float a[R], b[R];
            for (int i = 0; i < R; ++i) a[i] = As[k][ty + T * i];
            for (int j = 0; j < R; ++j) b[j] = Bs[k][tx + T * j];
            for (int i = 0; i < R; ++i)
                for (int j = 0; j < R; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
    for (int i = 0; i < R; ++i) {
        const int gm = row0 + ty + T * i;
        for (int j = 0; j < R; ++j) {
            const int gn = col0 + tx + T * j;
            if (gm < M && gn < N) C[(int64_t)gm * N + gn] = acc[i][j];
        }
    }
}

torch::Tensor matmul_cuda(torch::Tensor a, torch::Tensor b) {
    TORCH_CHECK(a.is_cuda() && b.is_cuda(), "a and b must be CUDA tensors");
    TORCH_CHECK(a.scalar_type() == torch::kFloat && b.scalar_type() == torch::kFloat, "a and b must be float32");
    TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0), "shapes must be (M, K) @ (K, N)");
    auto ac = a.contiguous(), bc = b.contiguous();
    const int M = ac.size(0), K = ac.size(1), N = bc.size(1);
    auto c = torch::empty({M, N}, ac.options());
    if (M == 0 || N == 0) return c;
    const dim3 grid((N + BN - 1) / BN, (M + BM - 1) / BM);
    matmul_kernel<<<grid, T * T, 0, c10::cuda::getCurrentCUDAStream()>>>(
        ac.data_ptr<float>(), bc.data_ptr<float>(), c.data_ptr<float>(), M, N, K);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return c;
}
"""
cpp_source = "torch::Tensor matmul_cuda(torch::Tensor a, torch::Tensor b);"

mm = load_inline(name="kf_bench_cuda_matmul", cpp_sources=cpp_source, cuda_sources=cuda_source,
                 functions=["matmul_cuda"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return mm.matmul_cuda(a, b)
