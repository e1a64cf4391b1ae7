"""The C++/CUDA build machinery the backends share: fast builds and their cache, load_inline and NVRTC capture,
CUDA source splitting, compiler diagnostics and reports, and the build result models. Its surface is its modules;
nothing is imported here.
"""

__all__ = ["compiler_report", "cuda_split", "diagnostics", "fast_build", "inline", "models", "nvrtc"]
