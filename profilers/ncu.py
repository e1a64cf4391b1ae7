"""Collector: Nsight Compute metrics through `ncu` and its Python report module.

`ncu_command` builds the prefix that runs a worker under ncu (only the candidate's own kernels,
a few launches, the sections that decide the next change; ncu's messages go to a log file so they
cannot reach the worker's protocol pipe); `kforge.tools.process.profiled_launch` runs ncu and the worker it
profiles in one sandbox. `read_report` condenses the `.ncu-rep` with NVIDIA's own report module, which
ships with ncu under `extras/python`. `NcuProfiler` puts them behind `kforge.profilers.base.Profiler`.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Iterable

from .base import ProfilerBase
from .report import Counter, NcuKernel, hottest_kernel, kernel_base_name

__all__ = ["NcuProfiler", "counters_for", "ncu_command", "ncu_install", "ncu_log_problem", "read_report"]

# MemoryWorkloadAnalysis_Tables and SourceCounters carry the access-pattern facts (sectors per request,
# ncu's uncoalesced-access rules) that tell a strided kernel from a bandwidth-bound one.
_SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats", "MemoryWorkloadAnalysis", "MemoryWorkloadAnalysis_Tables",
             "WarpStateStats", "ComputeWorkloadAnalysis", "SourceCounters")
# ncu display name -> (metric, scale). Display names are what ncu's own UI shows, and the analyst reads.
_METRICS = {
    "Duration [us]": ("gpu__time_duration.sum", 1e-3),
    "Compute (SM) Throughput": ("sm__throughput.avg.pct_of_peak_sustained_elapsed", 1.0),
    "Memory Throughput": ("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed", 1.0),
    "DRAM Throughput": ("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed", 1.0),
    "Achieved Occupancy": ("sm__warps_active.avg.pct_of_peak_sustained_active", 1.0),
    "Theoretical Occupancy": ("sm__maximum_warps_per_active_cycle_pct", 1.0),
    "Waves Per SM": ("launch__waves_per_multiprocessor", 1.0),
    "Registers Per Thread": ("launch__registers_per_thread", 1.0),
    "Static Shared Memory Per Block": ("launch__shared_mem_per_block_static", 1.0),
    "Dynamic Shared Memory Per Block": ("launch__shared_mem_per_block_dynamic", 1.0),
    "L1/TEX Hit Rate": ("l1tex__t_sector_hit_rate.pct", 1.0),
    "L2 Hit Rate": ("lts__t_sector_hit_rate.pct", 1.0),
    "Tensor Pipe Active": ("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active", 1.0),
    "L1/TEX Cache Throughput": ("l1tex__throughput.avg.pct_of_peak_sustained_active", 1.0),
    "L2 Cache Throughput": ("lts__throughput.avg.pct_of_peak_sustained_elapsed", 1.0),
    "Executed Ipc Active": ("sm__inst_executed.avg.per_cycle_active", 1.0),
    "Grid Size": ("launch__grid_size", 1.0),
    "Block Size": ("launch__block_size", 1.0),
}
# Derived display name -> (numerator, denominator): 4 sectors per request is a fully coalesced fp32 warp
# access, 32 is one sector per thread.
_RATIOS = {
    "Global Load Sectors Per Request": ("l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",
                                        "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"),
    "Global Store Sectors Per Request": ("l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum",
                                         "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum"),
}
_LIMITERS = {"registers": "launch__occupancy_limit_registers", "shared memory": "launch__occupancy_limit_shared_mem",
             "warps": "launch__occupancy_limit_warps", "blocks": "launch__occupancy_limit_blocks"}
_STALL = re.compile(r"^smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$")
_MARKUP = re.compile(r"@\w+:[^:@]*:([^@]*)@")  # "@section:WarpStateStats:Warp State Statistics@" -> the title
_TOP_STALLS = 3


def ncu_command(report_path: Path, log_path: Path, kernel_names: Iterable[str], *, launches: int) -> list[str] | None:
    """The ncu prefix for a worker command, or None where ncu is not installed."""
    ncu = shutil.which("ncu")
    if ncu is None:
        return None
    # --clock-control none: the kernels run at the clocks the timing loop measured them at (ncu locks them to
    # base by default, which made its durations incomparable with the timed medians).
    cmd = [ncu, "--log-file", str(log_path), "--export", str(report_path), "--force-overwrite",
           "--launch-count", str(launches), "--clock-control", "none"]
    for section in _SECTIONS:
        cmd += ["--section", section]
    names = sorted({kernel_base_name(n) for n in kernel_names if n})
    if names:
        cmd += ["--kernel-name", "regex:" + "|".join(re.escape(n) for n in names)]
    return cmd


def ncu_install(ncu: str) -> str:
    """ncu's install directory, which the sandbox around it must let it read (its binaries, `sections`, the
    libraries it injects): the one holding `sections`, the binary in it or in `target/<platform>/` beneath."""
    here = Path(os.path.realpath(ncu)).parent
    return str(next((d for d in (here, *list(here.parents)[:2]) if (d / "sections").is_dir()), here))


def ncu_log_problem(log_text: str) -> str | None:
    """Why ncu collected nothing, in words, from its log."""
    if "ERR_NVGPUCTRPERM" in log_text:
        return ("GPU performance counters are not permitted for this user (ERR_NVGPUCTRPERM); run as root or set "
                "NVreg_RestrictProfilingToAdminUsers=0. Timing and torch.profiler are unaffected.")
    if "No kernels were profiled" in log_text:
        return "ncu saw none of the candidate's kernels (none launched, or their names did not match)"
    errors = [l for l in log_text.splitlines() if "==ERROR==" in l]
    return errors[0].strip() if errors else None


def _report_module():
    ncu = shutil.which("ncu")
    roots = [os.path.join(os.path.dirname(os.path.realpath(ncu)), "extras", "python")] if ncu else []
    roots += glob.glob("/opt/nvidia/nsight-compute/*/extras/python") + glob.glob("/usr/local/cuda*/nsight-compute*/extras/python")
    for root in roots:
        if os.path.isdir(root) and root not in sys.path:
            sys.path.append(root)
    import ncu_report  # noqa: PLC0415 - found only at run time, beside ncu

    return ncu_report


def read_report(path: Path, custom_names: Iterable[str]) -> list[NcuKernel]:
    """Condense every profiled launch in an `.ncu-rep` file."""
    ncu_report = _report_module()
    own = {kernel_base_name(n) for n in custom_names}
    ctx = ncu_report.load_report(str(path))
    kernels = []
    for r in range(ctx.num_ranges()):
        rng = ctx.range_by_idx(r)
        for a in range(rng.num_actions()):
            action = rng.action_by_idx(a)
            metrics = {}
            for label, (metric, scale) in _METRICS.items():
                m = action.metric_by_name(metric)
                if m is not None:
                    metrics[label] = round(m.as_double() * scale, 4)
            for label, (num, den) in _RATIOS.items():
                n, d = action.metric_by_name(num), action.metric_by_name(den)
                if n is not None and d is not None and d.as_double() > 0:
                    metrics[label] = round(n.as_double() / d.as_double(), 3)
            limits = {what: action.metric_by_name(m) for what, m in _LIMITERS.items()}
            limits = {what: m.as_double() for what, m in limits.items() if m is not None}
            stalls = []
            for name in action.metric_names():
                if (hit := _STALL.match(name)) and (m := action.metric_by_name(name)) is not None:
                    stalls.append((hit.group(1).replace("_", " "), round(m.as_double(), 3)))
            stalls.sort(key=lambda s: -s[1])
            rules = [{"rule": r.get("rule_identifier", ""), "title": (r.get("rule_message") or {}).get("title", ""),
                      "message": _MARKUP.sub(r"\1", (r.get("rule_message") or {}).get("message", ""))[:600]}
                     for r in action.rule_results_as_dicts() if (r.get("rule_message") or {}).get("type", 0) >= 1]
            name = action.name()
            kernels.append(NcuKernel(name=name, is_custom=kernel_base_name(name) in own or not own,
                                     metrics=metrics, top_stalls=stalls[:_TOP_STALLS], rules=rules,
                                     occupancy_limiter=min(limits, key=limits.get) if limits else None))
    return kernels


def counters_for(kernels: list[NcuKernel]) -> list[Counter]:
    """The hottest custom kernel's metrics as counters under ncu's display names (what the analyst reads)."""
    hot = hottest_kernel(kernels)
    if hot is None:
        return []
    return [Counter(name=name, value=value, unit="us" if "[us]" in name else "%" if "Throughput" in name or "Occupancy" in name or "Rate" in name else "")
            for name, value in hot.metrics.items()]


class NcuProfiler(ProfilerBase):
    """Nsight Compute: the candidate once more under `ncu`, its report read by the judge (NVIDIA backends name it)."""

    name = "ncu"
    title = "Nsight Compute"
    where = "rerun"
    report_suffix = ".ncu-rep"
    log_name = "nsight.log"
    launches = 3  # each is replayed once per metric pass
    timeout_s = 300.0  # torch start-up and kernel replay under ncu are slow

    def command(self, report: Path, log: Path, kernel_names: Iterable[str], *, launches: int) -> list[str] | None:
        return ncu_command(report, log, kernel_names, launches=launches)

    def install_dir(self, executable: str) -> str:
        return ncu_install(executable)

    def log_problem(self, log_text: str) -> str | None:
        return ncu_log_problem(log_text)

    def read(self, report: Path, custom_names: Iterable[str]) -> list[NcuKernel]:
        return read_report(report, custom_names)

    def counters(self, kernels: list[NcuKernel]) -> list[Counter]:
        return counters_for(kernels)

