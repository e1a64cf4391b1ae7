"""Every code block of the README, executed as a reader would run it.

Each block is claimed by one test below (test_every_block_has_a_test fails on a block nobody runs). What
cannot be run here is said where it is substituted: the second host of `ssh gpu-host` (its command runs
locally), a public name and port (loopback and a free port), and nginx where it is not installed.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters, stdio_client

from .conftest import free_port, kforge_command, server_env

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.M | re.S)


def blocks() -> list[tuple[str, str]]:
    """(language, text) of every fenced block, in order."""
    return [(m.group(1), m.group(2)) for m in _FENCE.finditer(README.read_text())]


def block(lang: str, startswith: str) -> str:
    found = [text for l, text in blocks() if l == lang and text.startswith(startswith)]
    assert len(found) == 1, f"expected one {lang} block starting {startswith!r}, found {len(found)}"
    return found[0]


# Each test claims the blocks it runs: (language, how the block starts).
CLAIMED = {
    "install": [("bash", "# Install and start")],
    "configs": [("json", '{\n  "mcpServers"'), ("json", '{\n  "servers"'), ("bash", "claude mcp add")],
    "scripted": [("python", "import anyio\nfrom mcp import Client, StdioServerParameters"),
                 ("python", "# reference.py"), ("python", "# candidate.py")],
    "ssh": [("bash", "ssh gpu-host kforge serve")],
    "http": [("bash", "# on the GPU host"), ("python", "# on the laptop")],
    "nginx": [("nginx", "server {")],
}


def test_every_block_has_a_test():
    unclaimed = [(lang, text.splitlines()[0]) for lang, text in blocks()
                 if not any(lang == l and text.startswith(s) for claims in CLAIMED.values() for l, s in claims)]
    assert not unclaimed, f"README blocks no test runs: {unclaimed}"


def _venv(path: Path) -> dict[str, str]:
    """A fresh virtual environment (nothing of this Python's packages), and the environment that uses it."""
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, timeout=300)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PATH"] = f"{path / 'bin'}{os.pathsep}{env['PATH']}"
    env["PIP_RETRIES"] = "0"  # an index this machine cannot reach is said once, not retried per package
    return env


@pytest.mark.slow
def test_install_and_serve_on_a_fresh_venv(tmp_path):
    """The first command, word for word, in a fresh venv and a copy of the checkout: it installs and serves.

    The second (the test command) is what .ci/run runs, in a fresh venv too."""
    install, test_command = [line for line in block("bash", "# Install and start").splitlines() if not line.startswith("#")]
    assert test_command in (ROOT / ".ci" / "run").read_text()
    assert "python3 -m venv" in (ROOT / ".ci" / "run").read_text()

    src = tmp_path / "kforge"
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    for name in filter(None, (f.decode() for f in files)):
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    env = _venv(tmp_path / "venv")
    # A fresh data directory where the embedded default puts it (platformdirs reads XDG_DATA_HOME; HOME stays,
    # for pip's own configuration).
    env["XDG_DATA_HOME"] = str(tmp_path / "data")
    for name in [k for k in env if k.startswith("KFORGE_")]:
        del env[name]
    log = tmp_path / "install.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(["bash", "-c", install], cwd=src, env=env, stdin=subprocess.PIPE,
                                stdout=out, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 900
        try:
            while "serving MCP over stdio" not in log.read_text():
                assert proc.poll() is None, f"exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(1)
        finally:
            proc.stdin.close()  # end of input: the stdio server stops
            proc.wait(timeout=60)
    banner = next(l for l in log.read_text().splitlines() if "serving MCP" in l)
    assert f"data directory {tmp_path / 'data' / 'kforge'}" in banner and "backends cpu" in banner, banner


def _config(client: str, **env: str) -> str:
    out = subprocess.run([*kforge_command(), "config", client], env={**os.environ, **env}, capture_output=True,
                         text=True, timeout=60, check=True)
    return out.stdout


async def _serves(entry: dict, home: Path) -> list[str]:
    """Start the server as a client would from `entry` and list its tools."""
    env = {**entry.get("env", {}), "PATH": os.environ["PATH"], "KFORGE_PRECOMPILED_HEADERS": "false"}
    params = StdioServerParameters(command=entry["command"], args=entry["args"], env=env)
    with open(home / "config-server.log", "a") as errlog:
        async with Client(stdio_client(params, errlog=errlog)) as client:
            return [t.name for t in (await client.list_tools()).tools]


async def test_client_configurations_match_kforge_config_and_start_the_server(tmp_path):
    """The README's configurations are `kforge config`'s output (with the README's example path), and what
    `kforge config` prints starts this install's server, for every client."""
    readme_json = [json.loads(text) for lang, text in blocks() if lang == "json"]
    readme_add = block("bash", "claude mcp add").strip()
    home = tmp_path / "home"
    home.mkdir()
    printed = {c: _config(c, KFORGE_HOME=str(home)) for c in ("claude-desktop", "mcp-json", "vscode", "cursor")}
    example = "/home/me/.venv/bin/kforge"
    for client, text in printed.items():
        cfg = json.loads(text)
        servers = cfg["servers"] if client == "vscode" else cfg["mcpServers"]
        entry = servers["kforge"]
        assert Path(entry["command"]).is_absolute() and entry["env"] == {"KFORGE_HOME": str(home)}
        assert ("type" in entry) == (client in ("mcp-json", "vscode")) and entry.get("type", "stdio") == "stdio"
        shown = json.loads(json.dumps(cfg).replace(json.dumps(entry["command"]), json.dumps(example)))
        shown_entry = (shown["servers"] if client == "vscode" else shown["mcpServers"])["kforge"]
        del shown_entry["env"]
        assert shown in readme_json, f"README lacks {client}'s configuration {shown}"
        assert "verify_against_reference" in await _serves(entry, home)
    add = shlex.split(_config("claude-code", KFORGE_HOME=str(home)))
    assert add[:4] == ["claude", "mcp", "add", "--transport"] and add[add.index("--") - 1] == "kforge"
    assert f"KFORGE_HOME={home}" in add
    command = add[add.index("--") + 1:]
    readme_words = shlex.split(readme_add)
    assert readme_words[readme_words.index("--") + 1:] == [example, "serve"]
    without_env = [w for i, w in enumerate(add) if w != "--env" and (i == 0 or add[i - 1] != "--env")]
    assert without_env[:without_env.index("--")] == readme_words[:readme_words.index("--")]
    assert "list_backends" in await _serves({"command": command[0], "args": command[1:], "env": {"KFORGE_HOME": str(home)}}, home)


