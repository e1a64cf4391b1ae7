"""A5 precision downgrade by global flag (adversarial problem matmul): switches TF32 on for everyone."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    def forward(self, a, b):
        return a @ b
