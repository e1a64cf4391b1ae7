"""CUDA, level-2 fusion: tiled x @ W^T with bias add and exact (erf) GELU in the epilogue, one kernel (`gemm_bias_gelu` problem)."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>

// y = gelu(x @ W^T + bias), x: (M, K), W: (N, K) as nn.Linear stores it, y: (M, N).
// A block of 16x16 threads computes a BM x BN tile of y; thread (ty, tx) owns rows ty + 16*i, cols tx + 16*j.
constexpr int BM = 64, BN = 64, BK = 16, T = 16, R = 4;
static_assert(BM == BN, "the tile loader fills both operand tiles in one loop");

__global__ void linear_gelu_kernel(const float* __restrict__ X, const float* __restrict__ W,
                                   const float* __restrict__ bias, float* __restrict__ Y, int M, int N, int K) {
    __shared__ float Xs[BK][BM];
    __shared__ float Ws[BK][BN];
    const int tx = threadIdx.x % T, ty = threadIdx.x / T;
    const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
    float acc[R][R] = {};

    for (int k0 = 0; k0 < K; k0 += BK) {
        for (int i = threadIdx.x; i < BM * BK; i += T * T) {  // both operands are read along K (coalesced)
            const int r = i / BK, k = i % BK, gk = k0 + k;
            Xs[k][r] = (row0 + r < M && gk < K) ? X[(int64_t)(row0 + r) * K + gk] : 0.f;
            Ws[k][r] = (col0 + r < N && gk < K) ? W[(int64_t)(col0 + r) * K + gk] : 0.f;
        }
        __syncthreads();
        for (int k = 0; k < BK; ++k) {
            float a[R], b[R];
            for (int i = 0; i < R; ++i) a[i] = Xs[k][ty + T * i];
            for (int j = 0; j < R; ++j) b[j] = Ws[k][tx + T * j];
            for (int i = 0; i < R; ++i)
                for (int j = 0; j < R; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
    for (int j = 0; j < R; ++j) {
        const int gn = col0 + tx + T * j;
        if (gn >= N) continue;
        const float bn = bias[gn];
        for (int i = 0; i < R; ++i) {
            const int gm = row0 + ty + T * i;
            if (gm >= M) continue;
            const float v = acc[i][j] + bn;
            Y[(int64_t)gm * N + gn] = 0.5f * v * (1.f + erff(v * 0.70710678118654752f));  // exact GELU
        }
    }
}

torch::Tensor linear_gelu_cuda(torch::Tensor x, torch::Tensor w, torch::Tensor bias) {
    TORCH_CHECK(x.is_cuda() && w.is_cuda() && bias.is_cuda(), "x, weight and bias must be CUDA tensors");
    TORCH_CHECK(x.scalar_type() == torch::kFloat && w.scalar_type() == torch::kFloat && bias.scalar_type() == torch::kFloat,
                "x, weight and bias must be float32");
    TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "shapes must be x (M, K), weight (N, K)");
    TORCH_CHECK(bias.dim() == 1 && bias.size(0) == w.size(0), "bias must have shape (N,)");
    auto xc = x.contiguous(), wc = w.contiguous(), bc = bias.contiguous();
    const int M = xc.size(0), K = xc.size(1), N = wc.size(0);
    auto y = torch::empty({M, N}, xc.options());
    if (M == 0 || N == 0) return y;
    const dim3 grid((N + BN - 1) / BN, (M + BM - 1) / BM);
    linear_gelu_kernel<<<grid, T * T, 0, c10::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), wc.data_ptr<float>(), bc.data_ptr<float>(), y.data_ptr<float>(), M, N, K);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""
cpp_source = "torch::Tensor linear_gelu_cuda(torch::Tensor x, torch::Tensor w, torch::Tensor bias);"

fused = load_inline(name="kf_bench_cuda_linear_gelu", cpp_sources=cpp_source, cuda_sources=cuda_source,
                    functions=["linear_gelu_cuda"])


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)  # same name as the reference: weights are copied

    def forward(self, x):
        return fused.linear_gelu_cuda(x, self.linear.weight, self.linear.bias)
