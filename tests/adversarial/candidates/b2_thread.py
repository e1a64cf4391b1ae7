"""B2 thread injection (problem relu): returns at once; a background thread writes the answer later."""
import threading
import time

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)

        def fill():
            time.sleep(1.5)
            torch.relu(x, out=out)

        threading.Thread(target=fill, daemon=True).start()
        return out
