"""NVIDIA GPU helpers shared by the `cuda` and `triton` backends (which must not import each other)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, Mapping

from . import _cuda_share
from .base import DeviceFacts, DeviceNodes, GpuInfo, SharedOutput

__all__ = ["FAULT_MARKERS", "NATIVE_SCAN_RULES", "PYTHON_SCAN_RULES", "SYNC_LAUNCH_ENV", "WORKER_ENV_NAMES", "CudaAllocator", "NvidiaDeviceNodes", "NvidiaGpu", "nvidia_gpus", "EventTimer", "GpuClock", "L2Flusher", "gpu_facts", "gpu_memory_capacity", "list_gpus",
           "measure_gpu_ceilings", "nvidia_gpu_present", "preload_gpu_compiler", "setup_gpu", "strict_gpu_numerics", "warm_gpu_libraries"]

# Messages of GPU faults that leave the device context unusable (the worker is discarded after).
FAULT_MARKERS = ("illegal memory access", "misaligned address", "unspecified launch failure",
                 "illegal instruction", "CUDA error", "device-side assert")
# The CUDA runtime reads this once, at start-up: such workers are a kind of their own in the pool. Launches are
# synchronous, so a fault is reported at the launch that made it.
SYNC_LAUNCH_ENV = {"CUDA_LAUNCH_BLOCKING": "1"}
# What the static scan looks for in a candidate for an NVIDIA GPU (`Backend.native_scan_rules`, `python_scan_rules`):
# the runtime's own ways past the harness, and what is honest but must be read against the runtime checks.
NATIVE_SCAN_RULES = (
    ("l2_persistence", True, r"cudaLimitPersistingL2CacheSize|accessPolicyWindow|cudaAccessPropertyPersisting|hitProp",
     "native code sets up persisting L2 lines, which survive the harness's cache flush"),
    ("harness_patch", True, r"cudaEventElapsedTime", "native code reads the runtime's event timers"),
    ("streams", False, r"cudaStreamCreate\w*|cudaStreamNonBlocking|getStreamFromPool",
     "native code creates its own CUDA stream; work there must finish inside the call"),
    ("precision", False, r"__float2half|__float2bfloat16|__half\b|__nv_bfloat16|wmma::|mma\.sync",
     "native code computes in reduced precision (fine under precision='mixed', a failure under strict if it shows in "
     "the error)"),
)
PYTHON_SCAN_RULES = (
    ("streams", False, r"(^|\.)cuda\.(Stream|stream|ExternalStream)$", "work on another stream must finish inside the call"),
)
# The server's variables a worker on an NVIDIA GPU inherits: the toolkit's place, the GPUs it may see, the arch to build,
# and whether Kineto detaches CUPTI when a torch.profiler session ends (its own knob, read at each session's end).
WORKER_ENV_NAMES = ("CUDA_HOME", "CUDA_PATH", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "TORCH_CUDA_ARCH_LIST",
                    "TEARDOWN_CUPTI")

# Twice the L2 of current data-center GPUs (H100 50 MB, H200 60 MB); zeroed before every timed
# call, outside the timed window, so each call starts from a cold L2.
_FLUSH_BYTES = 256 * 1024 * 1024


def nvidia_gpu_present() -> bool:
    """Whether this host has an NVIDIA GPU, asked of the driver rather than of torch (a CPU build of torch
    cannot tell): the kernel driver lists its GPUs under /proc/driver/nvidia/gpus, and makes /dev/nvidia0."""
    gpus = "/proc/driver/nvidia/gpus"
    return (os.path.isdir(gpus) and bool(os.listdir(gpus))) or os.path.exists("/dev/nvidia0")


def list_gpus() -> list[GpuInfo]:
    """Each GPU this process sees, in torch's (CUDA's) order: its `index` is what the tools' `gpu` names, and its
    `pin`, CUDA_VISIBLE_DEVICES=<uuid>, confines a worker to it whatever the order. Called in the probe worker only."""
    import torch

    gpus = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        uuid = str(getattr(props, "uuid", "") or "") or None  # torch prints it bare; nvidia-smi and CUDA say GPU-...
        if uuid and not uuid.startswith(("GPU-", "MIG-")):
            uuid = f"GPU-{uuid}"
        bus = getattr(props, "pci_bus_id", None)
        pci = (f"{getattr(props, 'pci_domain_id', 0):08X}:{bus:02X}:{getattr(props, 'pci_device_id', 0):02X}.0"
               if isinstance(bus, int) else None)
        gpus.append(GpuInfo(index=i, name=props.name, uuid=uuid, pci_bus_id=pci, memory_bytes=props.total_memory,
                            pin={"CUDA_VISIBLE_DEVICES": uuid or _visible_entry(i)}))
    return gpus


def _visible_entry(index: int) -> str:
    """GPU `index` as this process's CUDA_VISIBLE_DEVICES names it (a worker's setting replaces the server's, whose
    own list the probe inherits), for a torch that gives no uuid."""
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    return visible[index] if index < len(visible) else str(index)


class EventTimer:
    """CUDA events on the current stream. `stop` only records: the timing loop queues many calls and
    synchronizes once, so the GPU never idles (and drops its clocks) between timed calls."""

    def __init__(self) -> None:
        import torch

        self._start = torch.cuda.Event(enable_timing=True)
        self._end = torch.cuda.Event(enable_timing=True)

    def start(self) -> None:
        self._start.record()

    def stop(self) -> None:
        self._end.record()

    def elapsed_s(self) -> float:
        self._end.synchronize()
        return self._start.elapsed_time(self._end) / 1e3


class GpuClock:
    """The GPU's SM clock and the reasons it runs below its maximum, read from NVML (the driver's libnvidia-ml,
    through ctypes: no Python binding is needed). A power cap or heat slows a heavy kernel to the clock they allow,
    so the same kernel can run at two speeds in one process; the timing loop reads this while its batches run.

    The GPU is found by the UUID of CUDA's device 0 (an NVML index counts every GPU of the host, whatever
    CUDA_VISIBLE_DEVICES says). Where NVML or the GPU cannot be read (no driver library, a MIG instance, a sandbox
    that refuses it), `read` answers None: the timing then says nothing of the clock rather than guess."""

    # nvml.h's nvmlClocksEventReason* bits that slow a kernel that wants the clock (idle, application clocks,
    # sync boost and display settings do not).
    SLOWDOWNS = {0x4: "SW power cap", 0x8: "HW slowdown", 0x20: "SW thermal slowdown", 0x40: "HW thermal slowdown",
                 0x80: "HW power brake slowdown"}
    _NVML_CLOCK_SM = 1

    def __init__(self) -> None:
        import ctypes

        self._lib: Any = None
        self._handle = ctypes.c_void_p()
        try:
            import torch

            uuid = str(getattr(torch.cuda.get_device_properties(0), "uuid", "") or "")
            if not uuid:
                return
            uuid = uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
            lib = ctypes.CDLL("libnvidia-ml.so.1")
            # The newer name, else the older one of the same call (drivers before 535).
            self._reasons = getattr(lib, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
                lib.nvmlDeviceGetCurrentClocksThrottleReasons
            if lib.nvmlInit_v2() != 0 or lib.nvmlDeviceGetHandleByUUID(uuid.encode(), ctypes.byref(self._handle)) != 0:
                return
            self._lib = lib
        except (OSError, AttributeError, RuntimeError, AssertionError):
            self._lib = None

    def read(self) -> tuple[float, tuple[str, ...]] | None:
        """(SM clock in MHz, the slowdown reasons active now), or None where NVML cannot tell."""
        if self._lib is None:
            return None
        import ctypes

        mhz, bits = ctypes.c_uint(0), ctypes.c_ulonglong(0)
        if self._lib.nvmlDeviceGetClockInfo(self._handle, self._NVML_CLOCK_SM, ctypes.byref(mhz)) != 0 or \
                self._reasons(self._handle, ctypes.byref(bits)) != 0:
            return None
        return float(mhz.value), tuple(name for bit, name in self.SLOWDOWNS.items() if bits.value & bit)


class L2Flusher:
    """Evict L2 between timed calls by overwriting more than it holds, queued on the stream (no sync).

    Lines marked persisting survive a plain write; they need a set-aside, which is 0 unless a candidate
    raised cudaLimitPersistingL2CacheSize. That limit is read on every flush (a host-side driver call),
    and only when it is set does the flush synchronize, reset persisting lines and set it back to 0.
    """

    def __init__(self) -> None:
        import ctypes

        self._buf: Any = None
        self._driver = _cuda_driver()
        self._limit = ctypes.c_size_t(0)

    def __call__(self) -> None:
        import torch

        if self._buf is None:
            self._buf = torch.empty(_FLUSH_BYTES, dtype=torch.int8, device="cuda")
        if self._driver is not None:
            import ctypes

            self._driver.cuCtxGetLimit(ctypes.byref(self._limit), _CU_LIMIT_PERSISTING_L2_CACHE_SIZE)
            if self._limit.value:
                torch.cuda.synchronize()
                self._driver.cuCtxSetLimit(_CU_LIMIT_PERSISTING_L2_CACHE_SIZE, 0)
                self._driver.cuCtxResetPersistingL2Cache()
        self._buf.zero_()


_CU_LIMIT_PERSISTING_L2_CACHE_SIZE = 0x06


class LaunchProbe:
    """What the host takes now to issue one kernel launch (us): three bursts of 20 one-element fills timed on the host
    clock, the median burst. A host-paced call (hundreds of small kernels) runs at this pace, and on the lent H200
    hosts (a KVM guest, 16 vCPUs) it was read at two paces, 5.5-6.2 us a launch and 7.8-10 us, from one process to the
    next and within one; EfficientNetB1's do_bench moved with it, 1,530-1,810 us against 2,170-3,100 us
    (`bench/explore/host_pace.py`, bench/results/host-pace-h200-2026-12-01-s32-b.md). Called with the device idle (after
    a synchronize), so a full launch queue cannot stall it; its fills run before the next timed window opens."""

    _BURSTS, _LAUNCHES = 3, 20

    def __init__(self) -> None:
        self._one: Any = None

    def __call__(self) -> float:
        import torch

        if self._one is None:
            self._one = torch.zeros(1, device="cuda")
        bursts = []
        for _ in range(self._BURSTS):
            t = time.perf_counter()
            for _ in range(self._LAUNCHES):
                self._one.zero_()
            bursts.append((time.perf_counter() - t) / self._LAUNCHES)
        return sorted(bursts)[self._BURSTS // 2] * 1e6


def _cuda_driver() -> Any:
    """The CUDA driver library (always present where a GPU works), or None."""
    import ctypes

    try:
        lib = ctypes.CDLL("libcuda.so.1")
        lib.cuCtxSetLimit.argtypes = [ctypes.c_int, ctypes.c_size_t]
        lib.cuCtxGetLimit.argtypes = [ctypes.POINTER(ctypes.c_size_t), ctypes.c_int]
        return lib
    except (OSError, AttributeError):
        return None


def setup_gpu() -> None:
    """Start CUDA in the worker, and keep TF32 off so an fp32 reference is computed in fp32."""
    import torch

    # Kineto leaves CUPTI attached after a torch.profiler session ends unless told to detach it, and every launch
    # after pays for it: a launch read 13.1-13.7 us in KForge's workers (after their warm-up session) against 8.2-9.2
    # with TEARDOWN_CUPTI=1, and host-paced networks timed 1.20-1.49x do_bench (H200, 2026-12-02,
    # bench/results/host-pace-h200-2026-12-02-s33.md). Detached, the next session starts CUPTI again in ~0.02 s.
    # An operator's own TEARDOWN_CUPTI (a worker inherits it) wins; torch.compile's CUDA graphs set it to 0 themselves.
    os.environ.setdefault("TEARDOWN_CUPTI", "1")
    torch.cuda.init()
    # A GPU worker's own CPU work is small (inputs, files), but many run at once (judge and candidate per
    # job, jobs side by side, warm ones waiting): an all-core OpenMP pool in each oversubscribes the host.
    torch.set_num_threads(max(1, min(4, (os.cpu_count() or 1) // 4)))
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def strict_gpu_numerics() -> None:
    """The reference is the truth: no TF32 and no reduced-precision reductions, whatever the defaults."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False


