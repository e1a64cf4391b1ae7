"""KForge on real KernelBench problems: its verdicts, timings and wall time against do_bench, ncu and KernelBench.

The instrument of issue 16. For each problem of a sample of KernelBench level-1/2 problems at their published
sizes, in one run, with the reference itself as the candidate (`class Model` renamed `ModelNew`):

  a. KForge through a real MCP client (`kforge serve` over stdio): verify_against_reference and profile_kernel
     (hardware_counters off), their wall times, the verdict, KForge's candidate median/IQR, its eager and
     torch.compile baselines and the self-speedup (1.00 expected) with whatever confidence fields it carries;
  b. `triton.testing.do_bench` (median, L2 flushed) of the reference's eager forward, in a helper process of
     this script (fp32, TF32 off, no_grad; inputs from torch.manual_seed(SEED) and get_inputs());
  c. Nsight Compute's gpu__time_duration.sum over the kernels of one forward (after warm-up), --cache-control
     all, --clock-control none (clocks as they run, like do_bench); also base (ncu's default) on the repeat problems;
  d. KernelBench's own eval_kernel_against_ref (5 correctness, 100 perf trials) timed by wall clock;
  e. for a few problems, the same candidate profiled in N separate calls: the spread of the medians.

Results (JSON with everything, and a Markdown table) go to $OUT if set, else bench/out/, rewritten after each
problem. One GPU command may run 10 minutes: --budget-s stops starting problems, --resume continues a sample
from the state file in bench/out/. --smoke runs 3 shrunken problems on the CPU backend (no do_bench, ncu,
KernelBench harness). On a GPU host use bench/run_kernelbench_sample.sh (after bench/prepare_kernelbench.sh).
"""

from __future__ import annotations

import argparse
import csv
import functools
import io
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SEED = 0  # seed of the helper's model and inputs (KForge draws its own secret ones)

DEFAULT_PROBLEMS = [
    "level1/19_ReLU", "level1/26_GELU_",                                           # elementwise
    "level1/47_Sum_reduction_over_a_dimension", "level1/51_Argmax_over_a_dimension",  # reductions
    "level1/36_RMSNorm_", "level1/40_LayerNorm", "level1/33_BatchNorm",              # norms
    "level1/23_Softmax", "level1/24_LogSoftmax",                                     # softmax
    "level1/1_Square_matrix_multiplication_", "level1/2_Standard_matrix_multiplication_",
    "level1/3_Batched_matrix_multiplication", "level1/4_Matrix_vector_multiplication_",  # matmul
    "level1/63_conv_standard_2D__square_input__square_kernel",
    "level1/57_conv_transposed_2D__square_input__square_kernel",                     # conv
    "level1/42_Max_Pooling_2D",                                                      # pooling
    "level2/76_Gemm_Add_ReLU", "level2/12_Gemm_Multiply_LeakyReLU", "level2/80_Gemm_Max_Subtract_GELU",
    "level2/17_Conv2d_InstanceNorm_Divide", "level2/52_Conv2d_Activation_BatchNorm",  # fused level 2
]
# Memory-bound, compute-bound and fused: the run-to-run spread of KForge's median on each kind.
DEFAULT_REPEAT_ON = ["level1/19_ReLU", "level1/1_Square_matrix_multiplication_", "level2/76_Gemm_Add_ReLU"]
# --smoke: module-level size constants rewritten in the source text, so a 2-core CPU runs them in seconds.
SMOKE = {
    "level1/19_ReLU": {"batch_size": "16", "dim": "1024"},
    "level1/23_Softmax": {"batch_size": "16", "dim": "1024"},
    "level2/76_Gemm_Add_ReLU": {"batch_size": "32", "in_features": "64", "out_features": "64"},
}
# Modules KernelBench's package imports at load time for its LLM clients, not for eval: stubbed where missing.
KB_OPTIONAL = ["dotenv", "tqdm", "openai", "litellm", "requests"]
SERVER_ENV_KEYS = ["PATH", "HOME", "LANG", "PYTHONPATH", "CXX", "CC", "CUDA_HOME", "CUDA_PATH", "CUDA_VISIBLE_DEVICES",
                   "LD_LIBRARY_PATH", "TMPDIR"]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------- problems

def problem_file(kb: Path, name: str) -> Path:
    """`level1/19_ReLU` (or `level1/19`) -> its file in the checkout."""
    level, _, stem = name.removesuffix(".py").partition("/")
    path = kb / "KernelBench" / level / f"{stem}.py"
    if not path.exists() and stem.isdigit():
        path = next(iter(sorted((kb / "KernelBench" / level).glob(f"{stem}_*.py"))), path)
    if not path.exists():
        raise FileNotFoundError(f"no KernelBench problem {name!r} under {kb / 'KernelBench'}")
    return path


def canonical(kb: Path, name: str) -> str:
    """`level1/19` -> `level1/19_ReLU`; an unknown name stays as given (its row will say why)."""
    try:
        path = problem_file(kb, name)
    except FileNotFoundError:
        return name.removesuffix(".py")
    return f"{path.parent.name}/{path.stem}"


def load_source(kb: Path, name: str, sizes: dict[str, str] | None) -> str:
    src = problem_file(kb, name).read_text()
    for key, value in (sizes or {}).items():
        src, n = re.subn(rf"^{key}\s*=.*$", f"{key} = {value}", src, flags=re.M)
        if n == 0:
            raise ValueError(f"{name}: no module-level `{key} = ...` to resize")
    return src


def as_candidate(ref: str) -> str:
    """The reference as a KernelBench candidate: `Model` (class and every use, e.g. super(Model, ...)) -> ModelNew."""
    return re.sub(r"\bModel\b", "ModelNew", ref)


# The reference's forward captured in one CUDA graph per input signature and replayed: its launches issued once, at
# capture, so its call is device-bound whatever the host's pace (the reverse of a host-paced eager network). Each call
# copies its inputs into the graph's buffers and returns a copy of the graph's outputs: computed from this call's data.
_GRAPHED = """

class ModelNew(Model):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._graphs = {}

    def forward(self, *args):
        import torch
        key = tuple((a.shape, a.dtype) if isinstance(a, torch.Tensor) else a for a in args)
        if key not in self._graphs:
            static = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # the libraries' first uses, outside the capture
                for _ in range(2):
                    super().forward(*static)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = super().forward(*static)
            self._graphs[key] = (graph, static, out)
        graph, static, out = self._graphs[key]
        for buffer, a in zip(static, args):
            if isinstance(a, torch.Tensor):
                buffer.copy_(a)
        graph.replay()
        return tuple(o.clone() for o in out) if isinstance(out, (tuple, list)) else out.clone()
"""


def graphed_candidate(ref: str) -> str:
    """The reference with a ModelNew that replays its forward from a CUDA graph (`_GRAPHED`)."""
    return ref + _GRAPHED


CANDIDATES = {"reference": as_candidate, "graphed": graphed_candidate}


def _tensor_bytes(obj) -> int:
    import torch
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(o) for o in obj)
    return 0


def footprint(src: str) -> dict:
    """Bytes of inputs, outputs and parameters, from shapes alone (the meta device allocates nothing)."""
    import torch
    ns: dict = {}
    try:
        exec(compile(src, "<reference>", "exec"), ns)
    except Exception as exc:  # noqa: BLE001 - a module this host lacks (Mamba2's einops): KForge's verify says so
        return {"inputs_bytes": 0, "params_bytes": 0, "outputs_bytes": 0, "bytes": 0,
                "note": f"not counted (the reference did not load here: {exc!r:.200})"}
    with torch.device("meta"), torch.no_grad():
        inputs = ns["get_inputs"]()
        fp = {"inputs_bytes": _tensor_bytes(inputs)}
        try:
            model = ns["Model"](*ns["get_init_inputs"]())
        except Exception as exc:  # noqa: BLE001 - a constructor that reads values (Swin's .item()): inputs only
            fp.update(params_bytes=0, outputs_bytes=0, bytes=fp["inputs_bytes"],
                      note=f"parameters and outputs not counted (meta constructor failed: {exc!r:.200})")
            return fp
        fp["params_bytes"] = _tensor_bytes(list(model.state_dict().values()))
        try:
            fp["outputs_bytes"] = _tensor_bytes(model(*inputs))
        except Exception as exc:  # noqa: BLE001 - an op without a meta kernel: count the inputs only
            fp["outputs_bytes"], fp["note"] = 0, f"outputs not counted (meta forward failed: {exc!r:.200})"
    fp["bytes"] = fp["inputs_bytes"] + fp["outputs_bytes"]
    return fp


# ---------------------------------------------------------------- helper processes (torch only, no kforge)

def _build(src: str, device: str):
    import torch
    ns: dict = {}
    exec(compile(src, "<reference>", "exec"), ns)
    torch.manual_seed(SEED)
    model = ns["Model"](*ns["get_init_inputs"]()).to(device)
    torch.manual_seed(SEED)
    inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in ns["get_inputs"]()]
    return model, inputs


