"""The `kforge` command line as a user runs it."""

import json
import subprocess

from .conftest import kforge_command, server_env


def _doctor(home, *args):
    out = subprocess.run([*kforge_command(), "doctor", "--json", *args], env=server_env(home),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_doctor_reports_backends_and_measures_ceilings_once(tmp_path):
    first = _doctor(tmp_path)
    backends = {b["backend"]: b for b in first["backends"]}
    assert backends["cpu"]["ok"] and backends["cpu"]["versions"]["torch"]
    assert {"cpu", "cuda", "triton"} <= set(backends)
    for name, b in backends.items():
        assert b["reason"], f"{name} gives no reason"
    cpu = first["devices"]["cpu"]
    assert cpu["peak_bandwidth_gbs"] > 0 and cpu["peak_tflops"]["float32"] > 0
    assert first["home"] == str(tmp_path)
    assert _doctor(tmp_path)["devices"]["cpu"] == cpu  # the second run reads the cache


def test_version():
    out = subprocess.run([*kforge_command(), "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("kforge ")
