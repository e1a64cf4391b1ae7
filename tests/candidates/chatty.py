"""CHATTY but correct: prints from Python and writes straight to fds 1 and 2, which must not corrupt stdio MCP."""
import os
import sys

import torch
import torch.nn as nn

print("hello from import", flush=True)
os.write(1, b'{"jsonrpc": "2.0", "id": 1, "result": {"fake": true}}\n')
os.write(2, b"candidate noise on stderr\n")


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(features))
        self.bias = nn.Parameter(torch.randn(features))

    def forward(self, x):
        print("forward called", flush=True)
        sys.stdout.write("more noise\n")
        os.write(1, b"raw fd noise\n")
        return torch.relu(x) * self.scale + self.bias
