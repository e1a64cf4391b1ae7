"""The Nsight Compute collector's pieces that need no GPU: command, log diagnosis, counters."""

from pathlib import Path

from kforge.profilers.ncu import counters_for, ncu_command, ncu_log_problem
from kforge.profilers.report import NcuKernel


def test_command_filters_the_candidates_kernels(monkeypatch, tmp_path):
    fake = tmp_path / "ncu"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    cmd = ncu_command(Path("/x/rep"), Path("/x/log"), ["relu_kernel(float const*, float*, int)", "void ns::tiled<4>(float*)"],
                      launches=3)
    assert cmd[0] == str(fake) and cmd[cmd.index("--log-file") + 1] == "/x/log"
    assert cmd[cmd.index("--launch-count") + 1] == "3"
    assert cmd[cmd.index("--kernel-name") + 1] == r"regex:ns::tiled|relu_kernel"
    monkeypatch.setenv("PATH", "/nonexistent")
    assert ncu_command(Path("/x/rep"), Path("/x/log"), [], launches=1) is None


def test_log_problems_are_explained():
    assert "ERR_NVGPUCTRPERM" in ncu_log_problem("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission")
    assert "none of the candidate's kernels" in ncu_log_problem("==WARNING== No kernels were profiled.")
    assert ncu_log_problem("==PROF== Disconnected") is None


def test_counters_come_from_the_hottest_own_kernel():
    kernels = [NcuKernel(name="aten_kernel", is_custom=False, metrics={"Duration [us]": 50.0, "Memory Throughput": 90.0}),
               NcuKernel(name="mine", is_custom=True, metrics={"Duration [us]": 5.0, "Memory Throughput": 20.0}),
               NcuKernel(name="mine2", is_custom=True, metrics={"Duration [us]": 9.0, "Memory Throughput": 70.0})]
    counters = {c.name: (c.value, c.unit) for c in counters_for(kernels)}
    assert counters == {"Duration [us]": (9.0, "us"), "Memory Throughput": (70.0, "%")}
    assert counters_for([]) == []


def test_a_rerun_profilers_report_is_a_binary_artifact_named_by_the_profiler():
    """What the profile's rerun pass and the artifact resource read from the profiler, not from a name of Nsight
    Compute's in the tools: its report's suffix (binary), its log's name, its launches and its time."""
    from kforge.profilers import binary_report_suffixes, load_profiler
    from kforge.profilers.base import Profiler

    ncu = load_profiler("ncu")
    assert isinstance(ncu, Profiler)
    assert (ncu.report_suffix, ncu.log_name, ncu.launches) == (".ncu-rep", "nsight.log", 3) and ncu.timeout_s > 0
    assert binary_report_suffixes() == frozenset({".ncu-rep"})  # perf writes no report