def preload_gpu_compiler() -> dict[str, float]:
    """torch.compile's GPU compiler (Inductor's Triton code generation, and Triton), imported once in the fork
    server rather than in each judge: a new problem's first profile compiles its torch.compile baseline, and in a
    fresh process these imports were 2.5-3.7 s of a 5.7-8.0 s compile on an H200 (bench/explore/compile_cost.py,
    2026-11-27). Only on a host with a GPU (the triton backend's interpreter needs none of it), and none of
    these imports starts the device. Returns its two parts' seconds, for the fork server's trace (empty: skipped)."""
    if not nvidia_gpu_present():
        return {}
    started = time.perf_counter()
    import torch._inductor.async_compile  # noqa: F401
    import torch._inductor.codegen.triton  # noqa: F401
    import torch._inductor.compile_fx  # noqa: F401
    import triton.compiler  # noqa: F401

    imported = time.perf_counter()
    _activate_triton_driver()
    return {"Inductor and Triton imports": round(imported - started, 3),
            "Triton driver": round(time.perf_counter() - imported, 3)}


def _activate_triton_driver() -> None:
    """Make Triton's CUDA driver here, once, before any fork. Making it builds Triton's `cuda_utils` helper from C
    source with the host's C compiler into the Triton cache, and a worker's Triton cache is its job's own (issue 17:
    one job's entries would be loaded by the next), so every judge and Triton candidate ran that compiler again at its
    first Triton kernel. It is built into a directory of its own, loaded, and the directory removed; the forks inherit
    the loaded module. Nothing here starts CUDA: the driver only binds torch.cuda's functions (and is made directly,
    not through `driver.active`, whose lookup asks `torch.cuda.is_available()`). Where this fails, Triton makes its
    driver at first use, as before."""
    import importlib
    import tempfile

    try:
        # The module, not `triton.runtime.driver` the attribute: the package rebinds that name to its DriverConfig.
        config = importlib.import_module("triton.runtime.driver").driver
        from triton.backends.nvidia.driver import CudaDriver
    except (ImportError, AttributeError):
        return
    before = os.environ.get("TRITON_CACHE_DIR")
    try:
        with tempfile.TemporaryDirectory(prefix="kforge-triton-driver-") as cache:
            os.environ["TRITON_CACHE_DIR"] = cache
            driver = CudaDriver()
        config.set_active(driver)
        if getattr(config, "_default", driver) is None:  # `config.default` would build another
            config._default = driver
    except Exception:  # noqa: BLE001 - no C compiler, another Triton: the lazy path still works
        return
    finally:
        if before is None:
            os.environ.pop("TRITON_CACHE_DIR", None)
        else:
            os.environ["TRITON_CACHE_DIR"] = before


