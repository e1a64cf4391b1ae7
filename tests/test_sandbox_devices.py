"""Which NVIDIA device nodes a worker may open (issue 17): none for the CPU backend (and builds), its own GPU's and the
control nodes for a worker pinned to one GPU, every one for a worker pinned to none.

Without a GPU: the lookup on a fake driver tree; then, in a private mount namespace whose /dev holds null devices
named as NVIDIA's and whose /proc/driver is a fake tree, the rules as Landlock enforces them and as real workers
(cold and forked) get them. On real GPUs: tests/test_gpu_sandbox_devices.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kforge.backends import device_nodes
from kforge.backends._nvidia import NvidiaDeviceNodes, nvidia_gpus
from kforge.tools.process.sandbox import Confinement, _describe_nodes

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox is Linux's")

# Two GPUs of one model; the minors run against bus order, so a mapping by position would show.
AAA, BBB = "GPU-aaaa1111-2222-3333-4444-555566667777", "GPU-bbbb1111-2222-3333-4444-555566667777"
_GPUS = [("0000:17:00.0", AAA, 1, "NVIDIA H100 80GB HBM3"), ("0000:65:00.0", BBB, 0, "NVIDIA H100 80GB HBM3")]
_NODES = ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm")


def _driver(root: Path, gpus=_GPUS) -> Path:
    """A /proc/driver/nvidia with `gpus`, each as the driver writes `gpus/<bus id>/information`."""
    for bus, uuid, minor, model in gpus:
        where = root / "nvidia" / "gpus" / bus
        where.mkdir(parents=True)
        (where / "information").write_text(
            f"Model: \t\t {model}\nIRQ:   \t\t 0\nGPU UUID: \t {uuid}\nVideo BIOS: \t ??.??.??.??.??\n"
            f"Bus Type: \t PCIe\nDMA Size: \t 52 bits\nBus Location: \t {bus}\nDevice Minor: \t {minor}\n"
            "GPU Excluded:\t No\n")
    return root / "nvidia"


def _dev(root: Path, names=_NODES) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name in names:
        (root / name).touch()
    return root


def _env(pin: str | None) -> dict[str, str]:
    return {} if pin is None else {"CUDA_VISIBLE_DEVICES": pin}


def gpu_nodes(backend: str, pin: str | None, *, dev: str, driver: str) -> tuple[tuple[str, ...] | None, str]:
    """What a worker of `backend` pinned to `pin` may open on the fake host: the NVIDIA backends' `device_nodes` (the
    cuda and triton backends share it), the registry's answer for any other (a CPU-like device's asks no host)."""
    if backend in ("cuda", "triton", ""):
        picked = NvidiaDeviceNodes.device_nodes(_env(pin), dev=dev, driver=driver)
    else:
        picked = device_nodes(backend, _env(pin))
    return picked.nodes, picked.why_all_open


def pin_by_uuid(pin: str | None, *, dev: str, driver: str) -> str | None:
    """The pin the worker takes once only its nodes are open (`DeviceNodes.env`), None where it keeps its own."""
    return NvidiaDeviceNodes.device_nodes(_env(pin), dev=dev, driver=driver).env.get("CUDA_VISIBLE_DEVICES")


def test_the_backends_name_their_own_nodes():
    """The registry asks the worker's backend (`Backend.device_nodes`): the cuda and triton backends share NVIDIA's
    answer, the CPU backend opens none whatever its pin, and no backend (the probe) gets what any backend allows."""
    from kforge.backends import backend_class

    assert backend_class("cuda").device_nodes is NvidiaDeviceNodes.device_nodes or \
        backend_class("cuda").device_nodes.__func__ is NvidiaDeviceNodes.device_nodes.__func__
    assert issubclass(backend_class("triton"), NvidiaDeviceNodes) and issubclass(backend_class("cuda"), NvidiaDeviceNodes)
    assert device_nodes("cpu", _env(AAA)).nodes == ()
    here = NvidiaDeviceNodes.device_nodes(_env(None))
    assert device_nodes(None, {}).nodes == here.nodes  # this host's own NVIDIA nodes: every one, or none at all


@pytest.fixture
def host(tmp_path) -> dict[str, str]:
    return {"dev": str(_dev(tmp_path / "dev")), "driver": str(_driver(tmp_path / "driver"))}


def test_the_driver_lists_gpus_in_bus_order(tmp_path):
    listed = nvidia_gpus(str(_driver(tmp_path, list(reversed(_GPUS)))))
    assert [(g["uuid"], g["minor"], g["model"]) for g in listed] == [(u, str(m), model) for _, u, m, model in _GPUS]
    assert nvidia_gpus(str(tmp_path / "absent")) == []


def test_a_cpu_worker_or_an_empty_pin_gets_no_node(host):
    assert gpu_nodes("cpu", None, **host) == ((), "")
    assert gpu_nodes("cpu", AAA, **host) == ((), "")
    assert gpu_nodes("cuda", "", **host) == ((), "")


def test_a_worker_pinned_to_no_gpu_keeps_every_node(host):
    assert gpu_nodes("cuda", None, **host) == (None, "")
    assert gpu_nodes("", None, **host) == (None, "")  # the probe


def test_a_pinned_worker_gets_its_gpus_node_and_the_control_nodes(host):
    dev = host["dev"]
    control = (f"{dev}/nvidiactl", f"{dev}/nvidia-uvm")  # those of the control nodes this host has
    for pin in (AAA, AAA.lower().removeprefix("gpu-"), "GPU-aaaa", "0"):  # uuid, bare, a unique start, index (bus order)
        assert gpu_nodes("cuda", pin, **host) == ((f"{dev}/nvidia1", *control), ""), pin
    assert gpu_nodes("triton", BBB, **host) == ((f"{dev}/nvidia0", *control), "")
    assert gpu_nodes("cuda", f"{BBB},1", **host) == ((f"{dev}/nvidia0", *control), "")  # the same GPU twice
    assert gpu_nodes("cuda", f"{BBB}, {AAA}", **host) == ((f"{dev}/nvidia0", f"{dev}/nvidia1", *control), "")


def test_a_pin_not_found_keeps_every_node_and_says_why(host, tmp_path):
    for pin in ("GPU-cccc", "MIG-aaaa1111-2222-3333-4444-555566667777", "2", "GPU-", f"{AAA},GPU-cccc"):
        nodes, why = gpu_nodes("cuda", pin, **host)
        assert nodes is None and f"CUDA_VISIBLE_DEVICES={pin}" in why and "every GPU's node" in why, (pin, why)
    mixed = _driver(tmp_path / "mixed", [_GPUS[0], (*_GPUS[1][:3], "NVIDIA A100")])
    assert gpu_nodes("cuda", "0", dev=host["dev"], driver=str(mixed))[0] is None  # CUDA ranks them by speed first
    assert gpu_nodes("cuda", AAA, dev=host["dev"], driver=str(mixed))[0] == (f"{host['dev']}/nvidia1",
                                                                              f"{host['dev']}/nvidiactl",
                                                                              f"{host['dev']}/nvidia-uvm")


def test_an_index_pin_names_its_gpu_by_uuid_where_only_its_node_is_open(host, tmp_path):
    """CUDA counts an index among the GPUs it can open: with GPU 1's node alone open, "1" names no device."""
    for pin, uuids in (("1", BBB), ("0", AAA), ("1, 0", f"{BBB},{AAA}"), (f"{AAA},1", f"{AAA},{BBB}")):
        assert pin_by_uuid(pin, **host) == uuids, pin
    assert pin_by_uuid(BBB, **host) is None  # a uuid already names it whatever is open
    assert pin_by_uuid("2", **host) is None  # no such GPU: every node open, CUDA counts as the host does (said why)
    assert pin_by_uuid(None, **host) is None
    none_here = str(_dev(tmp_path / "bare", ("null",)))
    assert pin_by_uuid("1", dev=none_here, driver=host["driver"]) is None  # no GPU at all


