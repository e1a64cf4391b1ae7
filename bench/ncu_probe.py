"""Probe Nsight Compute on this host: can it read counters, and what does its report module expose?

Prints what a collector needs to know (version, a metric sample, rule-result API). Used to build
kforge's ncu collector against the real report module; run on a GPU host.
"""

import glob
import os
import subprocess
import sys
import tempfile

ncu = "ncu"
print(subprocess.run([ncu, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1])
target = "import torch; x=torch.randn(1<<20, device='cuda'); torch.relu(x); torch.cuda.synchronize()"
rep = os.path.join(tempfile.mkdtemp(), "probe")
cmd = [ncu, "--set", "full", "-k", "regex:.*", "-c", "1", "-o", rep, "--force-overwrite", sys.executable, "-c", target]
out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
print("ncu rc", out.returncode, "|", (out.stdout + out.stderr)[-1500:])
sys.path += glob.glob("/opt/nvidia/nsight-compute/*/extras/python")
import ncu_report  # noqa: E402

ctx = ncu_report.load_report(rep + ".ncu-rep")
action = ctx.range_by_idx(0).action_by_idx(0)
print("kernel:", action.name())
print("action API:", [m for m in dir(action) if not m.startswith("_")])
names = list(action.metric_names())
print("metrics:", len(names))
for key in ["gpu__time_duration.sum", "sm__throughput.avg.pct_of_peak_sustained_elapsed",
            "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
            "dram__throughput.avg.pct_of_peak_sustained_elapsed", "sm__warps_active.avg.pct_of_peak_sustained_active",
            "launch__registers_per_thread", "launch__occupancy_limit_registers", "l1tex__t_sector_hit_rate.pct",
            "lts__t_sector_hit_rate.pct", "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
            "sm__maximum_warps_per_active_cycle_pct", "launch__shared_mem_per_block_static"]:
    m = action.metric_by_name(key)
    print(" ", key, None if m is None else (m.as_double(), m.unit()))
print("stall metrics:", [n for n in names if "average_warp_latency_issue_stalled" in n and n.endswith(".ratio")][:30])
for attr in ("rule_results", "rule_results_as_dicts", "get_rule_results"):
    if hasattr(action, attr):
        try:
            res = getattr(action, attr)()
            print("rules via", attr, type(res), str(res)[:1500])
        except Exception as exc:  # noqa: BLE001
            print("rules via", attr, "failed", exc)