# Nodes every CUDA process opens whichever GPU it uses (the driver's control, unified memory, MIG's capabilities).
_CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset", "nvidia-caps")
_DRIVER = "/proc/driver/nvidia"


def nvidia_gpus(driver: str = _DRIVER) -> list[dict[str, str]]:
    """The GPUs the driver lists, in PCI bus order: "uuid" ("GPU-..."), "minor" (its node is /dev/nvidia<minor>) and
    "model", from `<driver>/gpus/<bus id>/information` (empty where a field or the file cannot be read)."""
    try:
        buses = sorted(os.listdir(os.path.join(driver, "gpus")))  # "0000:17:00.0": text order is bus order
    except OSError:
        return []
    found = []
    for bus in buses:
        try:
            text = Path(driver, "gpus", bus, "information").read_text()
        except OSError:
            text = ""  # kept in its place: an index counts it
        fields = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in text.splitlines())}
        found.append({"uuid": fields.get("GPU UUID", ""), "minor": fields.get("Device Minor", ""),
                      "model": fields.get("Model", "")})
    return found


def _pinned_gpus(visible: str, gpus: list[dict[str, str]]) -> list[dict[str, str]] | None:
    """The driver's GPUs (`nvidia_gpus`) that each entry of a CUDA_VISIBLE_DEVICES names, or None where one is not found
    (or has no node of its own)."""
    found: list[dict[str, str]] = []
    for entry in (e.strip() for e in visible.split(",")):
        if entry.isdigit():
            # An index counts CUDA's devices, ranked fastest first (CUDA_DEVICE_ORDER's default; a worker gets no
            # other), ties in PCI bus order: bus order where every GPU is one model, else not known here.
            same_model = len({g["model"] for g in gpus}) == 1
            match = [gpus[int(entry)]] if same_model and int(entry) < len(gpus) else []
        else:  # a uuid, or (as CUDA takes it) a unique start of one
            want = entry.lower().removeprefix("gpu-")
            match = [g for g in gpus if want and g["uuid"].lower().removeprefix("gpu-").startswith(want)]
        if len(match) != 1 or not match[0]["minor"].isdigit():
            return None
        found += match
    return found