def test_a_host_without_nvidia_nodes_gives_none(tmp_path):
    dev = str(_dev(tmp_path / "dev", ("null", "zero")))
    assert gpu_nodes("cuda", AAA, dev=dev, driver=str(tmp_path)) == ((), "")
    assert gpu_nodes("", None, dev=dev, driver=str(tmp_path)) == ((), "")


def test_the_confinement_carries_its_nodes_and_the_report_names_them():
    for nodes in (None, (), ("/dev/nvidia3", "/dev/nvidiactl")):
        assert Confinement.from_arg(Confinement(home="/h", gpu_nodes=nodes).as_arg()).gpu_nodes == nodes
    assert _describe_nodes([]) == "no GPU device nodes"
    assert _describe_nodes(["/dev/nvidia10", "/dev/nvidiactl", "/dev/nvidia2"]) == "device nodes: nvidia2, nvidia10 + control"


# -- in a private /dev: what Landlock lets through, and what real workers get --------------------------------------

# Run first by each script below (as root, in a mount namespace of its own): a fresh /dev with the null devices and,
# named as NVIDIA's, zero devices; the fake driver tree on /proc/driver. Workers it starts inherit both.
_PRIVATE_DEV = textwrap.dedent("""
    import ctypes, json, os, stat, sys
    from kforge.tools.process import sandbox as sb

    CONFIG = json.loads(sys.argv[1])
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(0x00020000) != 0:
        print("SKIP a mount namespace: " + os.strerror(ctypes.get_errno()))
        sys.exit(0)
    try:
        sb._mount(libc, None, "/", None, sb._MS_REC | sb._MS_PRIVATE)
        real = {n: os.open("/dev/" + n, os.O_PATH) for n in ("null", "zero", "full", "random", "urandom")}
        sb._mount(libc, "tmpfs", "/dev", "tmpfs", 0, "mode=0755")
        for name, fd in real.items():
            open("/dev/" + name, "w").close()
            sb._mount(libc, f"/proc/self/fd/{fd}", "/dev/" + name, None, sb._MS_BIND)
        os.mkdir("/dev/shm")
        for name in CONFIG["nodes"]:
            os.mknod("/dev/" + name, 0o666 | stat.S_IFCHR, os.makedev(1, 5))
        os.makedirs("/proc/driver", exist_ok=True)
        sb._mount(libc, CONFIG["driver"], "/proc/driver", None, sb._MS_BIND)
    except OSError as exc:
        print(f"SKIP a private /dev: {exc}")
        sys.exit(0)
""")