def import_kernelbench(kb_src: str):
    """KernelBench's eval from the checkout; its package imports LLM clients at load time: stub the missing ones."""
    import importlib.util
    import types

    class Stub(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return Stub(f"{self.__name__}.{name}")

        def __call__(self, *args, **kwargs):
            return None

    stubbed = [m for m in KB_OPTIONAL if importlib.util.find_spec(m) is None]
    for m in stubbed:
        sys.modules[m] = Stub(m)
    sys.path.insert(0, kb_src)
    from kernelbench.eval import eval_kernel_against_ref  # noqa: PLC0415
    return eval_kernel_against_ref, stubbed


def _host_busy_cpu_s() -> float:
    """Busy CPU seconds of the whole host so far (all cores, not idle nor waiting on I/O), from /proc/stat."""
    fields = [float(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    return (sum(fields) - idle) / os.sysconf("SC_CLK_TCK")


class HarnessPhases:
    """Where KernelBench's eval_kernel_against_ref spends its wall time, and what else the host did meanwhile.

    Its module's own functions are wrapped for the one run (KernelBench's code is not changed): each call of the
    problem's `get_inputs` (host RNG: 5 correctness trials and one before each of its two timing loops), its
    correctness check (which includes those trials' `get_inputs`), and its timing loops (the candidate, then the
    reference for its excessive-speedup check). The host's CPU seconds over the run, less this process's own, are the
    other processes' (a KForge server's background work, say)."""

    def __init__(self, kb_eval) -> None:
        self.kb_eval, self.saved, self.out = kb_eval, {}, {"get_inputs_s": [], "timing_s": [], "correctness_s": []}

    def _patch(self, name: str, wrap) -> None:
        self.saved[name] = getattr(self.kb_eval, name)
        setattr(self.kb_eval, name, wrap(self.saved[name]))

    def __enter__(self):
        out = self.out

        def timed_list(fn, key):
            @functools.wraps(fn)
            def call(*a, **kw):
                t = time.perf_counter()
                try:
                    return fn(*a, **kw)
                finally:
                    out[key].append(round(time.perf_counter() - t, 3))
            return call

        def loader(fn):
            @functools.wraps(fn)
            def load(*a, **kw):
                model, init_inputs, get_inputs = fn(*a, **kw)
                return model, init_inputs, timed_list(get_inputs, "get_inputs_s")
            return load

        self._patch("load_original_model_and_inputs", loader)
        self._patch("run_and_check_correctness", lambda fn: timed_list(fn, "correctness_s"))
        timing = self.kb_eval.timing
        self.saved_timing = timing.get_timing_function
        timing.get_timing_function = lambda *a, **kw: timed_list(self.saved_timing(*a, **kw), "timing_s")
        self.t0, self.busy0, self.own0 = time.perf_counter(), _host_busy_cpu_s(), time.process_time()
        return self

    def __exit__(self, *exc):
        wall, own = time.perf_counter() - self.t0, time.process_time() - self.own0
        busy = _host_busy_cpu_s() - self.busy0
        for name, fn in self.saved.items():
            setattr(self.kb_eval, name, fn)
        self.kb_eval.timing.get_timing_function = self.saved_timing
        checks = self.out["correctness_s"]  # called once: its time, as a number
        others = round(max(0.0, busy - own) / wall, 2) if wall else None
        self.out.update(correctness_s=round(sum(checks), 3) if checks else None, wall_s=round(wall, 3),
                        own_cpu_s=round(own, 2), others_busy_cores=others, host_cores=os.cpu_count())
        return False


def helper_local(spec: dict) -> dict:
    """do_bench, then KernelBench's harness, in this fresh process (`dry`, on CPU: load everything, time nothing).

    The result file is rewritten after each step, so a step killed at the deadline leaves the others' numbers.
    KernelBench runs second, with CUDA and its libraries already warm: the field's harness at its fastest.
    """
    import gc

    import torch
    out: dict = {"seed": SEED}
    put = lambda: Path(spec["out"]).write_text(json.dumps(out, default=str))  # noqa: E731
    t = time.perf_counter()
    try:
        eval_fn, out["kb_stubbed_modules"] = import_kernelbench(spec["kb_src"])
        out["kb_import_s"] = round(time.perf_counter() - t, 2)
    except Exception as exc:  # noqa: BLE001
        eval_fn, out["kb_error"] = None, f"import kernelbench.eval failed: {exc!r}"[:800]
    if spec["dry"]:
        model, inputs = _build(spec["src"], "cpu")
        with torch.no_grad():
            model(*inputs)
        out["dry"] = "built the model and ran one CPU forward; do_bench and the KernelBench harness need a GPU"
        return out
    flags = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        import triton.testing
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        model, inputs = _build(spec["src"], "cuda")
        with torch.no_grad():
            # The problem's own working set, as any harness running it in one process sees it: parameters,
            # inputs and what one forward allocates (MaxPool2d's int64 indices, a fused model's intermediates).
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            model(*inputs)
            torch.cuda.synchronize()
            out["reference_peak_gb"] = round(torch.cuda.max_memory_allocated() / 1e9, 3)
            ms = triton.testing.do_bench(lambda: model(*inputs), return_mode="median")
        out["do_bench_median_us"] = round(ms * 1e3, 3)
        del model, inputs
    except Exception as exc:  # noqa: BLE001
        out["do_bench_error"] = f"{exc!r}"[:800]
    # KernelBench as the field runs it: torch's default precision flags (cuDNN may use TF32 in convolutions).
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags
    gc.collect()
    torch.cuda.empty_cache()
    put()
    if eval_fn is not None:
        t = time.perf_counter()
        try:
            with HarnessPhases(sys.modules["kernelbench.eval"]) as phases:
                res = eval_fn(spec["src"], as_candidate(spec["src"]), num_correct_trials=5, num_perf_trials=100,
                              measure_performance=True, backend="cuda")
            out["kb_harness_s"], out["kb_phases"] = round(time.perf_counter() - t, 3), phases.out
            if res is None:
                out["kb_error"] = "eval_kernel_against_ref returned None (a build lock error; retry)"
            else:
                r = json.loads(json.dumps(res.model_dump(), default=str))
                out["kb"] = {k: r.get(k) for k in ("compiled", "correctness", "runtime", "runtime_stats",
                                                   "ref_runtime", "ref_runtime_stats", "metadata")}
        except Exception as exc:  # noqa: BLE001
            out["kb_harness_s"], out["kb_error"] = round(time.perf_counter() - t, 3), f"{exc!r}"[:800]
    return out


def _build_candidate(cand: str, model):
    """The candidate's ModelNew with the reference model's weights (as KForge's verify gives it them)."""
    ns: dict = {}
    exec(compile(cand, "<candidate>", "exec"), ns)
    new = ns["ModelNew"](*ns["get_init_inputs"]()).to(next(model.parameters()).device)
    new.load_state_dict(model.state_dict(), strict=False)
    return new


def _do_bench_reference(src: str, runs: int, candidate: str | None = None) -> dict:
    """do_bench of one problem's reference in this process (TF32 off, no_grad): the median of `runs` runs, each
    run's median kept; a failure is the answer. With `candidate` (a ModelNew source that is not the reference), the
    candidate too, right after the reference in each run: their ratio per run is the speedup do_bench sees in one
    process. Its memory is freed before the next problem."""
    import gc

    import torch
    import triton.testing
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    model = inputs = new = None
    try:
        model, inputs = _build(src, "cuda")
        new = _build_candidate(candidate, model) if candidate else None
        from kforge.backends._nvidia import LaunchProbe  # the pace KForge's workers read, read here the same way
        probe, times, launch_us, cand_times = LaunchProbe(), [], [], []
        with torch.no_grad():
            for _ in range(runs):  # the host's launch pace just before each run: a host-paced call moves with it
                torch.cuda.synchronize()
                launch_us.append(round(probe(), 2))
                times.append(round(triton.testing.do_bench(lambda: model(*inputs), return_mode="median") * 1e3, 3))
                if new is not None:
                    cand_times.append(round(triton.testing.do_bench(lambda: new(*inputs), return_mode="median") * 1e3, 3))
        got = {"do_bench_median_us": statistics.median(times), "do_bench_launch_us": statistics.median(launch_us)}
        if runs > 1:
            got["do_bench_runs_us"], got["do_bench_runs_launch_us"] = times, launch_us
        if cand_times:
            speedups = [round(t / c, 4) for t, c in zip(times, cand_times)]
            got.update(do_bench_candidate_us=statistics.median(cand_times), do_bench_candidate_runs_us=cand_times,
                       do_bench_speedup=statistics.median(speedups), do_bench_speedup_runs=speedups)
    except Exception as exc:  # noqa: BLE001 - one problem's failure is its row's note
        got = {"do_bench_error": f"{exc!r}"[:800]}
    model = inputs = new = None
    gc.collect()
    torch.cuda.empty_cache()
    return got


def helper_do_bench_many(spec: dict) -> dict:
    """--sweep: do_bench of each problem's reference, one after another in this one process (a process a problem
    would cost its torch import and CUDA start each), the result file rewritten after each problem."""
    out: dict = {}
    for name, src in spec["srcs"].items():
        out[name] = _do_bench_reference(src, runs=1)
        Path(spec["out"]).write_text(json.dumps(out, default=str))
    return out


def helper_do_bench_serve() -> None:
    """--sweep: do_bench of one problem's reference per line read (JSON {"src": ...}), one JSON line written back,
    in a process kept for the whole run: each problem is timed right after KForge profiled it (the host in the
    same state), and no problem waits for a helper's torch import. A problem's failure is its answer, not the end."""
    import torch  # noqa: F401 - before "ready": the first request does not pay the import
    import triton.testing  # noqa: F401
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        t = time.perf_counter()
        try:  # three runs, their median: one run can land on the pool's refill of a worker
            ask = json.loads(line)
            got = _do_bench_reference(ask["src"], runs=3, candidate=ask.get("candidate"))
        except (ValueError, KeyError) as exc:  # not a request this parent sends
            got = {"do_bench_error": f"{exc!r}"[:800]}
        print(json.dumps({**got, "do_bench_s": round(time.perf_counter() - t, 2)}), flush=True)


class DoBenchServer:
    """The parent's end of `helper_do_bench_serve`: started at the first request, killed (and restarted at the next)
    when one overruns its time, closed at the end of the run."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None

    def _ask(self, src: str, timeout: float, candidate: str | None = None) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--_do_bench_serve"],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                         start_new_session=True)
            self._line(timeout)  # {"ready": true}: torch imported
        self.proc.stdin.write(json.dumps({"src": src, "candidate": candidate}) + "\n")
        self.proc.stdin.flush()
        return json.loads(self._line(timeout))

    def _line(self, timeout: float) -> str:
        proc = self.proc
        timer = threading.Timer(timeout, self.close)  # a hung helper: killing it ends the read with EOF
        timer.start()
        try:
            line = proc.stdout.readline()
        finally:
            timer.cancel()
        if not line:
            if self.proc is None:
                raise TimeoutError(f"do_bench helper gave no answer within {timeout:.0f} s (killed)")
            raise RuntimeError(f"do_bench helper exited (rc {proc.wait()}) without an answer: see the log")
        return line

    def ask(self, src: str, timeout: float, candidate: str | None = None) -> dict:
        try:
            return self._ask(src, max(timeout, 1), candidate)
        except Exception as exc:  # noqa: BLE001 - the row's note; the next request starts a new helper
            self.close()
            return {"do_bench_error": f"{exc!r}"[:800]}

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc = None


def helper_ncu_target(spec: dict) -> None:
    """Warm up, then exactly one forward between cudaProfilerStart/Stop (ncu runs with --profile-from-start off)."""
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model, inputs = _build(spec["src"], "cuda")
    with torch.no_grad():
        for _ in range(3):
            model(*inputs)
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        model(*inputs)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()


def helper_env() -> dict:
    import platform

    import torch
    env = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
           "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None}
    try:
        import triton
        env["triton"] = triton.__version__
    except Exception as exc:  # noqa: BLE001
        env["triton"] = f"unavailable: {exc!r}"[:200]
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env.update(device=p.name, memory_bytes=p.total_memory, capability=f"{p.major}.{p.minor}")
        smi = run_cmd(["nvidia-smi", "--query-gpu=driver_version,clocks.max.sm", "--format=csv,noheader"], 30)
        env["driver"] = smi["out"].strip().splitlines()[0] if smi["rc"] == 0 and smi["out"].strip() else smi["out"][-200:]
    else:
        env.update(device=f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)",
                   memory_bytes=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    if shutil.which("ncu"):
        env["ncu"] = (run_cmd(["ncu", "--version"], 60)["out"].strip().splitlines() or ["?"])[-1]
    return env


def run_cmd(cmd: list[str], timeout: float, **kw) -> dict:
    """Run in its own session; on timeout kill the whole group (ncu and its target, say). Never raises."""
    t = time.perf_counter()
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True, **kw)
    except OSError as exc:
        return {"rc": None, "out": repr(exc), "s": 0.0}
    try:
        out, _ = proc.communicate(timeout=max(timeout, 1))
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, _ = proc.communicate()
        return {"rc": None, "out": (out or "") + f"\n[killed after {timeout:.0f} s]", "s": time.perf_counter() - t}
    return {"rc": proc.returncode, "out": out or "", "s": round(time.perf_counter() - t, 2)}


def run_helper(mode: str, spec: dict, timeout: float) -> dict:
    """This script in a fresh process (its GPU memory is freed on exit, its time limit enforced)."""
    with tempfile.TemporaryDirectory() as tmp:
        spec_path, out_path = Path(tmp) / "spec.json", Path(tmp) / "out.json"
        spec_path.write_text(json.dumps({**spec, "out": str(out_path)}))
        res = run_cmd([sys.executable, str(Path(__file__).resolve()), f"--_{mode}", str(spec_path)], timeout)
        got = json.loads(out_path.read_text()) if out_path.exists() else {}
        if res["rc"] != 0:  # killed or crashed: keep what it wrote before, and say why it stopped
            got["error"] = f"helper {mode} rc={res['rc']}: {res['out'][-1500:]}"
        return {**got, "process_s": res["s"]}


# ---------------------------------------------------------------- Nsight Compute

_UNIT_US = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6,
            "": 1e-3}  # --print-units base: nanoseconds


def parse_ncu_csv(text: str) -> dict:
    """The sum of gpu__time_duration.sum over the launches in `ncu --import R --csv` output (raw or details page)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
    rows = [r for r in csv.reader(io.StringIO("\n".join(lines[start:]))) if r]
    header = rows[0]
    name_col = header.index("Kernel Name") if "Kernel Name" in header else None
    if "gpu__time_duration.sum" in header:  # raw page: a column per metric, a row of units, a row per launch
        col = header.index("gpu__time_duration.sum")
        unit = rows[1][col] if len(rows) > 1 and rows[1][0] == "" else "nsecond"
        launches = [(r, r[col], unit) for r in rows[1:] if r[0] != "" and len(r) > col]
    else:  # details page: a row per (launch, metric)
        mn, mu, mv = (header.index(c) for c in ("Metric Name", "Metric Unit", "Metric Value"))
        launches = [(r, r[mv], r[mu]) for r in rows[1:] if r[mn] in ("gpu__time_duration.sum", "Duration")]
    if not launches:
        raise ValueError("no gpu__time_duration.sum values")
    us = [float(v.replace(",", "")) * _UNIT_US[u.strip()] for _, v, u in launches]
    return {"sum_us": round(sum(us), 3), "launches": len(us), "unit": launches[0][2],
            "kernels": [r[name_col][:80] for r, _, _ in launches[:8]] if name_col is not None else []}


def ncu_forward(src: str, clock: str, timeout: float) -> dict:
    ncu = shutil.which("ncu")
    if ncu is None:
        return {"error": "ncu not on PATH"}
    t = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "spec.json"
        spec.write_text(json.dumps({"src": src}))
        rep = Path(tmp) / "fwd"
        res = run_cmd([ncu, "--profile-from-start", "off", "--metrics", "gpu__time_duration.sum", "--cache-control", "all",
                       "--clock-control", clock, "-o", str(rep), "--force-overwrite", sys.executable,
                       str(Path(__file__).resolve()), "--_ncu_target", str(spec)], timeout)
        if not Path(f"{rep}.ncu-rep").exists():
            return {"error": f"ncu rc={res['rc']}: {res['out'][-1200:]}", "clock_control": clock}
        for page in ("raw", "details"):
            csv_out = run_cmd([ncu, "--import", f"{rep}.ncu-rep", "--csv", "--page", page, "--print-units", "base"], 120)
            try:
                parsed = parse_ncu_csv(csv_out["out"])
                break
            except (StopIteration, ValueError, IndexError, KeyError) as exc:
                parsed = {"error": f"could not read ncu's CSV ({exc!r}): {csv_out['out'][-800:]}"}
    return {**parsed, "clock_control": clock, "wall_s": round(time.perf_counter() - t, 1)}


# ---------------------------------------------------------------- KForge over MCP

class Timeout(Exception):
    pass


async def call_kforge(client, tool: str, args: dict, deadline: float, job: dict) -> tuple[dict, float]:
    """One tool call as a client sees it: retry while busy, follow a job handle with get_job, cancel at the deadline."""
    import anyio
    t0 = time.monotonic()

    def wait_s() -> float:  # leave time to cancel the job before the deadline
        left = deadline - time.monotonic() - 10
        if left <= 0:
            raise Timeout(f"{tool}: deadline reached")
        return min(60.0, left)

    while True:
        res = await client.call_tool(tool, {**args, "wait_s": wait_s()})
        sc = res.structured_content or {}
        if res.is_error:
            raise RuntimeError(f"{tool}: {res.content[0].text if res.content else 'error'}"[:1500])
        if sc.get("status") != "busy":
            break
        await anyio.sleep(min(sc.get("retry_after_s") or 2.0, 10.0))
    while sc.get("status") in ("queued", "running"):
        job["id"] = sc["job_id"]
        res = await client.call_tool("get_job", {"job_id": sc["job_id"], "wait_s": wait_s()})
        sc = res.structured_content or {}
        if res.is_error:
            raise RuntimeError(f"{tool} (get_job): {res.content[0].text if res.content else 'error'}"[:1500])
    job["id"] = None
    return sc, round(time.monotonic() - t0, 2)


def _speedup_fields(b: dict) -> dict:
    """A baseline's speedup and every other field beside it (confidence intervals included, whatever their names)."""
    return {k: v for k, v in b.items() if k not in ("name", "timing")}


def summarize_profile(sc: dict) -> dict:
    rep = sc.get("report") or {}
    cand = rep.get("candidate") or {}
    base = {b.get("name"): b for b in rep.get("baselines") or []}
    out = {"ok": sc.get("ok"), "output_correct": sc.get("output_correct"), "speedup_trusted": sc.get("speedup_trusted"),
           "candidate": cand, "warnings": sc.get("warnings"), "seconds": sc.get("seconds"),
           "launches_per_call": rep.get("launches_per_call"), "host_launches_per_call": rep.get("host_launches_per_call"),
           "device_us_per_call": rep.get("device_us_per_call"),
           "host_paced": rep.get("host_paced"),
           "failure": sc.get("failure"),
           "checks_not_pass": [c for c in sc.get("checks") or [] if c.get("status") != "pass"]}
    for name, b in base.items():
        out[name] = {"median_us": (b.get("timing") or {}).get("median_us"), "timing": b.get("timing"),
                     **_speedup_fields(b)}
    # Top-level fields the lead may add (speedup_ci, ...), whatever they are called.
    out["extra"] = {k: v for k, v in sc.items() if k not in {"spec", "report", "checks", "kernel_resources", "artifacts",
                                                            "output_check", "profile_id", *out}}
    return out


async def late_baseline(client, sc: dict, name: str, wait_s: float = 60.0) -> dict | None:
    """A baseline the profile answered without (`pending`: a new problem's torch.compile, compiled ahead), read from
    the stored profile (`kforge://profiles/{id}`) once it was added: its speedup, and how long after the profile
    answered. None when the profile had it already."""
    import anyio
    pending = [b for b in (sc.get("report") or {}).get("baselines") or [] if b.get("name") == name and b.get("pending")]
    if not pending or not sc.get("profile_id"):
        return None
    t0 = time.monotonic()
    while time.monotonic() - t0 < wait_s:
        res = await client.read_resource(f"kforge://profiles/{sc['profile_id']}")
        stored = json.loads(res.contents[0].text)
        b = {x.get("name"): x for x in (stored.get("report") or {}).get("baselines") or []}.get(name) or {}
        if not b.get("pending"):
            return {"read_after_s": round(time.monotonic() - t0, 2), "added_after_s": b.get("added_after_s"),
                    "error": b.get("error"), "median_us": (b.get("timing") or {}).get("median_us"),
                    "speedup_trusted": stored.get("speedup_trusted"), **_speedup_fields(b)}
        await anyio.sleep(0.25)
    return {"error": f"still pending after {wait_s:.0f} s"}


def summarize_verify(sc: dict) -> dict:
    return {"ok": sc.get("ok"), "correct": sc.get("correct"), "seconds": sc.get("seconds"),
            "trials": [t.get("correct") for t in sc.get("trials") or []], "warnings": sc.get("warnings"),
            "failure": sc.get("failure"), "from_store": sc.get("from_store"),
            "checks_not_pass": [c for c in sc.get("checks") or [] if c.get("status") != "pass"]}


# ---------------------------------------------------------------- one problem

def smi_index() -> str:
    """nvidia-smi's index of the GPU this run uses: the first of CUDA_VISIBLE_DEVICES (a shard runs on one GPU; the
    runner sets CUDA_DEVICE_ORDER=PCI_BUS_ID so that CUDA's and nvidia-smi's numbering agree), else 0."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
    return first if first.isdigit() else "0"


# nvidia-smi's clocks_event_reasons bits (nvml.h, nvmlClocksEventReason*): why the SM clock is below its maximum.
CLOCK_EVENTS = {0x1: "idle", 0x2: "application clocks setting", 0x4: "SW power cap", 0x8: "HW slowdown",
                0x10: "sync boost", 0x20: "SW thermal slowdown", 0x40: "HW thermal slowdown",
                0x80: "HW power brake slowdown", 0x100: "display clock setting"}
SLOWDOWNS = 0x4 | 0x8 | 0x20 | 0x40 | 0x80  # the reasons that slow a kernel that wants the clock


@functools.cache  # one nvidia-smi per run, not two per verify and profile
def _smi_fields() -> list[str]:
    """memory.used first (the poll's purpose), then the SM clock, power and the clock's event reasons where this
    nvidia-smi knows them (an older one names the reasons clocks_throttle_reasons), else memory alone."""
    for reasons in ("clocks_event_reasons.active", "clocks_throttle_reasons.active"):
        fields = ["memory.used", "clocks.sm", "power.draw", reasons]
        done = subprocess.run(["nvidia-smi", "--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits", "-i",
                               smi_index()], capture_output=True, text=True, timeout=30)
        if done.returncode == 0 and done.stdout.count(",") == len(fields) - 1:
            return fields
    return ["memory.used"]


def _clock_summary(samples: list[dict[str, str]]) -> dict:
    """The SM clock (MHz) and power (W) over the block's samples, and every clock event reason seen: whether the GPU
    ran below its clock while it was timed (a power cap or heat makes one kernel run at two speeds)."""
    def numbers(key: str) -> list[float]:
        out = []
        for s in samples:
            try:
                out.append(float(s.get(key, "")))
            except ValueError:
                continue  # "[N/A]"
        return sorted(out)

    clocks, power = numbers("clocks.sm"), numbers("power.draw")
    seen = 0
    for s in samples:
        for key in ("clocks_event_reasons.active", "clocks_throttle_reasons.active"):
            try:
                seen |= int(s.get(key, ""), 16)
            except ValueError:
                pass
    if not clocks:
        return {}
    return {"sm_clock_mhz": [clocks[0], clocks[len(clocks) // 2], clocks[-1]], "power_w_max": power[-1] if power else None,
            "clock_events": [name for bit, name in CLOCK_EVENTS.items() if seen & bit],
            "slowed": bool(seen & SLOWDOWNS)}


class GpuMemory:
    """Peak device memory in use during a block, from `nvidia-smi` polled every 100 ms (an independent reading:
    every process on the GPU counts, KForge's workers included), above what was in use when it started."""

    def __enter__(self):
        self.proc = None
        self.apps: list[dict[int, int]] = []  # snapshots of memory per process (MiB), to say whose the peak is
        if shutil.which("nvidia-smi"):
            self.fields = _smi_fields()
            self.proc = subprocess.Popen(["nvidia-smi", "--query-gpu=" + ",".join(self.fields),
                                          "--format=csv,noheader,nounits", "-lms", "100", "-i", smi_index()],
                                         stdout=subprocess.PIPE, text=True)
            self.stop = threading.Event()
            self.thread = threading.Thread(target=self._poll_apps, daemon=True)
            self.thread.start()
        return self

    def _poll_apps(self) -> None:
        while not self.stop.is_set():
            try:
                out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits",
                                      "-i", smi_index()], capture_output=True, text=True, timeout=10).stdout
                self.apps.append({int(a): int(b) for a, b in (ln.split(",") for ln in out.splitlines() if "," in ln)})
            except (OSError, ValueError, subprocess.SubprocessError):
                return
            self.stop.wait(0.05)

    def __exit__(self, *exc):
        self.mib, self.clocks = [], []
        if self.proc is not None:
            self.stop.set()
            self.thread.join(timeout=15)
            self.proc.terminate()
            out, _ = self.proc.communicate(timeout=10)
            rows = [[v.strip() for v in line.split(",")] for line in out.splitlines() if line.count(",") ==
                    len(self.fields) - 1]
            self.mib = [int(r[0]) for r in rows if r[0].isdigit()]
            self.clocks = [dict(zip(self.fields[1:], r[1:])) for r in rows if r[0].isdigit()]

    def summary(self, footprint_bytes: int) -> dict:
        if not self.mib:
            return {"error": "nvidia-smi not available"}
        peak = (max(self.mib) - self.mib[0]) * 2**20
        out = {"peak_above_start_gb": round(peak / 1e9, 3), "x_footprint": round(peak / footprint_bytes, 2)
               if footprint_bytes else None, "samples": len(self.mib), **_clock_summary(self.clocks)}
        if self.apps:
            # Each process at the snapshot with the most memory in all, largest first, in GB: what it held and how
            # much of that it took during the call (the job's workers come warm from the pool, so they were there).
            start, top = self.apps[0], max(self.apps, key=lambda snap: sum(snap.values()))
            gb = lambda mib: round(mib * 2**20 / 1e9, 2)  # noqa: E731
            out["processes_at_peak_gb"] = sorted(([gb(m), gb(m - start.get(pid, 0))] for pid, m in top.items()),
                                                 reverse=True)
        return out


class TraceSpan:
    """Seconds per worker op (KFORGE_TRACE lines the server wrote during the block): where the time went."""

    def __init__(self, path: Path | None) -> None:
        self.path = path

    def __enter__(self):
        self.start = self.path.stat().st_size if self.path and self.path.exists() else 0
        return self

    def __exit__(self, *exc):
        pass

    def _lines(self) -> list[dict]:
        if not self.path or not self.path.exists():
            return []
        with open(self.path) as f:
            f.seek(self.start)
            return [json.loads(x) for x in f if x.strip()]

    def summary(self) -> dict:
        ops: dict[str, float] = {}
        for e in self._lines():
            key = f"{e['role']}.{e['op']}"
            ops[key] = round(ops.get(key, 0.0) + e["s"], 3)
        return dict(sorted(ops.items(), key=lambda kv: -kv[1]))

    def details(self) -> dict:
        """The ops in the order they started (seconds from the first), and each op's highest device-memory peak
        (GB reserved by that worker during the op): where the wall time and the memory went."""
        lines = sorted(self._lines(), key=lambda e: e["at"])
        t0 = lines[0]["at"] if lines else 0.0
        peaks: dict[str, float] = {}
        allocated: dict[str, float] = {}
        for e in lines:
            if "peak_gb" in e:
                key = f"{e['role']}.{e['op']}"
                peaks[key] = max(peaks.get(key, 0.0), e["peak_gb"])
                allocated[key] = max(allocated.get(key, 0.0), e.get("peak_allocated_gb") or 0.0)
        return {"timeline": [[round(e["at"] - t0, 3), e["s"], f"{e['role']}.{e['op']}", e.get("peak_gb"),
                              e.get("peak_allocated_gb")] for e in lines],
                "peak_gb": dict(sorted(peaks.items(), key=lambda kv: -kv[1])),
                "peak_allocated_gb": dict(sorted(allocated.items(), key=lambda kv: -kv[1]))}


async def measure(client, args, name: str, row: dict, deadline: float, job: dict, save) -> None:
    import anyio
    src = load_source(args.kernelbench, name, SMOKE.get(name) if args.smoke else None)
    fp = footprint(src)
    row["footprint"] = {**fp, "gb": round(fp["bytes"] / 1e9, 3)}
    limit = args.max_footprint_frac * args.env["memory_bytes"]
    if fp["bytes"] > limit:
        row["skipped"] = f"skipped: footprint {fp['bytes'] / 1e9:.1f} GB > {args.max_footprint_frac} x " \
                         f"{args.env['memory_bytes'] / 1e9:.1f} GB"
        return
    cand = CANDIDATES[args.candidate](src)
    common = {"backend": args.backend, "reference_code": src, "candidate_code": cand}

    def left() -> float:
        return deadline - time.monotonic()

    if args.compile_first:
        # An agent that builds its candidate against the reference before it verifies: the compile launches it once
        # on the reference's inputs (and, with KFORGE_WARM_BASELINES, starts the torch.compile baseline's compile).
        log(f"{name}: compile with the reference")
        with TraceSpan(args.trace) as span:
            sc, row["compile_s"] = await call_kforge(client, "compile_kernel", {**common, "use_store": False},
                                                     deadline, job)
        row["compile_ok"], row["compile_ops"] = sc.get("ok"), span.summary()
        save()
        log(f"{name}: compile {row['compile_s']} s, ok={sc.get('ok')}")
    log(f"{name}: verify ({row['footprint']['gb']} GB)")
    with GpuMemory() as mem, TraceSpan(args.trace) as span:
        sc, row["verify_s"] = await call_kforge(client, "verify_against_reference", {**common, "use_store": False},
                                                deadline, job)
    row["verify"] = summarize_verify(sc)
    row["verify_memory"], row["verify_ops"] = mem.summary(fp["bytes"]), span.summary()
    row["verify_trace"] = span.details()
    save()
    log(f"{name}: verify {row['verify_s']} s, correct={sc.get('correct')}, device memory {row['verify_memory']}; profile")
    prof = {**common, "hardware_counters": False, "use_store": False}
    if args.baselines:
        prof["baselines"] = args.baselines
    if args.turn_s > 0:  # an agent's turn between reading the verify and asking for the profile
        await anyio.sleep(args.turn_s)
    with GpuMemory() as mem, TraceSpan(args.trace) as span:
        sc, row["profile_s"] = await call_kforge(client, "profile_kernel", prof, deadline, job)
    row["profile"], sc_first = summarize_profile(sc), sc
    row["profile_memory"], row["profile_ops"] = mem.summary(fp["bytes"]), span.summary()
    row["profile_trace"] = span.details()
    save()
    log(f"{name}: profile {row['profile_s']} s, median {row['profile']['candidate'].get('median_us')} us")
    if args.sweep:  # held-out problems: one verify and one profile each, then do_bench of the reference
        if not args.smoke:
            row["local"] = await anyio.to_thread.run_sync(
                args.do_bench.ask, src, deadline - time.monotonic(), None if args.candidate == "reference" else cand,
                abandon_on_cancel=True)
            log(f"{name}: do_bench {row['local'].get('do_bench_median_us') or row['local'].get('do_bench_error')}")
        return
    # An agent's next candidate for the same problem: new code (nothing from the store), same reference, so
    # a torch.compile baseline timed minutes ago is reused if the eager canary still agrees.
    again = {**common, "candidate_code": cand + "\n# the agent's next candidate\n", "use_store": False}
    with TraceSpan(args.trace) as span:
        _sc, row["next_verify_s"] = await call_kforge(client, "verify_against_reference", again, deadline, job)
    row["next_verify_ops"], row["next_verify_trace"] = span.summary(), span.details()
    with TraceSpan(args.trace) as span:
        sc, row["next_profile_s"] = await call_kforge(client, "profile_kernel", {**again, "hardware_counters": False},
                                                      deadline, job)
    row["next_profile_ops"], row["next_profile_trace"] = span.summary(), span.details()
    row["next_profile"] = summarize_profile(sc)
    save()
    log(f"{name}: next candidate: verify {row['next_verify_s']} s, profile {row['next_profile_s']} s")
    row["late_compile"] = await late_baseline(client, sc_first, "torch.compile")
    if args.think_s > 0:
        # An agent takes seconds to write its next candidate: the pool's refills of the call before are done by
        # then, where the back-to-back candidate above meets them (4 forks per verify + profile, ~1.8 s each).
        await anyio.sleep(args.think_s)
        third = {**common, "candidate_code": cand + "\n# the agent's candidate after a pause\n", "use_store": False}
        with TraceSpan(args.trace) as span:
            _sc, row["paused_verify_s"] = await call_kforge(client, "verify_against_reference", third, deadline, job)
        row["paused_verify_ops"] = span.summary()
        with TraceSpan(args.trace) as span:
            sc, row["paused_profile_s"] = await call_kforge(
                client, "profile_kernel", {**third, "hardware_counters": False}, deadline, job)
        row["paused_profile_ops"], row["paused_profile_trace"] = span.summary(), span.details()
        save()
        log(f"{name}: candidate after {args.think_s} s: verify {row['paused_verify_s']} s, "
            f"profile {row['paused_profile_s']} s")
    if args.repeat_profiles > 1 and name in args.repeat_on:
        medians = [row["profile"]["candidate"].get("median_us")]
        for _ in range(args.repeat_profiles - 1):
            sc, _s = await call_kforge(client, "profile_kernel", prof, deadline, job)
            medians.append(((sc.get("report") or {}).get("candidate") or {}).get("median_us"))
        got = [m for m in medians if m]
        row["repeat"] = {"medians_us": medians, "spread_pct": round(100 * (max(got) - min(got)) / statistics.median(got), 2)
                         if len(got) > 1 else None}
        save()
        log(f"{name}: {len(medians)} profiles, spread {row['repeat']['spread_pct']} %")
    if args.smoke:
        reason = "--smoke: no GPU here"
        row["local"] = await anyio.to_thread.run_sync(
            run_helper, "local", {"src": src, "kb_src": str(args.kernelbench / "src"), "dry": True}, left())
        row["local"].update(do_bench_error=reason, kb_error=row["local"].get("kb_error") or reason)
        row["ncu"] = {c: {"error": reason} for c in args.ncu_clocks}
        return
    log(f"{name}: KernelBench harness and do_bench")
    row["local"] = await anyio.to_thread.run_sync(
        run_helper, "local", {"src": src, "kb_src": str(args.kernelbench / "src"), "dry": False}, left())
    save()
    row["ncu"] = {}
    # Base clocks (ncu's default) beside free-running ones on the repeat problems only: each ncu pass is a fresh
    # process, its inputs and the replay, 10-20 s on large problems.
    for clock in dict.fromkeys(args.ncu_clocks + (["base"] if name in args.repeat_on else [])):
        log(f"{name}: ncu --clock-control {clock}")
        row["ncu"][clock] = await anyio.to_thread.run_sync(ncu_forward, src, clock, left())
        save()


# ---------------------------------------------------------------- results

def fmt(x, nd=1) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def ratio(a, b):
    return a / b if a and b else None


def ci_text(b: dict) -> str:
    """The confidence interval of a speedup, from whichever field(s) carry it: [lo, hi], {lo, hi} or two scalars."""
    found: list[float] = []
    for key, v in b.items():
        if "ci" in key.lower().split("_") or "interval" in key.lower():
            vals = list(v.values()) if isinstance(v, dict) else v if isinstance(v, (list, tuple)) else [v]
            found += [x for x in vals if isinstance(x, (int, float)) and not isinstance(x, bool)]
    return f" [{min(found):.3f}, {max(found):.3f}]" if len(found) == 2 else ""


COLS = ["problem", "footprint GB", "KForge median us (IQR)", "KForge eager us", "KForge compile us", "do_bench us",
        "KF/do_bench",
        "ncu us (none / base)", "KF/ncu(none)", "self-speedup vs eager (CI)", "compile s", "verify s", "profile s", "KB harness s",
        "(v+p)/KB", "next candidate v+p s (/KB)", "after a pause v+p s (/KB)", "GPU mem x footprint (verify / profile)",
        "verify mem x reference's own peak", "verdict", "note"]


def table_row(r: dict) -> list[str]:
    p, loc, ncu = r.get("profile") or {}, r.get("local") or {}, r.get("ncu") or {}
    c, eager = p.get("candidate") or {}, p.get("eager") or {}
    med, db = c.get("median_us"), loc.get("do_bench_median_us")
    n_none, n_base = (ncu.get("none") or {}).get("sum_us"), (ncu.get("base") or {}).get("sum_us")
    kb = loc.get("kb_harness_s") if not loc.get("kb_error") else None
    vp = (r.get("verify_s") or 0) + (r.get("profile_s") or 0) if r.get("profile_s") else None
    nvp = (r.get("next_verify_s") or 0) + (r.get("next_profile_s") or 0) if r.get("next_profile_s") else None
    pvp = (r.get("paused_verify_s") or 0) + (r.get("paused_profile_s") or 0) if r.get("paused_profile_s") else None
    iqr = f" ({fmt(c.get('q1_us'))}-{fmt(c.get('q3_us'))})" if med else ""
    verdict = "-" if not r.get("verify") else ("correct" if r["verify"].get("correct") else "WRONG")
    if p:
        verdict += f", trusted={p.get('speedup_trusted')}"
    note = r.get("skipped") or r.get("error") or loc.get("error") or loc.get("kb_error") or loc.get("do_bench_error") or \
        (ncu.get("none") or {}).get("error") or ""
    pm = r.get("profile_memory") or {}
    if pm.get("slowed"):  # the GPU ran below its clock during the profile: name why, and the clock's range
        note = (f"clock {'-'.join(str(round(c)) for c in pm['sm_clock_mhz'][::2])} MHz in profile "
                f"({', '.join(pm['clock_events'])}); {note}").rstrip("; ")
    from kforge.profilers.report import host_issued, launch_bound  # KForge's own rule, not a twin of its thresholds

    launches = host_issued(p.get("launches_per_call"), p.get("host_launches_per_call"))

    if launch_bound(launches, med):  # its time is the host's launch pace (level1/57: 3,676 a call): say so beside it
        note = f"{launches:.0f} launches a call; {note}".rstrip("; ")
    elif p.get("host_paced") and med:  # KForge's own finding (a device idle in the candidate's call or eager's)
        busy = [f"{who} {100 * t['device_us_per_call'] / m:.0f}%" for who, t, m in
                (("candidate", p, med), ("eager", eager, eager.get("median_us")))
                if t.get("device_us_per_call") and m]
        paces = [f"{who} {t['launch_us'][1]:.1f}" for who, t in (("candidate", p.get("candidate") or {}),
                                                               ("eager", eager.get("timing") or {}))
                 if len(t.get("launch_us") or ()) == 3]
        if paces and loc.get("do_bench_launch_us"):  # the pace do_bench's own process read before its runs
            paces.append(f"do_bench {loc['do_bench_launch_us']:.1f}")
        pace = f", one launch {' / '.join(paces)} us" if paces else ""  # what the intervals were widened by
        note = f"host-paced: device busy {' / '.join(busy) or '?'} of the call{pace}; {note}".rstrip("; ")
    if loc.get("do_bench_speedup") and eager.get("speedup_ci"):  # --candidate graphed: the speedup do_bench saw
        lo, hi = eager["speedup_ci"]
        runs = loc.get("do_bench_speedup_runs") or []
        spread = f" (runs {min(runs):.2f}-{max(runs):.2f})" if len(runs) > 1 else ""
        inside = "inside" if lo <= loc["do_bench_speedup"] <= hi else "OUTSIDE"
        note = (f"do_bench speedup {loc['do_bench_speedup']:.3f}{spread}, {inside} KForge's interval; {note}").rstrip("; ")
    if (late := r.get("late_compile")) is not None:  # torch.compile added after the first profile answered
        said = (f"x{fmt(late.get('speedup'), 3)}{ci_text(late)} added {fmt(late.get('added_after_s'))} s after"
                if late.get("speedup") is not None else f"not added: {late.get('error')}")
        note = f"torch.compile late: {said}; {note}".rstrip("; ")
    if r.get("gpu") is not None:  # a merged run of shards: which GPU timed this row
        note = f"GPU {r['gpu']}; {note}".rstrip("; ")
    speedup = f"{fmt(eager.get('speedup'), 3)}{ci_text(eager)} {eager.get('comparison') or ''}".strip()
    return [r["problem"], fmt((r.get("footprint") or {}).get("gb"), 2), f"{fmt(med)}{iqr}", fmt(eager.get("median_us")),
            fmt((p.get("torch.compile") or {}).get("median_us") or (r.get("late_compile") or {}).get("median_us")),
            fmt(db), fmt(ratio(med, db), 3),
            f"{fmt(n_none)} / {fmt(n_base)}", fmt(ratio(med, n_none), 3), speedup, fmt(r.get("compile_s")),
            fmt(r.get("verify_s")),
            fmt(r.get("profile_s")), fmt(kb, 2), fmt(ratio(vp, kb), 2),
            f"{fmt(nvp)} ({fmt(ratio(nvp, kb), 2)})",
            f"{fmt(pvp)} ({fmt(ratio(pvp, kb), 2)})" if pvp else "-",
            f"{fmt((r.get('verify_memory') or {}).get('x_footprint'), 2)} / "
            f"{fmt((r.get('profile_memory') or {}).get('x_footprint'), 2)}",
            fmt(ratio((r.get("verify_memory") or {}).get("peak_above_start_gb"), loc.get("reference_peak_gb")), 2),
            verdict,
            str(note).replace("|", "/").replace("\n", " ")[:160]]


def markdown(res: dict) -> str:
    env = res["env"]
    lines = [f"# KernelBench sample on {env.get('device')} ({res['mode']}, backend {res['backend']}), {res['date']}", "",
             "versions: " + ", ".join(f"{k} {env.get(k)}" for k in ("python", "torch", "triton", "cuda", "cudnn",
                                                                       "driver", "ncu") if env.get(k)),
             f"KernelBench {res['kernelbench']['revision']}; seed {SEED}; started {res['started']}",
             "server: " + "; ".join(f"started {r.get('started')}, answered in {r.get('server_start_s')} s, the first "
                                    f"problem {r.get('first_turn_s', 0)} s later" for r in res.get("runs", [])), "",
             "| " + " | ".join(COLS) + " |", "|" + "---|" * len(COLS)]
    lines += ["| " + " | ".join(table_row(r)) + " |" for r in res["rows"]]
    reps = [r for r in res["rows"] if r.get("repeat")]
    if reps:
        lines += ["", "| problem | medians of separate profile calls (us) | spread (max-min)/median % |", "|---|---|---|"]
        lines += [f"| {r['problem']} | {', '.join(fmt(m) for m in r['repeat']['medians_us'])} | "
                  f"{fmt(r['repeat']['spread_pct'], 2)} |" for r in reps]
    if res.get("not_started"):
        lines += ["", f"Not started (budget): {', '.join(res['not_started'])}"]
    ops = [r for r in res["rows"] if r.get("verify_ops") or r.get("profile_ops")]
    op_keys = ("verify_ops", "profile_ops", "next_verify_ops", "next_profile_ops")
    if ops:
        lines += ["", "| problem | verify: seconds per worker op (top 6) | profile: seconds per worker op (top 6) "
                  "| next verify (top 6) | next profile (top 6) |", "|---|---|---|---|---|"]
        lines += [f"| {r['problem']} | " + " | ".join(
            ", ".join(f"{k} {v:.2f}" for k, v in list((r.get(key) or {}).items())[:6]) for key in op_keys)
            + " |" for r in ops]
    peaks = [r for r in res["rows"] if (r.get("profile_trace") or {}).get("peak_gb")]
    if peaks:
        lines += ["", "| problem | verify: worker ops' peak reserved device GB (top 4) | profile (top 4) |", "|---|---|---|"]
        lines += [f"| {r['problem']} | " + " | ".join(
            ", ".join(f"{k} {v:.2f}" for k, v in list(((r.get(key) or {}).get("peak_gb") or {}).items())[:4])
            for key in ("verify_trace", "profile_trace")) + " |" for r in peaks]
    kb = [(r, (r.get("local") or {}).get("kb_phases")) for r in res["rows"]]
    if any(ph for _, ph in kb):
        lines += ["", "| problem | KB harness s | its get_inputs calls: n, total s (max) | correctness s (with its "
                  "get_inputs) | timing loops s (candidate, reference) | rest s | other processes' busy cores | "
                  "(v+p) / (KB less its get_inputs) |", "|---|---|---|---|---|---|---|---|"]
        for r, ph in kb:
            if not ph:
                continue
            gi, loops = ph.get("get_inputs_s") or [], ph.get("timing_s") or []
            rest = ph["wall_s"] - (ph.get("correctness_s") or 0) - sum(loops) - sum(gi[5:])
            lines.append(f"| {r['problem']} | {fmt(ph['wall_s'], 2)} | {len(gi)}, {fmt(sum(gi), 2)} "
                         f"({fmt(max(gi) if gi else None, 2)}) | {fmt(ph.get('correctness_s'), 2)} | "
                         f"{', '.join(fmt(x, 2) for x in loops)} | {fmt(rest, 2)} | "
                         f"{fmt(ph.get('others_busy_cores'), 2)} of {ph.get('host_cores')} | "
                         f"{fmt(ratio((r.get('verify_s') or 0) + (r.get('profile_s') or 0), ph['wall_s'] - sum(gi)), 2)}"
                         " |")
    lines += [""] + [f"- {n}" for n in res["notes"]]
    return "\n".join(lines) + "\n"


NOTES = [
    "next candidate: a second, new candidate for the same problem (the same code plus a comment, so nothing comes "
    "from the store) verified and profiled right after: an agent's loop, where the torch.compile baseline timed "
    "minutes earlier is reused while the eager canary agrees within 2%.",
    "GPU mem x footprint: the peak of nvidia-smi's memory.used (polled every 100 ms) during the call, above its value "
    "when the call started, over the problem's footprint (its inputs and outputs); every process on the GPU counts.",
    "Candidate = the reference with Model renamed ModelNew; KForge verify (5 trials) and profile (hardware_counters "
    "false, use_store false) through the MCP SDK client over stdio; verify s / profile s: wall time of the call as a "
    "client sees it (job handles followed with get_job).",
    "KF/do_bench and KF/ncu: KForge's candidate median over do_bench's median (triton.testing.do_bench, "
    "return_mode='median', L2 flushed, fp32, TF32 off, no_grad, train mode as KernelBench) and over ncu's "
    "gpu__time_duration.sum summed over the kernels of one forward (--cache-control all). ncu 'base' locks clocks to "
    "base (ncu's default); 'none' leaves them as they run, like do_bench.",
    "KB harness s: wall time of eval_kernel_against_ref(5 correctness, 100 perf trials, its default excessive-speedup "
    "check that also times the reference) in a process where torch and kernelbench are already imported (CUDA "
    "initialised, do_bench run before it); its own import and process times are in the JSON (local.kb_import_s, "
    "local.process_s). It runs with torch's default precision flags (cuDNN TF32 allowed), as the field runs it.",
    "verify mem x reference's own peak: the verify's GPU memory peak over the peak of one forward of the reference "
    "in a plain process (torch.cuda.max_memory_allocated: parameters, inputs, output and what the forward "
    "allocates besides); a verify runs the reference in the judge and the candidate in its own process, so ~2 is "
    "the floor for a candidate that is the reference.",
    "after a pause: a third new candidate verified and profiled --think-s seconds after the next one (an agent "
    "writing its candidate), when the pool's refills of the calls before are done.",
    "clock in profile (in the note): nvidia-smi's SM clock (min-max MHz), polled with the memory every 100 ms during "
    "the profile call, and the clock event reasons seen, where one that slows a kernel was active (SW power cap, "
    "HW slowdown, SW/HW thermal, HW power brake): the GPU then ran below its clock while it was timed. The JSON "
    "keeps the clock, the power's maximum and the reasons for verify and profile alike.",
    "(v+p)/KB: (verify s + profile s) / KB harness s; the issue asks for <= 1. Footprint: inputs + outputs from "
    "shapes on the meta device.",
]


def stem(args) -> str:
    shard = f"-shard{args.shard[0]}of{args.shard[1]}" if args.shard else ""
    graphed = f"-{args.candidate}" if getattr(args, "candidate", "reference") != "reference" else ""
    return f"kernelbench-{'sweep' if args.sweep else 'sample'}{graphed}{'-smoke' if args.smoke else ''}{shard}"


def parse_shard(text: str) -> tuple[int, int]:
    k, _, n = text.partition("/")
    if not (k.isdigit() and n.isdigit() and 0 <= int(k) < int(n)):
        raise argparse.ArgumentTypeError(f"--shard wants K/N with 0 <= K < N, got {text!r}")
    return int(k), int(n)


def merge(paths: list[Path], out: Path) -> None:
    """One table of shards run side by side: their rows in the sample's order, each row naming its GPU."""
    shards = [json.loads(p.read_text()) for p in paths]
    res = dict(shards[0], stem=shards[0]["stem"].split("-shard")[0], shard=None, rows=[], runs=[], not_started=[],
               shards=[{"path": p.name, "shard": s.get("shard"), "gpu": s["env"].get("cuda_visible_devices"),
                        "started": s.get("started"), "problems": [r["problem"] for r in s["rows"]]}
                       for p, s in zip(paths, shards)])
    for s in shards:
        for row in s["rows"]:
            res["rows"].append(dict(row, gpu=s["env"].get("cuda_visible_devices")))
        res["runs"] += s.get("runs", [])
        res["not_started"] += s.get("not_started") or []
    order = {p: i for i, p in enumerate(DEFAULT_PROBLEMS)}
    res["rows"].sort(key=lambda r: order.get(r["problem"], len(order)))
    res["notes"] = res["notes"] + [f"{len(shards)} shards ran side by side, one GPU each (CUDA_VISIBLE_DEVICES in the "
                                   "JSON's rows as 'gpu'); each shard had its own kforge serve, helpers and ncu."]
    out.mkdir(parents=True, exist_ok=True)
    write(res, out, out / f"{res['stem']}.json")
    print(markdown(res), flush=True)


def write(res: dict, out: Path, state: Path) -> None:
    text = json.dumps(res, indent=1, default=str)
    for path in {out / f"{res['stem']}.json", state}:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (out / f"{res['stem']}.md").write_text(markdown(res))


# ---------------------------------------------------------------- main

async def run(args) -> dict:
    import anyio
    from contextlib import AsyncExitStack

    from mcp import Client, StdioServerParameters, stdio_client

    t_start = args.t0  # the budget counts from the script's start
    hard_stop = t_start + args.budget_s + args.overrun_s
    out, state = args.out, args.state
    res = {"stem": stem(args), "shard": args.shard, "mode": "smoke" if args.smoke else "gpu",
           "backend": args.backend, "date": time.strftime("%Y-%m-%d"), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
           "argv": sys.argv[1:], "env": args.env, "notes": NOTES, "rows": [], "runs": [],
           "kernelbench": {"path": str(args.kernelbench), "revision": (args.kernelbench / "REVISION").read_text().strip()
                           if (args.kernelbench / "REVISION").exists() else None}}
    if args.resume and state.exists():
        old = json.loads(state.read_text())
        if old.get("env", {}).get("device") == args.env.get("device") and old.get("mode") == res["mode"]:
            keep = [r for r in old["rows"] if not r.get("cut") and (not r.get("error") or not args.retry_errors)]
            res.update(rows=keep, runs=old.get("runs", []),
                       started=old.get("started", res["started"]))
            log(f"resume: {len(res['rows'])} problem(s) done in {state}")
        else:
            log(f"resume: {state} is from another device or mode; starting afresh")
    done = {r["problem"] for r in res["rows"]}
    todo = [p for p in args.problems if p not in done]
    save = lambda: write(res, out, state)  # noqa: E731

    home = Path(tempfile.mkdtemp(prefix="kforge-kb-home-"))
    env = {k: os.environ[k] for k in SERVER_ENV_KEYS if k in os.environ}
    # No candidate here builds C++: the server's background header prewarm would only load the CPU during timings.
    env.update(KFORGE_HOME=str(home), KFORGE_PRECOMPILED_HEADERS="true" if args.prewarm else "false")
    env.update(kv.split("=", 1) for kv in args.server_env)
    args.trace = out / f"{res['stem']}-trace.jsonl"  # shards side by side write their own
    env["KFORGE_TRACE"] = str(args.trace)
    run_info = {"started": time.strftime("%H:%M:%S"), "kforge_home": str(home),
                "server_env": {k: v for k, v in env.items()
                               if k.startswith("KFORGE_") or any(kv.startswith(k + "=") for kv in args.server_env)}}
    res["runs"].append(run_info)
    params = StdioServerParameters(command=sys.executable, args=["-m", "kforge.server.cli", "serve"], env=env)
    errlog = open(home / "server-stderr.log", "a")
    stack, client = AsyncExitStack(), None

    async def connect():
        nonlocal stack, client
        try:
            await stack.aclose()
        except Exception as exc:  # noqa: BLE001 - the old session is gone either way
            log(f"closing the broken MCP session: {exc!r}")
        stack = AsyncExitStack()
        t = time.monotonic()
        client = await stack.enter_async_context(Client(stdio_client(params, errlog=errlog)))
        backends = (await client.call_tool("list_backends", {})).structured_content["backends"]
        mine = next((b for b in backends if b["backend"] == args.backend), {})
        run_info.setdefault("server_start_s", []).append(round(time.monotonic() - t, 2))
        run_info["backend"] = {k: mine.get(k) for k in ("ok", "reason", "device_name", "versions", "mode", "timing")}
        log(f"kforge serve up in {time.monotonic() - t:.1f} s; {args.backend}: {mine.get('reason')}")

    try:
        await connect()
        if args.first_turn_s > 0 and todo:
            # The agent's first turn: it reads the problem and writes its candidate while the server's workers start.
            # KernelBench's harness is timed in a process that has imported torch and started CUDA; this is the
            # server's counterpart. 0 sends the first verify as soon as the server answers.
            log(f"the agent's first turn: {args.first_turn_s} s before the first problem")
            run_info["first_turn_s"] = args.first_turn_s
            await anyio.sleep(args.first_turn_s)
        for name in todo:
            now = time.monotonic()
            if now - t_start > args.budget_s:
                res["not_started"] = todo[todo.index(name):]
                log(f"budget {args.budget_s} s spent: not starting {len(res['not_started'])} problem(s)")
                break
            row, job, broken = {"problem": name}, {"id": None}, False
            res["rows"].append(row)
            deadline = min(now + args.problem_timeout_s, hard_stop)
            t = time.monotonic()
            try:
                with anyio.fail_after(deadline - now + 30):  # a backstop: each step keeps to the deadline itself
                    await measure(client, args, name, row, deadline, job, save)
            except (Timeout, TimeoutError) as exc:
                row["error"] = f"timeout: {exc or 'problem deadline'} ({deadline - now:.0f} s for this problem)"
                row["cut"] = deadline == hard_stop  # cut by the run's budget, not its own timeout: --resume reruns it
            except Exception as exc:  # noqa: BLE001 - one problem's failure is a row, never the end of the run
                row["error"] = f"{type(exc).__name__}: {exc}"[:1500]
                broken = isinstance(exc, (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream)) \
                    or "connection closed" in str(exc).lower()
            row["wall_s"] = round(time.monotonic() - t, 1)
            if job["id"]:  # a job left running past the deadline: stop it so the next problem has the GPU
                with anyio.move_on_after(30):
                    try:
                        await client.call_tool("cancel_job", {"job_id": job["id"]})
                        log(f"{name}: cancelled KForge job {job['id']}")
                    except Exception as exc:  # noqa: BLE001
                        log(f"{name}: cancel_job {job['id']} failed: {exc!r}")
            if row.get("error"):
                log(f"{name}: ERROR {row['error'][:300]}")
                if broken:  # (not under a timeout scope: the client's task group must close in the scope it opened in)
                    log("the MCP connection broke: restarting kforge serve")
                    await connect()
            save()
            log(f"{name}: done in {row['wall_s']} s; total {time.monotonic() - t_start:.0f} s")
        if args.sweep and not args.smoke:
            await sweep_do_bench(args, res, hard_stop, save)
        left = [p for p in args.problems if p not in {r["problem"] for r in res["rows"] if not r.get("cut")}]
        log("all problems done" if not left else f"{len(left)} problem(s) left: run again with --resume")
    finally:
        try:
            await stack.aclose()  # stops kforge serve (the SDK's stdio client terminates it if it lingers)
        except Exception as exc:  # noqa: BLE001
            log(f"closing the MCP session: {exc!r}")
        errlog.close()
        tail = (home / "server-stderr.log").read_text(errors="replace")[-20000:]
        (out / f"{res['stem']}-server-stderr.log").write_text(tail)
        shutil.rmtree(home, ignore_errors=True)  # its store and caches served this run only
        save()
    return res


async def sweep_do_bench(args, res: dict, hard_stop: float, save) -> None:
    """do_bench of every profiled row without one yet (a run resumed from a state file written before the helper
    timed each problem after its profile), in one helper process, after the server's last job."""
    import anyio
    rows = [r for r in res["rows"] if r.get("profile") and "do_bench_median_us" not in (r.get("local") or {})]
    if not rows:
        return
    srcs = {r["problem"]: load_source(args.kernelbench, r["problem"], None) for r in rows}
    log(f"do_bench of {len(srcs)} problem(s) in one process")
    got = await anyio.to_thread.run_sync(run_helper, "do_bench_many", {"srcs": srcs}, hard_stop - time.monotonic())
    for r in rows:
        r["local"] = got.get(r["problem"]) or {"do_bench_error": got.get("error") or "not reached (time limit)"}
    save()


def expand(kb: Path, names: list[str]) -> list[str]:
    """`level3/*` -> every problem of level 3 in KernelBench's order; other names as they are."""
    out: list[str] = []
    for name in names:
        level, _, stem = name.partition("/")
        if stem != "*":
            out.append(name)
            continue
        files = (kb / "KernelBench" / level).glob("*.py")
        out += [f"{level}/{f.stem}" for f in sorted(files, key=lambda f: int(f.stem.split("_")[0]))]
    return out


def main() -> None:
    if sys.argv[1:] == ["--_do_bench_serve"]:
        return helper_do_bench_serve()
    if len(sys.argv) == 3 and sys.argv[1] in ("--_local", "--_ncu_target", "--_env", "--_do_bench_many"):
        spec = json.loads(Path(sys.argv[2]).read_text())
        if sys.argv[1] == "--_ncu_target":
            return helper_ncu_target(spec)
        helpers = {"--_local": helper_local, "--_env": lambda _spec: helper_env(),
                   "--_do_bench_many": helper_do_bench_many}
        result = helpers[sys.argv[1]](spec)
        Path(spec["out"]).write_text(json.dumps(result, default=str))
        return None
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--kernelbench", type=Path, default=HERE.parent / ".kb",
                    help="KernelBench checkout holding KernelBench/level1/*.py and src/kernelbench/ (default .kb)")
    ap.add_argument("--problems", nargs="+", help="e.g. level1/19_ReLU level2/76 (default: a sample of 21)")
    ap.add_argument("--sweep", action="store_true", help="held-out problems: one verify + one profile each, "
                    "do_bench of all of them in one process at the end; no next candidate, KernelBench harness or ncu")
    ap.add_argument("--baselines", nargs="+", choices=["eager", "torch.compile"], help="profile_kernel's baselines "
                    "(default KForge's: eager and torch.compile)")
    ap.add_argument("--candidate", choices=sorted(CANDIDATES), default="reference", help="what the candidate is: "
                    "the reference renamed (its speedup against itself should hold 1), or with --sweep the reference "
                    "replayed from a CUDA graph (device-bound; do_bench then times it beside the reference, and its "
                    "speedup there is compared with KForge's interval)")
    ap.add_argument("--exclude", nargs="*", default=[], help="problems to leave out (e.g. the default sample's)")
    ap.add_argument("--smoke", action="store_true", help="CPU backend, 3 shrunken problems, no do_bench/ncu/KernelBench")
    ap.add_argument("--backend", help="KForge backend (default cuda; cpu with --smoke)")
    ap.add_argument("--max-footprint-frac", type=float, default=0.25, help="skip problems whose inputs+outputs exceed "
                    "this fraction of device memory (host memory with --smoke)")
    ap.add_argument("--repeat-profiles", type=int, help="profile calls per problem of --repeat-on (default 5; 2 with --smoke)")
    ap.add_argument("--think-s", type=float, default=0, help="also verify + profile a third candidate after this "
                    "pause (an agent writing its next candidate), beside the back-to-back one")
    ap.add_argument("--compile-first", action="store_true", help="call compile_kernel with the reference before "
                    "each problem's first verify, as an agent that builds its candidate first does")
    ap.add_argument("--turn-s", type=float, default=0, help="wait this long between the first verify and the first "
                    "profile of each problem (an agent's turn; not counted in either call's time)")
    ap.add_argument("--first-turn-s", type=float, default=0, help="wait this long after the server answers before "
                    "the first problem (an agent's first turn, while the server's workers start); 0: at once")
    ap.add_argument("--repeat-on", nargs="*", help="problems that get the repeated profiles")
    ap.add_argument("--ncu-clocks", nargs="+", default=["none"], choices=["none", "base"],
                    help="ncu --clock-control values for every problem; the --repeat-on problems also get base (ncu's "
                    "default, clocks locked to base)")
    ap.add_argument("--problem-timeout-s", type=float, default=240)
    ap.add_argument("--budget-s", type=float, default=480, help="start no problem after this many seconds")
    ap.add_argument("--overrun-s", type=float, default=90, help="a started problem is cut at budget + this")
    ap.add_argument("--resume", action="store_true", help="keep the finished problems of the state file; run the rest")
    ap.add_argument("--retry-errors", action="store_true", help="with --resume, run problems that ended in an error again")
    ap.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else HERE / "out")
    ap.add_argument("--state", type=Path, help="state file for --resume (default bench/out/kernelbench-sample[-smoke].json)")
    ap.add_argument("--prewarm", action="store_true", help="leave the server's background header prewarm on")
    ap.add_argument("--shard", type=parse_shard, metavar="K/N", help="run every N-th problem from the K-th (0-based): "
                    "N runs side by side, one per GPU (bench/run_kernelbench_sample.sh with KB_SHARDS=N)")
    ap.add_argument("--merge", nargs="+", type=Path, metavar="JSON", help="only merge these shards' results into "
                    "one table (kernelbench-sample.json/.md in --out)")
    ap.add_argument("--server-env", nargs="*", default=[], metavar="KEY=VALUE", help="extra environment for kforge serve")
    args = ap.parse_args()
    if args.merge:
        return merge(args.merge, args.out)
    args.t0 = time.monotonic()
    args.backend = args.backend or ("cpu" if args.smoke else "cuda")
    args.problems = args.problems or (list(SMOKE) if args.smoke else DEFAULT_PROBLEMS)
    if args.candidate != "reference" and (not args.sweep or args.smoke):
        sys.exit(f"--candidate {args.candidate} needs --sweep on a GPU: the sample's harness and ncu passes time the "
                 "reference as its own candidate")
    args.kernelbench = args.kernelbench.resolve()
    if not (args.kernelbench / "KernelBench" / "level1").is_dir():
        sys.exit(f"{args.kernelbench} holds no KernelBench/level1: run bash bench/prepare_kernelbench.sh")
    args.problems = [canonical(args.kernelbench, p) for p in expand(args.kernelbench, args.problems)]
    leave = {canonical(args.kernelbench, p) for p in expand(args.kernelbench, args.exclude)}
    args.problems = [p for p in args.problems if p not in leave]
    args.repeat_profiles = args.repeat_profiles if args.repeat_profiles is not None else (2 if args.smoke else 5)
    args.repeat_on = args.repeat_on if args.repeat_on is not None else ([args.problems[0]] if args.smoke else DEFAULT_REPEAT_ON)
    args.repeat_on = [canonical(args.kernelbench, p) for p in args.repeat_on]
    if args.shard:  # every N-th problem of the list, from the K-th: N runs side by side, one per GPU
        k, n = args.shard
        args.problems = args.problems[k::n]
        args.repeat_on = [p for p in args.repeat_on if p in args.problems]
    args.state = args.state or HERE / "out" / f"{stem(args)}.json"
    args.out.mkdir(parents=True, exist_ok=True)
    env = run_helper("env", {}, 180)
    if "memory_bytes" not in env:
        sys.exit(f"could not read the environment: {env.get('error')}")
    env["ncu"] = env.get("ncu") or "not on PATH"
    args.env = env
    log(f"{env.get('device')}: torch {env.get('torch')}, triton {env.get('triton')}, CUDA {env.get('cuda')}, "
        f"driver {env.get('driver')}; {len(args.problems)} problem(s); out {args.out}")
    import anyio
    import torch  # noqa: F401 - imported once here, not inside the first problem's time (footprints need it)
    args.do_bench = DoBenchServer()
    try:
        res = anyio.run(run, args)
    finally:
        args.do_bench.close()
    print(markdown(res), flush=True)


if __name__ == "__main__":
    main()