class NvidiaDeviceNodes:
    """`Backend.device_nodes` and `host_device_nodes` of a backend on NVIDIA GPUs (cuda, triton): a worker opens its
    pinned GPUs' nodes and the driver's control nodes, and no other GPU's."""

    @classmethod
    def host_device_nodes(cls, dev: str = "/dev") -> list[str]:
        """NVIDIA's device nodes (every GPU of the host; CUDA_VISIBLE_DEVICES picks among them)."""
        try:
            nodes = [os.path.join(dev, n) for n in os.listdir(dev) if n.startswith("nvidia")]
        except OSError:
            return []
        caps = os.path.join(dev, "nvidia-caps")
        return nodes + ([caps] if os.path.isdir(caps) and caps not in nodes else [])

    @classmethod
    def device_nodes(cls, env: Mapping[str, str], dev: str = "/dev", driver: str = _DRIVER) -> DeviceNodes:
        """No node without an NVIDIA GPU here, or for an empty pin (CUDA in it sees no GPU, and neither may code run
        there). Every node (None) for a worker pinned to none (the probe, a host of one GPU) and for a pin not found
        here (an MIG instance, a GPU the driver does not list): said in `why_all_open`. Else the pinned GPUs' own
        nodes and the control nodes (the kernel lets a process reach a GPU through /dev/nvidiactl only once it has
        opened that GPU's node), and where the pin has an index, the pin by UUID (`env`): CUDA counts an index among
        the GPUs it can open, so with GPU 1's node alone open "1" names none (a server started with
        CUDA_VISIBLE_DEVICES=1 on a host of two had no CUDA in its workers, H200 x2, 2026-11-27)."""
        if not cls.host_device_nodes(dev):
            return DeviceNodes(())
        visible = env.get("CUDA_VISIBLE_DEVICES")
        if visible is not None and not visible.strip():
            return DeviceNodes(())
        if visible is None:
            return DeviceNodes(None)
        gpus = nvidia_gpus(driver)
        pinned = _pinned_gpus(visible, gpus)
        if pinned is None:
            return DeviceNodes(None, f"GPU device nodes: CUDA_VISIBLE_DEVICES={visible} is no GPU listed in "
                                     f"{driver}/gpus: every GPU's node is open to the worker")
        names = [f"nvidia{m}" for m in dict.fromkeys(g["minor"] for g in pinned)] + list(_CONTROL_NODES)
        nodes = tuple(p for p in (os.path.join(dev, n) for n in names) if os.path.exists(p))
        by_uuid = (",".join(g["uuid"] for g in pinned) if nodes and all(g["uuid"] for g in pinned)
                   and any(e.strip().isdigit() for e in visible.split(",")) else None)
        return DeviceNodes(nodes, env={"CUDA_VISIBLE_DEVICES": by_uuid} if by_uuid else {})


