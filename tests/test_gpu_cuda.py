"""The CUDA backend on a real GPU, end to end through the MCP client (skipped without a GPU).

Run on a GPU host with scripts/run_gpu_tests.sh.
"""

from __future__ import annotations

import pytest

from kforge.profilers.report import HOST_PACE_RESOLUTION

from .conftest import EXAMPLES, stdio_session, stored_once_added

pytestmark = [pytest.mark.anyio, pytest.mark.gpu]


def data(result) -> dict:
    assert not result.is_error, result.content[0].text
    return result.structured_content


async def test_cuda_compile_verify_profile(kforge_home, candidate):
    cand = candidate("example_cuda")
    async with stdio_session(kforge_home) as client:
        cuda = next(b for b in data(await client.call_tool("list_backends", {}))["backends"] if b["backend"] == "cuda")
        assert cuda["ok"], cuda["reason"]

        built = data(await client.call_tool("compile_kernel", {"backend": "cuda", "candidate_code": cand}))
        assert built["ok"], built
        # The taught form is NVRTC: the kernel's figures come from the driver (local memory = spills + stack).
        assert built["builds"][0]["fast_paths"] == ["NVRTC"] and built["load_seconds"] < 5, built
        [kernel] = built["builds"][0]["kernels"]
        assert kernel["kernel"].startswith("relu_kernel") and kernel["registers"] > 0
        assert kernel["local_bytes"] == 0 and kernel["arch"].startswith("sm_")
        again = data(await client.call_tool("compile_kernel", {"backend": "cuda", "candidate_code": cand, "use_store": False}))
        assert again["ok"] and again["builds"][0]["kernels"] == built["builds"][0]["kernels"]

        verdict = data(await client.call_tool("verify_against_reference", {
            "backend": "cuda", "problem": "relu", "candidate_code": cand}))
        assert verdict["correct"] and verdict["trials"][0]["outputs"][0]["got"]["device"].startswith("cuda")

        wrong = data(await client.call_tool("verify_against_reference", {
            "backend": "cuda", "problem": "relu", "candidate_code": candidate("cuda_wrong")}))
        assert not wrong["correct"] and wrong["trials"][0]["outputs"][0]["mismatches"] > 0

        prof = data(await client.call_tool("profile_kernel", {
            "backend": "cuda", "problem": "relu", "candidate_code": cand, "budget_s": 1.0}))
        report = prof["report"]
        assert prof["output_correct"] and report["candidate"]["median_us"] > 0
        # The device's clock was read while the candidate's batches ran (NVML, from inside the worker's sandbox).
        low, high = report["candidate"]["sm_clock_mhz"]
        assert 100 < low <= high < 5000, report["candidate"]
        assert report["launches_per_call"] == 1, report["launches_per_call"]  # one relu_kernel a call
        own = [op for op in report["ops"] if op["is_custom"] and op.get("device_time_us")]
        assert own and own[0]["name"].startswith("relu_kernel")
        assert report["custom_share"] > 0.5
        assert report["device"]["peak_bandwidth_gbs"] > 1000 and report["device"]["peak_tflops"]["bfloat16"] > 100
        assert 0 < report["bandwidth_fraction"] < 1.5
        [hot] = [k for k in report["ncu"] if k["is_custom"]][:1]
        assert hot["name"].startswith("relu_kernel") and hot["metrics"]["Memory Throughput"] > 0
        assert hot["occupancy_limiter"] and hot["metrics"]["Registers Per Thread"] > 0
        # Our event timing covers the kernel ncu measured (plus launch overhead), never much less.
        assert report["candidate"]["median_us"] >= 0.8 * hot["metrics"]["Duration [us]"]
        assert any(c["name"] == "Memory Throughput" for c in report["counters"])
        assert any(a.endswith("/profile.ncu-rep") for a in prof["artifacts"])
        summary = data(await client.call_tool("summarize_profile", {"profile_id": prof["profile_id"]}))
        assert any(e["source"] == "ncu" for e in summary["analysis"]["evidence"]), summary["analysis"]
        assert not any("outside the timed stream" in w for w in report["candidate"]["warnings"])
        baselines = report["baselines"]
        if any(b.get("pending") for b in baselines):  # the problem's warm-up was compiling: added once timed
            baselines = (await stored_once_added(client, prof["profile_id"], "torch.compile"))["report"]["baselines"]
        assert {b["name"] for b in baselines if b.get("timing")} == {"eager", "torch.compile"}, baselines