@pytest.mark.slow
def test_scripted_client_verifies_the_candidate_format_pair(tmp_path):
    """The scripted client, run as written on a fresh data directory, with the README's reference.py and
    candidate.py beside it: the verdict is CORRECT (through a job handle when the first build outlasts the wait)."""
    (tmp_path / "reference.py").write_text(block("python", "# reference.py"))
    (tmp_path / "candidate.py").write_text(block("python", "# candidate.py"))
    (tmp_path / "client.py").write_text(block("python", "import anyio\nfrom mcp import Client, StdioServerParameters"))
    # The client passes on only HOME, PATH and a few more: a fresh HOME is a fresh data directory. `kforge` is
    # this Python's (a version manager's shim would look for its root under HOME).
    env = {**os.environ, "HOME": str(tmp_path / "home"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("KFORGE_HOME", None)
    out = subprocess.run([sys.executable, "client.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=1200)
    assert out.returncode == 0, out.stderr[-3000:]
    summary, verdict = out.stdout.rstrip().rsplit("\n", 1)
    assert verdict == "True" and summary.startswith("CORRECT"), out.stdout


async def test_ssh_remote_command_serves(tmp_path):
    """`ssh gpu-host kforge serve`: no second host here, so the remote side's command runs locally, over stdio."""
    words = shlex.split(block("bash", "ssh gpu-host kforge serve").split("#")[0])
    assert words[:2] == ["ssh", "gpu-host"]
    remote = words[2:]
    assert remote[0] == "kforge"
    entry = {"command": kforge_command()[0], "args": [*kforge_command()[1:], *remote[1:]],
             "env": {"KFORGE_HOME": str(tmp_path)}}
    assert "profile_kernel" in await _serves(entry, tmp_path)


def test_http_remote_host_with_token_and_tls(tmp_path):
    """The GPU host's commands and the laptop's client, on loopback: `~` is a temporary home, the certificate is
    made for 127.0.0.1 (the laptop trusts it through SSL_CERT_FILE), 0.0.0.0 becomes 127.0.0.1 (nothing is
    exposed from a test) and the port a free one."""
    home = tmp_path / "home"
    home.mkdir()
    certs = tmp_path / "certs"
    certs.mkdir()
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(certs / "key.pem"),
                    "-out", str(certs / "cert.pem")], check=True, capture_output=True, timeout=60)
    port = free_port()
    script = block("bash", "# on the GPU host").replace("/etc/kforge/", f"{certs}/").replace("0.0.0.0", "127.0.0.1")
    script = script.replace("--port 8765", f"--port {port}").replace("kforge serve", shlex.join(kforge_command()) + " serve")
    env = {**server_env(home), "HOME": str(home), "KFORGE_HOME": str(home / "data")}
    log = open(tmp_path / "server.log", "w")
    server = subprocess.Popen(["bash", "-c", script], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while "serving MCP over streamable HTTP" not in (tmp_path / "server.log").read_text():
            assert server.poll() is None and time.monotonic() < deadline, (tmp_path / "server.log").read_text()
            time.sleep(0.5)
        assert oct((home / ".kforge-token").stat().st_mode & 0o777) == "0o600"
        laptop = block("python", "# on the laptop").replace("https://gpu-host.example.com:8765",
                                                            f"https://127.0.0.1:{port}")
        (tmp_path / "laptop.py").write_text(laptop)
        out = subprocess.run([sys.executable, str(tmp_path / "laptop.py")], capture_output=True, text=True, timeout=300,
                             env={**os.environ, "HOME": str(home), "SSL_CERT_FILE": str(certs / "cert.pem")})
        assert out.returncode == 0, out.stderr[-3000:]
        assert "cpu: available" in out.stdout, out.stdout
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=30)
        log.close()


def test_nginx_configuration_is_valid(tmp_path):
    """nginx's own check of the README's server block (with a self-signed certificate at its paths)."""
    nginx = shutil.which("nginx")
    if nginx is None:
        pytest.skip("nginx is not installed here (`apt-get install nginx` runs this check)")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=x",
                    "-keyout", str(tmp_path / "key.pem"), "-out", str(tmp_path / "cert.pem")], check=True,
                   capture_output=True, timeout=60)
    server = block("nginx", "server {")
    server = re.sub(r"ssl_certificate\s+\S+;", f"ssl_certificate {tmp_path / 'cert.pem'};", server)
    server = re.sub(r"ssl_certificate_key\s+\S+;", f"ssl_certificate_key {tmp_path / 'key.pem'};", server)
    conf = tmp_path / "nginx.conf"
    conf.write_text(f"pid {tmp_path}/nginx.pid;\nerror_log {tmp_path}/error.log;\nevents {{}}\n"
                    f"http {{\naccess_log off;\n{server}\n}}\n")
    out = subprocess.run([nginx, "-t", "-c", str(conf), "-p", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