class CudaAllocator:
    """The `Backend` memory methods of a backend on torch's CUDA caching allocator (cuda, triton). Asked of a
    process that has not started CUDA, they answer nothing: `torch.cuda.is_available()` would start the driver."""

    @staticmethod
    def _started() -> bool:
        torch = sys.modules.get("torch")
        return torch is not None and torch.cuda.is_initialized()

    def allocator_memory(self) -> tuple[int, int]:
        if not self._started():
            return (0, 0)
        import torch

        return (torch.cuda.memory_reserved(), torch.cuda.memory_allocated())

    def release_cached_memory(self) -> None:
        if self._started():
            import torch

            torch.cuda.empty_cache()

    def reset_memory_peaks(self) -> bool:
        if not self._started():
            return False
        import torch

        torch.cuda.reset_peak_memory_stats()
        return True

    def memory_peaks(self) -> list[int]:
        import torch

        return [torch.cuda.max_memory_reserved(), torch.cuda.max_memory_allocated()]


class NvidiaGpu(CudaAllocator, NvidiaDeviceNodes):
    """The class facts of a backend on NVIDIA GPUs (cuda, triton), said once: its faults, its synchronous launches,
    its static-scan rules, the variables its workers inherit, its device nodes and allocator, how its outputs cross
    to the judge (`_cuda_share`), and the fork server's guard against starting CUDA."""

    limits_address_space = False  # the CUDA driver reserves terabytes of virtual address space
    fault_markers = FAULT_MARKERS
    sync_launch_env = SYNC_LAUNCH_ENV
    native_scan_rules, python_scan_rules = NATIVE_SCAN_RULES, PYTHON_SCAN_RULES
    worker_env_names = WORKER_ENV_NAMES
    toolchain_env_names = ("CUDA_HOME", "CUDA_PATH")
    lock_clocks_hint = "nvidia-smi -lgc"
    # torch.cuda.is_available() through NVML, not the CUDA runtime: asking must not initialize CUDA in the fork server.
    fork_server_env = {"PYTORCH_NVML_BASED_CUDA_CHECK": "1"}
    # What `EventTimer` and `synchronize` call: a candidate that rebinds one could shorten its own timing.
    watched_functions = (("torch.cuda", "synchronize"), ("torch.cuda", "Event"), ("torch.cuda", "Event.record"),
                         ("torch.cuda", "Event.elapsed_time"), ("torch.cuda", "Event.synchronize"))
    # TF32 and reduced-precision reductions: what `strict_gpu_numerics` turns off for the reference.
    numerics_flags = (
        ("torch.backends.cuda.matmul.allow_tf32", lambda t: t.backends.cuda.matmul.allow_tf32),
        ("torch.backends.cudnn.allow_tf32", lambda t: t.backends.cudnn.allow_tf32),
        ("torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction",
         lambda t: t.backends.cuda.matmul.allow_fp16_reduced_precision_reduction),
        ("torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction",
         lambda t: t.backends.cuda.matmul.allow_bf16_reduced_precision_reduction),
    )

    def share_output(self, out: Any) -> SharedOutput | None:
        return _cuda_share.share_output(out)

    def open_output(self, fields: dict[str, Any], dtype: Any, shape: list[int], fd: int | None) -> Any:
        return _cuda_share.open_output(fields, dtype, shape, fd)

    def collect_shared(self) -> None:
        _cuda_share.collect_shared()

    @classmethod
    def device_started_here(cls) -> bool:
        """Has this process called cuInit? (cuDeviceGetCount answers CUDA_ERROR_NOT_INITIALIZED until then.)"""
        import ctypes

        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError:
            return False  # no driver, nothing to start
        count = ctypes.c_int(0)
        return lib.cuDeviceGetCount(ctypes.byref(count)) != 3