async def test_cuda_errors_are_located_and_faults_contained(kforge_home, candidate):
    async with stdio_session(kforge_home) as client:
        broken = data(await client.call_tool("compile_kernel", {"backend": "cuda", "candidate_code": candidate("cuda_compile_error")}))
        assert not broken["ok"] and broken["failure"]["kind"] == "build_error"
        err = broken["diagnostics"][0]
        assert err["line"] == 13 and "undefined_bias" in err["message"] and err["source"] == "cuda"

        fault = data(await client.call_tool("verify_against_reference", {
            "backend": "cuda", "problem": "relu", "candidate_code": candidate("cuda_illegal_address"), "trials": 1}))
        assert not fault["correct"] and (fault.get("failure") or {}).get("kind") == "device_fault", fault
        assert "illegal memory access" in fault["failure"]["message"]
        # Verify runs in a plain worker; the fault sends its trials again to one with synchronous launches.
        assert any("synchronous launches" in w for w in fault.get("warnings") or []), fault.get("warnings")

        healthy = data(await client.call_tool("verify_against_reference", {
            "backend": "cuda", "problem": "relu", "candidate_code": candidate("example_cuda"), "trials": 1, "use_store": False}))
        assert healthy["correct"], "the next job must run on a healthy GPU context"


async def test_cuda_side_stream_work_is_flagged(kforge_home, candidate):
    async with stdio_session(kforge_home) as client:
        prof = data(await client.call_tool("profile_kernel", {
            "backend": "cuda", "problem": "relu", "candidate_code": candidate("cuda_side_stream"),
            "baselines": ["eager"], "budget_s": 0.5}))
    warnings = prof["report"]["candidate"]["warnings"]
    assert any("outside the timed stream" in w for w in warnings), warnings


async def test_kernelbench_form_builds_split_and_verifies(kforge_home, candidate):
    """The KernelBench form builds with its kernels apart from the torch wrappers, and still computes the same."""
    cases = [((EXAMPLES / "cuda" / "candidate_load_inline.py").read_text(), "relu", None),
             (candidate("cuda_kb_softmax"), "softmax", None), (candidate("cuda_kb_matmul"), "matmul", None),
             (candidate("cuda_kb_template"), "relu", "template kernel")]
    async with stdio_session(kforge_home) as client:
        for code, problem, declined in cases:
            built = data(await client.call_tool("compile_kernel", {"backend": "cuda", "candidate_code": code}))
            assert built["ok"], built
            [build] = built["builds"]
            if declined:
                assert "lean CUDA header (torch/types.h)" in build["fast_paths"] and declined in build["not_split"], build
            else:
                assert "kernels split from torch wrappers" in build["fast_paths"] and build.get("not_split") is None, build
                assert build["kernels"] and build["kernels"][0]["registers"] > 0  # ptxas' figures still come through
            verdict = data(await client.call_tool("verify_against_reference", {
                "backend": "cuda", "problem": problem, "candidate_code": code, "trials": 2}))
            assert verdict["correct"], (problem, verdict)


_LAUNCH_CHAIN = """
import torch, torch.nn as nn

class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.relu(x)
        for _ in range(399):  # 400 launches a call, each a few microseconds: the host's launch pace sets its time
            y = y + 0.0
        return y
"""


async def test_a_call_of_hundreds_of_launches_is_counted(kforge_home):
    """level1/57's lesson (cuDNN's FFT tiling, 3,676 launches a call): the profile counts a call's device launches,
    which is what names a noisy launch-bound call's cause in stable_timing."""
    async with stdio_session(kforge_home) as client:
        prof = data(await client.call_tool("profile_kernel", {
            "backend": "cuda", "problem": "relu", "candidate_code": _LAUNCH_CHAIN, "budget_s": 0.5,
            "hardware_counters": False}))
        assert prof["output_correct"], prof
        assert prof["report"]["launches_per_call"] == 400, prof["report"]["launches_per_call"]


_HOST_PACED_NET = """
import torch, torch.nn as nn

class Model(nn.Module):
    # 48 small layers: 96 launches of a few microseconds, the device idle while the host issues the next (a
    # KernelBench level-3 network at batch 10 is such a call: EfficientNetB1, 87 launches, timed 0.65x-1.54x itself).
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(*[m for _ in range(48) for m in (nn.Linear(64, 64), nn.ReLU())])

    def forward(self, x):
        return self.layers(x)

def get_inputs():
    return [torch.randn(8, 64)]

def get_init_inputs():
    return []
"""


