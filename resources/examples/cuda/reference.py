"""ReLU on a 1024x1024 fp32 tensor: the smallest memory-bound problem (KernelBench level 1 style)."""
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
    def forward(self, x):
        return torch.relu(x)

def get_inputs():
    return [torch.randn(1024, 1024)]

def get_init_inputs():
    return []
