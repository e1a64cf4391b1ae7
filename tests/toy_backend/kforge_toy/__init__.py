"""A toy backend for KForge's plug-in seam: a CPU-like device named `toycpu`, registered only through the
`kforge.backends` entry point (see ../kforge_toy-0.1.dist-info/entry_points.txt), with its own verified example.

It is everything a new backend must write when its device behaves like the host's: a name, a probe, and where its
example lives; `BackendBase` gives the rest (host memory and clock, captured `load_inline` builds, the host's
ceilings). tests/test_backend_plugin.py drives it through a real `kforge serve`.
"""

from __future__ import annotations

from pathlib import Path

from kforge.backends import Availability, BackendBase

__all__ = ["ToyCpuBackend"]


class ToyCpuBackend(BackendBase):
    name = "toycpu"
    device = "cpu"
    kind = "cpu"

    def probe(self) -> Availability:
        from kforge.backends.host import cpu_name

        try:
            import torch
        except Exception as exc:  # noqa: BLE001 - any import failure means "not available"
            return self.available(False, f"torch cannot be imported ({exc})")
        return self.available(True, "a toy CPU-like device (KForge's plug-in test)", device_name=cpu_name(),
                              versions={"torch": torch.__version__})

    @classmethod
    def example_dir(cls) -> Path:
        return Path(__file__).parent / "example"
