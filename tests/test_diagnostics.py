"""Compiler messages are mapped back to lines of the candidate's own text."""

from pathlib import Path

from kforge.backends.build.diagnostics import SourceMap, parse_compiler_output

CANDIDATE = '''import torch
from torch.utils.cpp_extension import load_inline

src = """
torch::Tensor f(torch::Tensor x) {
    return x + oops;
}
"""
ext = load_inline(name="e", cpp_sources=src, functions=["f"])
'''
EMBEDDED = "\ntorch::Tensor f(torch::Tensor x) {\n    return x + oops;\n}\n"


def _build_dir(tmp_path: Path) -> Path:
    # load_inline writes "\n".join([header, *sources, pybind module]) to main.cpp.
    (tmp_path / "main.cpp").write_text("\n".join(["#include <torch/extension.h>", EMBEDDED, "PYBIND11_MODULE(e, m) {}"]))
    return tmp_path


def test_gcc_error_maps_to_candidate_line(tmp_path):
    build = _build_dir(tmp_path)
    smap = SourceMap(CANDIDATE)
    smap.add_generated_file(build / "main.cpp", [EMBEDDED])
    out = f"{build}/main.cpp:4:16: error: 'oops' was not declared in this scope\n"
    [diag] = parse_compiler_output(out, smap, build_dir=build, source="c++")
    assert diag.line == 6 and diag.column == 16
    assert diag.code_line.strip() == "return x + oops;"
    assert diag.origin == "main.cpp:4:16" and diag.severity == "error"


def test_header_messages_keep_origin_without_a_line(tmp_path):
    build = _build_dir(tmp_path)
    out = "/usr/include/torch/api.h:10:3: warning: something deprecated\n"
    [diag] = parse_compiler_output(out, SourceMap(CANDIDATE), build_dir=build, source="c++")
    assert diag.line is None and diag.origin == "api.h:10:3" and diag.severity == "warning"


def test_nvcc_format_errors_first_and_deduplicated(tmp_path):
    build = _build_dir(tmp_path)
    smap = SourceMap(CANDIDATE)
    smap.add_generated_file(build / "main.cpp", [EMBEDDED])
    out = "\n".join([
        f"{build}/main.cpp:2:1: warning: unused thing",
        f"{build}/main.cpp(4): error: identifier \"oops\" is undefined",
        f"{build}/main.cpp(4): error: identifier \"oops\" is undefined",
        "main.o: undefined reference to `_Z3foov'",
    ])
    diags = parse_compiler_output(out, smap, build_dir=build, source="c++")
    assert [d.severity for d in diags] == ["error", "error", "warning"]
    assert diags[0].line == 6
    assert diags[1].source == "linker" and "foo()" in diags[1].message  # demangled by c++filt


PTXAS = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z11relu_kernelPKfPfi' for 'sm_90'
ptxas info    : Function properties for _Z11relu_kernelPKfPfi
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, used 0 barriers, 368 bytes cmem[0]
ptxas info    : Compiling entry function '_Z6tiledPKfS0_Pfi' for 'sm_90'
ptxas info    : Function properties for _Z6tiledPKfS0_Pfi
    16 bytes stack frame, 12 bytes spill stores, 8 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 8192 bytes smem, 380 bytes cmem[0]
"""


def test_ptxas_resources_per_kernel():
    from kforge.backends.build.diagnostics import parse_ptxas_resources

    relu, tiled = parse_ptxas_resources(PTXAS)
    assert relu.kernel == "relu_kernel(float const*, float*, int)" and relu.registers == 8
    assert relu.shared_bytes == 0 and relu.spill_store_bytes == 0 and relu.arch == "sm_90"
    assert tiled.registers == 255 and tiled.shared_bytes == 8192
    assert (tiled.stack_bytes, tiled.spill_store_bytes, tiled.spill_load_bytes) == (16, 12, 8)
