"""What a KernelBench reference's own forward allocates on the GPU beyond its inputs and output (issue 16: verify's
memory against the problem's footprint). Prints, per problem, the footprint and the peak allocated during one
forward in a bare process, and for MaxPool2d whether torch's CUDA max_pool2d makes int64 indices.

    python bench/explore/reference_peak_memory.py .kb/KernelBench/level1/42_Max_Pooling_2D.py ...
"""

from __future__ import annotations

import importlib.util
import json
import sys

import torch


def peak(path: str) -> dict:
    spec = importlib.util.spec_from_file_location("ref", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    torch.manual_seed(0)
    model = mod.Model(*mod.get_init_inputs()).cuda()
    inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in mod.get_inputs()]
    in_bytes = sum(x.numel() * x.element_size() for x in inputs if isinstance(x, torch.Tensor))
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    with torch.no_grad():
        out = model(*inputs)
    torch.cuda.synchronize()
    out_bytes = out.numel() * out.element_size()
    row = {"problem": path.rsplit("/", 1)[-1], "inputs_gb": in_bytes / 1e9, "output_gb": out_bytes / 1e9,
           "forward_peak_above_inputs_gb": (torch.cuda.max_memory_allocated() - base) / 1e9}
    if "Max_Pooling" in path:
        pool = model.maxpool
        _, idx = torch.nn.functional.max_pool2d(inputs[0], pool.kernel_size, pool.stride, pool.padding,
                                                pool.dilation, return_indices=True)
        row["indices_dtype"], row["indices_gb"] = str(idx.dtype), idx.numel() * idx.element_size() / 1e9
    del out, inputs, model
    torch.cuda.empty_cache()
    return row


if __name__ == "__main__":
    for p in sys.argv[1:]:
        print(json.dumps(peak(p)), flush=True)