async def test_a_host_paced_network_is_not_ranked_against_itself(kforge_home):
    """The reference as its own candidate, a call whose device is idle most of the time: the profile measures the
    device's busy time, names the call host-paced and widens its speedups by the host paces' measured spread, so it
    reads 'no measurable difference' against itself, untrusted, with the cause and the remedy."""
    async with stdio_session(kforge_home) as client:
        prof = data(await client.call_tool("profile_kernel", {
            "backend": "cuda", "reference_code": _HOST_PACED_NET, "candidate_code": _HOST_PACED_NET.replace(
                "class Model(", "class ModelNew("), "budget_s": 0.5, "hardware_counters": False}))
    report = prof["report"]
    assert prof["output_correct"], prof
    assert report["launches_per_call"] >= 96, report["launches_per_call"]
    assert report["device_us_per_call"] < 0.5 * report["candidate"]["median_us"], report
    assert report["host_paced"] and "host's pace" in report["host_paced"], report["host_paced"]
    for b in report["baselines"]:
        lo, hi = b["speedup_ci"]
        assert lo < 1 < hi and b["comparison"] == "no measurable difference", b
    stable = next(c for c in prof["checks"] if c["name"] == "stable_timing")
    assert stable["status"] == "fail" and "CUDA graph" in stable["evidence"], stable
    # The host's launch cost was read for the candidate and every baseline, and the reason says how wide that made them.
    assert len(report["candidate"]["launch_us"]) == 3 and 0.5 < report["candidate"]["launch_us"][1] < 100, report
    assert all(len(b["timing"]["launch_us"]) == 3 for b in report["baselines"]), report["baselines"]
    assert report["host_pace_resolution"] == HOST_PACE_RESOLUTION and "either way" in report["host_paced"], report


_DEVICE_PACED_NET = """
import torch, torch.nn as nn

class Model(nn.Module):
    # Four layers of 4096 x 4096 at batch 4096: a few launches, each a GEMM of milliseconds.
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(4096, 4096), nn.ReLU())])

    def forward(self, x):
        return self.layers(x)

def get_inputs():
    return [torch.randn(4096, 4096)]

def get_init_inputs():
    return []
"""


async def test_a_device_bound_calls_device_time_is_its_median(kforge_home):
    """The profile's device time per call is its kernels' time, counted once: summed with the aten ops' own device
    time it read 2x the timed median of KernelBench's device-bound level-3 networks (H200, 2026-12-01), and a host-paced
    network at 63% busy went unnamed. A call of a few GEMMs keeps the device busy nearly all of its median."""
    async with stdio_session(kforge_home) as client:
        prof = data(await client.call_tool("profile_kernel", {
            "backend": "cuda", "reference_code": _DEVICE_PACED_NET, "candidate_code": _DEVICE_PACED_NET.replace(
                "class Model(", "class ModelNew("), "budget_s": 0.5, "hardware_counters": False}))
    report = prof["report"]
    assert prof["output_correct"], prof
    median = report["candidate"]["median_us"]
    assert 0.8 * median < report["device_us_per_call"] < 1.05 * median, (report["device_us_per_call"], median)
    assert report.get("host_paced") is None, report["host_paced"]


_LAYERS_NET = """
import torch, torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(*[m for _ in range(8) for m in (nn.Linear(64, 64), nn.ReLU())])

    def forward(self, x):
        return self.layers(x)

def get_inputs():
    return [torch.randn(256, 64)]

def get_init_inputs():
    return []
"""


_GRAPHED_NET = """
import torch, torch.nn as nn

class ModelNew(nn.Module):
    # The reference's layers replayed from a CUDA graph, one per input shape: each call copies its input into the
    # graph's own buffer, so the answer is computed from this call's data.
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(*[m for _ in range(8) for m in (nn.Linear(64, 64), nn.ReLU())])
        self.graphs = {}

    def forward(self, x):
        if x.shape not in self.graphs:
            static_in = x.clone()
            self.layers(static_in)  # the libraries' first use, outside the capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_out = self.layers(static_in)
            self.graphs[x.shape] = (graph, static_in, static_out)
        graph, static_in, static_out = self.graphs[x.shape]
        static_in.copy_(x)
        graph.replay()
        return static_out.clone()
"""


