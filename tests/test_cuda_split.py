"""The KernelBench-form split: kernels into a torch-free .cu, torch wrappers into the C++ file.

The compile tests build both halves with the real compilers (nvcc for the .cu, g++ against torch's
headers for the C++ file), so they run on the CPU-only CI machine; loading and running the split
builds is what the GPU tests do (tests/test_gpu_cuda.py).
"""

from __future__ import annotations

import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

from kforge.backends.build.cuda_split import GENERATED, SplitDeclined, split_cuda_sources

from .conftest import EXAMPLES, candidate_path

KB_FORMS = ["example_kb", "cuda_kb_softmax", "cuda_kb_matmul", "cuda_side_stream"]


def _cuda_source(name: str) -> str:
    path = EXAMPLES / "cuda" / "candidate_load_inline.py" if name == "example_kb" else candidate_path(name)
    return path.read_text().split('r"""', 1)[1].split('"""', 1)[0]


def _cpp_source(name: str) -> str:
    path = EXAMPLES / "cuda" / "candidate_load_inline.py" if name == "example_kb" else candidate_path(name)
    text = path.read_text()
    start = text.index("torch::Tensor", text.index('"""', text.index('r"""') + 4))
    return text[start:text.index(";", start) + 1]


@pytest.mark.parametrize("name", KB_FORMS)
def test_kernels_and_wrappers_go_apart_with_every_piece_traceable(name):
    source = _cuda_source(name)
    split = split_cuda_sources([source])
    cu, cpp = "\n".join(split.cuda), "\n".join(split.cpp)
    assert "torch" not in cu.replace("kforge", "") and "__global__" in cu
    assert "__global__" not in cpp and "<<<" not in cpp and split.kernels
    for k in split.kernels:
        assert f"kforge_launch_{k}(kforge_launch_config(" in cpp and f"void kforge_launch_{k}(" in cu
    # Each piece is the candidate's text (or generated); a rewritten launch keeps its line count.
    for pieces, written in ((split.cuda, split.cuda_written), (split.cpp, split.cpp_written)):
        for piece, orig in zip(pieces, written, strict=True):
            assert orig == GENERATED or orig in source
            if orig != GENERATED:
                assert piece.count("\n") == orig.count("\n")


@pytest.mark.parametrize("source, why", [
    ("template <typename T> __global__ void k(T* x) {}\nvoid f(float* x) { k<float><<<1, 1>>>(x); }", "template kernel"),
    ("__global__ void k(at::Half* x) {}\nvoid f(at::Half* x) { k<<<1, 1>>>(x); }", "names torch"),
    ("__global__ void k(float* x) {}\nvoid f(float* x) { cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 1 << 16);"
     " k<<<1, 1>>>(x); }", "other than by launching"),
    ("__constant__ float w[4];\n__global__ void k(float* x) { x[0] = w[0]; }\n"
     "void f(float* x, float* h) { cudaMemcpyToSymbol(w, h, 16); k<<<1, 1>>>(x); }", "'w' other than by launching"),
    ("namespace my {\n__global__ void k(float* x) {}\n}\nvoid f(float* x) { my::k<<<1, 1>>>(x); }", "namespace"),
    ("__global__ void k(float* x, int) {}\nvoid f(float* x) { k<<<1, 1>>>(x, 0); }", "unnamed parameter"),
    ("__global__ void k(float* x) {}\nvoid f(float* x) { other<<<1, 1>>>(x); }", "not a kernel of this source"),
])
def test_declines_what_it_cannot_split_faithfully(source, why):
    with pytest.raises(SplitDeclined, match=why):
        split_cuda_sources([source])


def test_comments_between_directives_and_declarations_are_kept():
    source = ("#include <torch/extension.h>\n// variant 3\n/* a block\n comment */\n#include <cuda_runtime.h>\n"
              "// the kernel\n__global__ void k(float* x) {}\n#define N 4\n"
              "torch::Tensor f(torch::Tensor x) { k<<<1, N>>>(x.data_ptr<float>()); return x; }\n")
    split = split_cuda_sources([source])
    assert split.kernels == ["k"] and "// variant 3" in "\n".join(split.cpp)
    assert "#define N 4" in "\n".join(split.cuda) and "#define N 4" in "\n".join(split.cpp)


def test_comments_and_strings_do_not_count():
    source = ('// __global__ in a comment, torch:: too\n__global__ void k(float* x) { /* at::Half */ }\n'
              'void f(float* x) { const char* s = "k<<<1,1>>>(x) __device__"; k<<<1, 1>>>(x); }')
    split = split_cuda_sources([source])
    assert split.kernels == ["k"]
    assert '"k<<<1,1>>>(x) __device__"' in "\n".join(split.cpp)


_NVCC = shutil.which("nvcc")


def _cuda_include() -> str:
    """CUDA's include directory, from nvcc itself (`nvcc` may be a wrapper script outside the toolkit)."""
    out = subprocess.run([_NVCC, "--dryrun", "-x", "cu", "-c", "/dev/null", "-o", "/dev/null"], capture_output=True,
                         text=True).stderr
    top = next(line.split("=", 1)[1] for line in out.splitlines() if line.startswith("#$ TOP="))
    return str(Path(top, "include"))


def _torch_flags() -> list[str]:
    from torch.utils import cpp_extension

    return ([f"-I{p}" for p in cpp_extension.include_paths()] + [f"-I{_cuda_include()}",
            f"-I{sysconfig.get_paths()['include']}", "-std=c++17", "-DTORCH_EXTENSION_NAME=kf_split_test"])


@pytest.mark.skipif(_NVCC is None, reason="needs nvcc (compile only; no GPU)")
@pytest.mark.parametrize("name", ["example_kb", "cuda_kb_matmul", "cuda_kb_softmax"])
def test_both_halves_compile(tmp_path, name):
    """The .cu with nvcc and nothing of torch; the C++ file with g++ as load_inline writes it."""
    if "ATen/cuda" in _cuda_source(name) and not Path(_cuda_include(), "cusparse.h").exists():
        pytest.skip("ATen/cuda/CUDAContext.h needs the CUDA math libraries' headers, which this toolkit lacks")
    split = split_cuda_sources([_cuda_source(name)])
    cu = tmp_path / "cuda.cu"
    cu.write_text("\n".join(split.cuda))
    nvcc = subprocess.run([_NVCC, "-c", str(cu), "-o", str(tmp_path / "cuda.o"), "-arch=sm_90", "-std=c++17",
                           "--expt-relaxed-constexpr", "-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__"],
                          capture_output=True, text=True, timeout=300)
    assert nvcc.returncode == 0, nvcc.stderr
    main = tmp_path / "main.cpp"
    fn = _cpp_source(name).split("(")[0].split()[-1]
    main.write_text("\n".join(["#include <torch/extension.h>", _cpp_source(name), *split.cpp,
                               f'PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {{ m.def("{fn}", {fn}, "{fn}"); }}']))
    gxx = subprocess.run(["c++", "-fsyntax-only", str(main), *_torch_flags()], capture_output=True, text=True, timeout=600)
    assert gxx.returncode == 0, gxx.stderr[-4000:]
    # The launcher is declared in the C++ file exactly as the .cu defines it (one symbol, not two overloads).
    nm = subprocess.run(["nm", "-C", str(tmp_path / "cuda.o")], capture_output=True, text=True).stdout
    assert f"kforge_launch_{split.kernels[0]}(kforge_launch_config" in nm
