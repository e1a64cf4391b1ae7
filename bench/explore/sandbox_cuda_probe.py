"""Which piece of the workers' sandbox keeps CUDA from starting (GPU host, 2026-11-24: the whole sandbox
applied, and torch.cuda.is_available() was False in every worker).

For each variant, a fresh child of this (torch-free, single-threaded) process enters the sandbox with some
pieces left out, then starts the CUDA driver through ctypes (cuInit, cuDeviceGetCount) and opens each NVIDIA
device node; it prints what each step answered. `python bench/explore/sandbox_cuda_probe.py [--torch] [--only LABEL] [HOME]`
(with LD_PRELOAD=failing_calls_shim.so built from this folder: each refused call of the driver).
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import tempfile

from kforge.tools.process import sandbox

_PIECES = ("_mounts", "_landlock", "_syscall_filter", "_drop_capabilities", "_no_new_privileges")


def _cuda_report() -> dict:
    out: dict = {}
    for node in sorted(n for n in os.listdir("/dev") if n.startswith("nvidia")):
        path = f"/dev/{node}"
        if os.path.isdir(path):
            continue
        try:
            os.close(os.open(path, os.O_RDWR))
            out[node] = "ok"
        except OSError as exc:
            out[node] = exc.strerror
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        out["libcuda"] = str(exc)
        return out
    name = ctypes.c_char_p()
    code = cuda.cuInit(0)
    cuda.cuGetErrorName(code, ctypes.byref(name))
    out["cuInit"] = f"{code} {name.value.decode() if name.value else ''}"
    count = ctypes.c_int(-1)
    cuda.cuDeviceGetCount(ctypes.byref(count))
    out["devices"] = count.value
    if "torch" in sys.modules:  # --torch: as a warm worker, torch imported before the fork
        torch = sys.modules["torch"]
        try:
            out["torch"] = str(torch.zeros(1, device="cuda").device)
        except Exception as exc:  # noqa: BLE001 - the probe reports whatever it is
            out["torch"] = f"{type(exc).__name__}: {exc}"[:300]
    return out


class _NoNetNoScope(sandbox._RulesetAttr):
    def __init__(self, fs: int, net: int = 0, scoped: int = 0) -> None:
        super().__init__(fs, 0, 0)


class _NoScope(sandbox._RulesetAttr):
    def __init__(self, fs: int, net: int = 0, scoped: int = 0) -> None:
        super().__init__(fs, net, 0)


def _variant(home: str, skip: tuple[str, ...], new_proc: bool = True, writable: tuple[str, ...] = (),
             attr: type | None = None) -> dict:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read)
            for piece in skip:
                setattr(sandbox, piece, lambda *a, **k: {"missing": ["all"]})
            if not new_proc:
                real = sandbox._mounts
                sandbox._mounts = lambda libc, c, r, new_proc: real(libc, c, r, new_proc=False)
            if attr is not None:
                sandbox._RulesetAttr = attr
            report = sandbox.enter(sandbox.Confinement(home=home, extra_writable=writable))
            report["cuda"] = _cuda_report()
            os.write(write, json.dumps(report).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        text = f.read()
    os.waitpid(pid, 0)
    return json.loads(text) if text else {"died": True}


def main() -> None:
    only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else None
    args = [a for a in sys.argv[1:] if a not in ("--torch", "--only", only)]
    if "--torch" in sys.argv:
        import torch  # noqa: F401
    home = args[0] if args else tempfile.mkdtemp(prefix="kforge-probe-")
    # Every report comes from a fresh child: CUDA started in this process would fail in each fork of it.
    variants = [("no sandbox", ("enter",), True), ("full", (), True), ("no own /proc", (), False)]
    variants += [(f"without {p}", (p,), True) for p in _PIECES] + [("namespaces only", _PIECES, True)]
    variants = [(*v, (), None) for v in variants]
    # Landlock alone (mounts left out, so that a writable path is not bound back): which rule does CUDA need?
    for tree in ("/", "/dev", "/proc", "/sys", "/run", "/var", "/root", "/tmp", "/usr/local/nvidia"):
        variants.append((f"landlock, {tree} writable", ("_mounts",), True, (tree,), None))
    variants.append(("landlock, no net, no scope", ("_mounts",), True, (), _NoNetNoScope))
    variants.append(("landlock, no scope", ("_mounts",), True, (), _NoScope))
    for label, skip, new_proc, writable, attr in variants:
        if only and label != only:
            continue
        r = _variant(home, skip, new_proc, writable, attr)
        print(f"{label:28s} cuda={json.dumps(r.get('cuda'))} missing={r.get('missing')}", flush=True)


if __name__ == "__main__":
    main()