async def test_a_cuda_graph_candidate_is_verified_and_profiled(kforge_home):
    """GPU workers detach CUPTI after each torch.profiler session (TEARDOWN_CUPTI=1: attached, it cost every later
    launch 4-5 us on an H200), so a job's profile starts CUPTI again after the candidate captured a CUDA graph.
    torch.compile turns that teardown off for its own CUDA graphs because a re-start after it crashed with graphs
    (CUDA 11 and 12): a candidate that captures and replays one is checked, timed and profiled all the same."""
    async with stdio_session(kforge_home) as client:
        verify = data(await client.call_tool("verify_against_reference", {
            "backend": "cuda", "reference_code": _LAYERS_NET, "candidate_code": _GRAPHED_NET}))
        assert verify["correct"], verify
        prof = data(await client.call_tool("profile_kernel", {
            "backend": "cuda", "reference_code": _LAYERS_NET, "candidate_code": _GRAPHED_NET, "budget_s": 0.5,
            "hardware_counters": False}))
    report = prof["report"]
    assert prof["output_correct"], prof
    assert report["candidate"]["median_us"] > 0 and report["device_us_per_call"] > 0, report
    # The profiler, started again after the capture, still sees the graph's kernels (8 GEMMs and 8 ReLUs at least),
    # and the host issued them in one replay (with the input's copy and the output's clone): none waits on the host.
    assert report["launches_per_call"] >= 8, report["launches_per_call"]
    assert report["host_launches_per_call"] <= 4, report
    # Its eager baseline's 40 kernels keep the device busy about half the call (H200): that side may be host-paced.
    assert not report.get("host_paced") or report["host_paced"].startswith(("eager (a baseline)", "torch.compile (a baseline)")), report["host_paced"]


_ADD_CHAIN = """
import torch, torch.nn as nn

class Model(nn.Module):
    # 120 adds of a scalar to a small tensor: 120 launches of ~2 us, the device idle while the host issues the next.
    def forward(self, x):
        for _ in range(120):
            x = x + 0.5
        return x

def get_inputs():
    return [torch.randn(8, 64)]

def get_init_inputs():
    return []
"""

_ONE_ADD = """
import torch, torch.nn as nn

class ModelNew(nn.Module):
    def forward(self, x):
        return x + 60.0  # the chain in one launch
"""


async def test_a_host_paced_baseline_is_widened_against_a_device_bound_candidate(kforge_home):
    """The other side of the ratio: the candidate's one launch does not wait on the host, but eager's 120, timed in the
    judge's process, run at that host's pace. The judge profiles eager's call after its rounds (launches, device
    time), names it host-paced and widens the speedup against it; the candidate itself is not called host-paced."""
    async with stdio_session(kforge_home) as client:
        prof = data(await client.call_tool("profile_kernel", {
            "backend": "cuda", "reference_code": _ADD_CHAIN, "candidate_code": _ONE_ADD, "budget_s": 0.5,
            "hardware_counters": False}))
    report = prof["report"]
    assert prof["output_correct"], prof
    assert report["launches_per_call"] <= 2, report["launches_per_call"]
    eager = next(b for b in report["baselines"] if b["name"] == "eager")
    assert eager["launches_per_call"] >= 120 and eager["host_launches_per_call"] >= 120, eager
    assert eager["device_us_per_call"] < 0.5 * eager["timing"]["median_us"], eager
    assert report["host_paced"] and report["host_paced"].startswith("eager (a baseline)"), report["host_paced"]
    lo, hi = eager["speedup_ci"]
    assert report["host_pace_resolution"] == HOST_PACE_RESOLUTION, report
    assert hi >= eager["speedup"] * (1 + HOST_PACE_RESOLUTION) - 1e-3 and lo < 0.9 * eager["speedup"], eager
    # At its fastest eager takes its kernels' time: the interval stops at that, not below.
    assert lo >= eager["device_us_per_call"] / report["candidate"]["median_us"] / 1.02 - 1e-3, (eager, report["candidate"])
    assert eager["comparison"] == "faster", eager  # ~50x: beyond any spread of the host's pace
    for b in report["baselines"]:
        if b["name"] == "torch.compile" and b.get("speedup"):  # one fused kernel: device-paced, left as timed
            assert b["launches_per_call"] <= 4 and "torch.compile (a baseline)" not in report["host_paced"], b
