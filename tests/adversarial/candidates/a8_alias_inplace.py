"""A8 output aliases input (problem relu): computes in place and returns the input tensor."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return x.relu_()
