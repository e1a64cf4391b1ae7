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


def _nvidia_gpu() -> bool:
    from kforge.backends._nvidia import nvidia_gpu_present

    return nvidia_gpu_present()


def test_doctor_advice_fits_the_host_and_shows_the_disk(tmp_path):
    out = subprocess.run([*kforge_command(), "doctor", "--no-measure"], env=server_env(tmp_path),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    if not _nvidia_gpu():
        assert "install a CUDA build of torch" not in out.stdout
        assert "no NVIDIA GPU on this host: the cuda backend needs one" in out.stdout
    triton = next(line for line in out.stdout.splitlines() if line[4:].startswith("triton"))
    if triton.startswith("ok"):  # only where its interpreter (or a GPU) can really run a candidate
        import importlib

        assert _nvidia_gpu() or importlib.import_module("triton.runtime.interpreter")
    assert "disk: " in out.stdout and f"in {tmp_path}: store" in out.stdout and "`kforge prune`" in out.stdout
    disk = _doctor(tmp_path, "--no-measure")["disk"]
    assert disk["total_bytes"] > 0 and set(disk["caches"]) >= {"builds", "pch"} and disk["cache_max_bytes"] == 20e9


def test_every_option_has_help():
    import argparse

    from kforge.server.cli import parser

    root = parser()
    commands = next(a for a in root._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in commands.choices.items():
        for action in sub._actions:
            assert action.help, f"kforge {name} {action.option_strings or action.dest} has no help"


def test_prune_trims_the_caches_to_the_cap(tmp_path):
    import os
    import time

    for name, age in (("old", 86400 * 2), ("new", 86400)):
        entry = tmp_path / "cache" / "builds" / name
        entry.mkdir(parents=True)
        (entry / "lib.so").write_bytes(os.urandom(2**20))
        for p in (entry / "lib.so", entry):
            os.utime(p, (time.time() - age,) * 2)
    out = subprocess.run([*kforge_command(), "prune", "--max-gb", "0.0015"], env=server_env(tmp_path),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("removed 1 cache entries, freed 1.") and not (tmp_path / "cache" / "builds" / "old").exists()
    assert (tmp_path / "cache" / "builds" / "new").exists()
    out = subprocess.run([*kforge_command(), "prune", "--all"], env=server_env(tmp_path), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and not (tmp_path / "cache" / "builds" / "new").exists()


def test_config_prints_each_client_for_this_install(tmp_path):
    out = subprocess.run([*kforge_command(), "config", "claude-desktop"], env=server_env(tmp_path), capture_output=True,
                         text=True, timeout=60)
    entry = json.loads(out.stdout)["mcpServers"]["kforge"]
    assert entry["args"][-1] == "serve" and entry["env"]["KFORGE_HOME"] == str(tmp_path)
    assert "claude_desktop_config.json" in out.stderr
    bad = subprocess.run([*kforge_command(), "config", "notepad"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "claude-desktop" in bad.stderr


async def _banner(home):
    from .conftest import stdio_session

    async with stdio_session(home, KFORGE_WARM_WORKERS="0") as client:
        await client.list_tools()
        for _ in range(120):  # the banner follows the backends' probe
            text = (home / "server-stderr.log").read_text()
            if "serving MCP" in text:
                return text
            import anyio

            await anyio.sleep(0.5)
    return (home / "server-stderr.log").read_text()


def test_serve_prints_a_one_line_banner(tmp_path):
    import anyio

    text = anyio.run(_banner, tmp_path)
    lines = [line for line in text.splitlines() if "serving MCP" in line]
    assert len(lines) == 1, text
    assert lines[0].startswith("kforge ") and "serving MCP over stdio" in lines[0]
    assert f"data directory {tmp_path};" in lines[0] and "backends cpu" in lines[0]
    if not _nvidia_gpu():
        assert "not here: cuda (no NVIDIA GPU on this host" in lines[0]