def gpu_memory_capacity(device: str) -> int:
    import torch

    return torch.cuda.get_device_properties(torch.device(device)).total_memory


def warm_gpu_libraries(device: str) -> None:
    """cuBLAS's bfloat16, float16 and float64 paths (0.14 s each on an H100) and cuDNN's start (0.44 s, any
    convolution), paid before a job rather than inside its verify or profile (bench/explore/first_use.py).

    Also the kernels that KernelBench's problems run most, which CUDA loads one by one on their first launch:
    float32 GEMMs at a size that picks the large-tile kernels of its published sizes (a first 4096^2 matmul still
    paid 49 ms, level2/80's forward 70 ms, in each fresh process), and common activations, softmax, norms and
    reductions (40 ms for six of them; H200, 2026-11-29)."""
    import torch

    expected = torch.randn(1 << 20, device=device)
    m = expected[: 256 * 256].view(256, 256)
    for dtype in (torch.bfloat16, torch.float16, torch.float64):
        torch.nn.functional.linear(m.to(dtype), m.to(dtype), m[0].to(dtype))
    big = torch.randn(2048, 2048, device=device)
    torch.nn.functional.linear(big, big, big[0])  # nn.Linear's x @ W.T
    torch.matmul(big, big)
    torch.bmm(big.view(4, 1024, 1024), big.view(4, 1024, 1024))
    x = expected[: 2 * 8 * 16 * 16].view(2, 8, 16, 16)
    torch.nn.functional.conv2d(x, x[:8, :8, :3, :3])
    _warm_common_kernels(torch, big)
    torch.cuda.synchronize()