# A candidate that tries every NVIDIA node of /dev and lists the ones it holds open, and says so in its failure.
PROBE = textwrap.dedent("""
    import errno, json, os


    def attempt(path):
        try:
            os.close(os.open(path, os.O_RDWR))
            return "opened"
        except OSError as exc:
            return errno.errorcode.get(exc.errno, str(exc.errno))


    def held():
        found = set()
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue
            if target.startswith("/dev/nvidia"):
                found.add(target)
        return sorted(found)


    nodes = sorted(n for n in os.listdir("/dev") if n.startswith("nvidia") and not os.path.isdir("/dev/" + n))
    report = {"open": {n: attempt("/dev/" + n) for n in nodes}}
    __EXTRA__
    report["held"] = held()
    raise RuntimeError("DEVICES " + json.dumps(report))
""")


def probe_report(reply: dict) -> dict:
    """The probe's report from a load op's reply."""
    message = (reply.get("failure") or {}).get("message") or ""
    assert "DEVICES " in message, f"no report from the probe: {reply}"
    return json.JSONDecoder().raw_decode(message.split("DEVICES ", 1)[1])[0]


def _in_private_dev(tmp_path: Path, script: str, **config) -> dict:
    if os.geteuid() != 0:
        pytest.skip("a private /dev with device nodes needs root")
    config |= {"nodes": list(_NODES), "driver": str(_driver(tmp_path / "driver").parent)}
    done = subprocess.run([sys.executable, "-c", _PRIVATE_DEV + textwrap.dedent(script), json.dumps(config)],
                          capture_output=True, text=True, timeout=600)
    out = done.stdout.strip().splitlines()
    if out and out[-1].startswith("SKIP"):
        pytest.skip(out[-1])
    assert done.returncode == 0 and out and out[-1].startswith("RESULT "), done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out[-1].removeprefix("RESULT "))


def _require_landlock(report: dict) -> None:
    missing = [m for m in report["missing"] if "landlock" in m]
    if missing:
        pytest.skip(f"this host refuses Landlock: {missing}")


_ENTER = """
    import errno
    held = {n: os.open("/dev/" + n, os.O_RDWR) for n in ("nvidia0", "nvidia1")}  # as a zygote's NVML holds its nodes
    from kforge.backends import device_nodes
    nodes = device_nodes(CONFIG["backend"], {} if CONFIG["pin"] is None else {"CUDA_VISIBLE_DEVICES": CONFIG["pin"]}).nodes
    report = sb.enter(sb.Confinement(home=CONFIG["home"], gpu_nodes=nodes))


    def attempt(path):
        try:
            os.close(os.open(path, os.O_RDWR))
            return "opened"
        except OSError as exc:
            return errno.errorcode.get(exc.errno, str(exc.errno))


    print("RESULT " + json.dumps({"report": report, "open": {n: attempt("/dev/" + n) for n in CONFIG["nodes"]},
                                  "held": {n: os.major(os.fstat(fd).st_rdev) * 10 + os.minor(os.fstat(fd).st_rdev)
                                           for n, fd in held.items()}}))
"""


