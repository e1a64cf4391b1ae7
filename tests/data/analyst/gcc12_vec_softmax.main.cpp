#include <torch/extension.h>

#include <torch/extension.h>
#include <cmath>

torch::Tensor softmax_rows(torch::Tensor x) {
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    const int64_t rows = xc.size(0), cols = xc.size(1);
    const float* in = xc.data_ptr<float>();
    float* o = out.data_ptr<float>();
    #pragma omp parallel for
    for (int64_t r = 0; r < rows; ++r) {
        const float* row = in + r * cols;
        float* orow = o + r * cols;
        float m = -INFINITY;
        #pragma omp simd reduction(max:m)
        for (int64_t c = 0; c < cols; ++c) m = std::max(m, row[c]);
        float sum = 0.f;
        #pragma omp simd reduction(+:sum)
        for (int64_t c = 0; c < cols; ++c) { const float e = std::exp(row[c] - m); orow[c] = e; sum += e; }
        const float inv = 1.f / sum;
        #pragma omp simd
        for (int64_t c = 0; c < cols; ++c) orow[c] *= inv;
    }
    return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
m.def("softmax_rows", torch::wrap_pybind_function(softmax_rows), "softmax_rows");
}