def _warm_common_kernels(torch, x) -> None:
    """One call of each common float32 elementwise, softmax, norm and reduction kernel (on a 2-D tensor, over
    the last dimension and the first, as KernelBench's problems reduce)."""
    f = torch.nn.functional
    ops = (f.relu, f.gelu, lambda t: f.gelu(t, approximate="tanh"), torch.sigmoid, torch.tanh, f.silu, f.leaky_relu,
           f.elu, f.softplus, f.hardtanh, torch.exp, lambda t: torch.clamp(t, -1, 1), lambda t: t * 2 + 1,
           lambda t: t / (t.abs() + 1), lambda t: f.softmax(t, -1), lambda t: f.log_softmax(t, -1),
           lambda t: f.layer_norm(t, t.shape[-1:]), lambda t: f.batch_norm(t, None, None, training=True),
           lambda t: f.group_norm(t.view(4, 16, 256, 256), 4).view_as(t))
    for op in ops:  # one result alive at a time: the warm worker's allocator keeps what it reserved here
        y = op(x)
        for dim in (-1, 0):
            y.sum(dim), y.mean(dim), y.amax(dim), torch.max(y, dim).values, torch.argmax(y, dim)


def gpu_facts(backend: str) -> DeviceFacts:
    import torch

    props = torch.cuda.get_device_properties(0)
    return DeviceFacts(backend=backend, device_name=props.name, cores=props.multi_processor_count,
                       cache_bytes=getattr(props, "L2_cache_size", None), kind="gpu")


def measure_gpu_ceilings() -> dict:
    """Measured device-copy bandwidth and bf16/fp32 matmul rates (seconds; cached by the caller).

    Best of several runs after warm-up: a ceiling is what the device *can* do. fp32 is measured
    with TF32 off, the precision a strict fp32 reference uses.
    """
    import torch

    def best_ms(fn, reps: int) -> float:
        fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return min(times)

    src = torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda")  # 2 GiB, far past the L2
    dst = torch.empty_like(src)
    copy_ms = best_ms(lambda: dst.copy_(src), 10)
    bandwidth_gbs = 2 * src.numel() / (copy_ms / 1e3) / 1e9  # bytes read plus bytes written
    del src, dst
    n = 8192
    tflops = {}
    old_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        for dtype in (torch.bfloat16, torch.float32):
            a = torch.randn(n, n, device="cuda", dtype=dtype)
            b = torch.randn(n, n, device="cuda", dtype=dtype)
            ms = best_ms(lambda: torch.mm(a, b), 10)
            tflops[str(dtype).removeprefix("torch.")] = round(2 * n**3 / (ms / 1e3) / 1e12, 2)
            del a, b
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old_tf32
    torch.cuda.empty_cache()
    return {"peak_bandwidth_gbs": round(bandwidth_gbs, 1), "peak_tflops": tflops}