@pytest.mark.parametrize(("backend", "pin", "allowed", "says"), [
    ("cpu", None, (), "no GPU device nodes"),
    ("cpu", BBB, (), "no GPU device nodes"),
    ("cuda", BBB, ("nvidia0", "nvidiactl", "nvidia-uvm"), "device nodes: nvidia0 + control"),
    ("cuda", "1", ("nvidia0", "nvidiactl", "nvidia-uvm"), "device nodes: nvidia0 + control"),  # index 1: bus 65
    ("triton", AAA, ("nvidia1", "nvidiactl", "nvidia-uvm"), "device nodes: nvidia1 + control"),
    ("cuda", None, _NODES, "device nodes: nvidia0, nvidia1 + control"),
])
def test_landlock_lets_the_worker_open_only_its_nodes(tmp_path, backend, pin, allowed, says):
    home = tmp_path / "home"
    got = _in_private_dev(tmp_path, _ENTER, backend=backend, pin=pin, home=str(home))
    _require_landlock(got["report"])
    assert says in got["report"]["applied"], got["report"]
    assert got["open"] == {n: "opened" if n in allowed else "EACCES" for n in _NODES}, got
    # Descriptors of nodes it may not open, held from before: pointed at /dev/null (1, 3), the others kept (1, 5).
    assert got["held"] == {n: 15 if n in allowed else 13 for n in ("nvidia0", "nvidia1")}, got


_WORKERS = """
    import anyio
    from pathlib import Path
    from kforge.tools.process.pool import WorkerPool
    from kforge.tools.process.protocol import LoadRequest
    from kforge.tools.process.runner import WorkerProcess
    from kforge.tools.process.limits import sandbox_args, WorkerLimits

    home, limits = Path(CONFIG["home"]), WorkerLimits()


    async def start(name, backend, env=None, pool=None):
        scratch = home / "jobs" / name
        role = "candidate" if backend else "probe"
        async with WorkerProcess(backend=backend, home=home, scratch=scratch, limits=limits, role=role,
                                 extra_env=env, pool=pool) as w:
            out = {"isolation": w.isolation, "warm": w.warm}
            if backend:
                reply = await w.call(LoadRequest(role="candidate", source=CONFIG["probe"]), stage="load", timeout_s=300)
                out["failure"] = reply.failure and reply.failure.model_dump(mode="json")
        return out


    async def main():
        found = {"probe": await start("probe", ""), "cpu": await start("cpu", "cpu"),
                 "triton pinned": await start("triton", "triton", {"CUDA_VISIBLE_DEVICES": CONFIG["pin"]}),
                 "triton by index": await start("triton-index", "triton", {"CUDA_VISIBLE_DEVICES": "0"})}
        pool = WorkerPool(home, size=1, isolate_network=limits.isolate_network, sandbox=sandbox_args(home, limits))
        async with anyio.create_task_group() as tg:
            await tg.start(pool.run)
            with anyio.fail_after(300):
                found["warm cpu"] = await start("warm-cpu", "cpu", pool=pool)
            tg.cancel_scope.cancel()
        print("RESULT " + json.dumps(found))


    anyio.run(main)
"""


def test_real_workers_get_the_nodes_of_their_backend_and_pin(tmp_path):
    """Cold workers (which learn their backend from their first message, before the sandbox) and a forked one (from
    the zygote's message), through the runner as the tools start them; the triton backend runs on the CPU here."""
    probe = PROBE.replace("__EXTRA__", 'report["pin"] = os.environ.get("CUDA_VISIBLE_DEVICES")')
    got = _in_private_dev(tmp_path, _WORKERS, home=str(tmp_path / "home"), pin=AAA, probe=probe)
    _require_landlock(got["probe"]["isolation"])
    assert "device nodes: nvidia0, nvidia1 + control" in got["probe"]["isolation"]["applied"], got["probe"]
    gpu = ("nvidia1", "nvidiactl", "nvidia-uvm")
    expect = {"cpu": (), "warm cpu": (), "triton pinned": gpu, "triton by index": gpu}  # index 0: bus 17, AAA
    for name, allowed in expect.items():
        isolation, report = got[name]["isolation"], probe_report(got[name])
        says = "device nodes: nvidia1 + control" if allowed else "no GPU device nodes"
        # (The fake /proc/driver covers part of /proc: a user namespace may then mount no /proc of its own.)
        missing = [m for m in isolation["missing"] if not m.startswith("own /proc")]
        assert says in isolation["applied"] and not missing, (name, isolation)
        assert report["open"] == {n: "opened" if n in allowed else "EACCES" for n in _NODES}, (name, report)
        assert report["held"] == [], (name, report)
    # Only its GPU's node is open, so CUDA would count "0" among that one GPU alone: the worker names it by uuid.
    assert probe_report(got["triton by index"])["pin"] == AAA
    assert probe_report(got["triton pinned"])["pin"] == AAA
    assert got["warm cpu"]["warm"] and not got["cpu"]["warm"]
