"""Configuration mistakes are said with the file's name (or the variable) and the key, never dropped."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest

from kforge.server.settings import ConfigError, load_settings

from .conftest import kforge_command, server_env


@pytest.fixture
def config(tmp_path, monkeypatch):
    path = tmp_path / "config.toml"
    monkeypatch.setenv("KFORGE_CONFIG", str(path))
    for name in ("KFORGE_JOB_WAIT_S", "KFORGE_PARALLEL_JOBS"):
        monkeypatch.delenv(name, raising=False)
    return path


def test_unknown_key_names_file_key_and_the_likely_one(config):
    config.write_text("job_wiat_s = 3\n")
    with pytest.raises(ConfigError) as err:
        load_settings()
    assert str(err.value).startswith(f"{config}: unknown key 'job_wiat_s' (did you mean 'job_wait_s'?)")


def test_toml_syntax_error_names_the_file_and_line(config):
    config.write_text("analyst = 'rules'\njob_wait_s = = 3\n")
    with pytest.raises(ConfigError, match=rf"^{config}: not valid TOML: .*line 2"):
        load_settings()


def test_bad_value_names_where_it_came_from(config, monkeypatch):
    config.write_text('job_wait_s = "soon"\n')
    with pytest.raises(ConfigError, match=rf"^{config}: job_wait_s: Input should be a valid number.*'soon'"):
        load_settings()
    config.write_text("job_wait_s = 3\n")
    monkeypatch.setenv("KFORGE_PARALLEL_JOBS", "many")
    with pytest.raises(ConfigError, match=r"^KFORGE_PARALLEL_JOBS: Input should be a valid integer"):
        load_settings()


def test_good_file_is_read_and_the_environment_wins(config, monkeypatch):
    config.write_text("job_wait_s = 3\nparallel_jobs = 2\ncache_max_gb = 1.5\n")
    monkeypatch.setenv("KFORGE_PARALLEL_JOBS", "1")
    settings = load_settings()
    assert (settings.job_wait_s, settings.parallel_jobs, settings.cache_max_gb) == (3, 1, 1.5)


def test_misspelt_variable_is_warned_about(config, monkeypatch, capsys):
    monkeypatch.setenv("KFORGE_JOB_WIAT_S", "3")
    monkeypatch.setenv("KFORGE_SOMETHING_ELSE_ENTIRELY", "1")  # not close to a setting: another tool's, say nothing
    load_settings()
    err = capsys.readouterr().err
    assert "KFORGE_JOB_WIAT_S is not a setting (did you mean KFORGE_JOB_WAIT_S?)" in err
    assert "SOMETHING_ELSE" not in err


def test_the_command_line_stops_with_the_message(tmp_path):
    bad = tmp_path / "config.toml"
    bad.write_text("job_wiat_s = 3\n")
    out = subprocess.run([*kforge_command(), "doctor", "--no-measure"], env=server_env(tmp_path, KFORGE_CONFIG=str(bad)),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert f"kforge: configuration error: {bad}: unknown key 'job_wiat_s'" in out.stderr


def test_the_token_is_never_read_from_the_config_file_nor_copied_into_a_client_config(config, monkeypatch):
    from kforge.server.settings import settings_environment

    config.write_text('token = "' + "x" * 40 + '"\n')
    with pytest.raises(ConfigError, match=rf"^{config}: 'token' is a secret, read from the environment only"):
        load_settings()
    config.write_text("")
    monkeypatch.setenv("KFORGE_TOKEN", "t" * 40)
    monkeypatch.setenv("KFORGE_TRACE", "/tmp/trace.jsonl")
    settings = load_settings()
    assert settings.token.get_secret_value() == "t" * 40 and "t" * 40 not in repr(settings)
    assert str(settings.trace) == "/tmp/trace.jsonl"
    carried = settings_environment()
    assert "KFORGE_TOKEN" not in carried and carried["KFORGE_TRACE"] == "/tmp/trace.jsonl"


def _reads_kforge_variables(path: Path) -> list[int]:
    """Lines of `path` where a function (or a module-level statement) reads the environment and names a KFORGE_
    variable: `os.environ[...]`, `os.environ.get`, `os.getenv`, `environ.items()` beside a "KFORGE_..." string."""
    tree = ast.parse(path.read_text())

    def reads_environment(node: ast.AST) -> bool:
        for n in ast.walk(node):
            if isinstance(n, ast.Attribute) and n.attr in ("environ", "getenv", "environb"):
                return True
            if isinstance(n, ast.Name) and n.id in ("environ", "getenv"):
                return True
        return False

    def names_kforge(node: ast.AST) -> bool:
        return any(isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.startswith("KFORGE_")
                   for n in ast.walk(node))

    units = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    units += [n for n in tree.body if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    units += [s for c in ast.walk(tree) if isinstance(c, ast.ClassDef) for s in c.body
              if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    return sorted({u.lineno for u in units if reads_environment(u) and names_kforge(u)})


def test_only_the_settings_read_kforge_variables_from_the_environment():
    """Every KFORGE_* setting is read by the settings and passed down; a module that reads one itself would
    bypass the config file, the validation and the misspelling warnings."""
    package = Path(__file__).resolve().parents[1]
    settings_module = package / "server" / "settings.py"
    found = {str(p.relative_to(package)): lines for folder in ("server", "tools", "backends", "profilers")
             for p in sorted((package / folder).rglob("*.py")) if p != settings_module
             if (lines := _reads_kforge_variables(p))}
    assert found == {}, f"read KFORGE_* variables from the environment outside server/settings.py: {found}"
    assert _reads_kforge_variables(settings_module)  # the one place that does, seen by the check


def test_the_server_and_the_profilers_read_no_environment_outside_the_settings():
    """Configuration read from the environment comes through the settings (the analyst's API key too): server/ and
    profilers/ never touch `os.environ` elsewhere. (tools/ and backends/ do, for what a worker or a compiler inherits:
    its environment's allowlist, the device pin, the toolchain's homes.)"""
    package = Path(__file__).resolve().parents[1]
    found = []
    for folder in ("server", "profilers"):
        for path in sorted((package / folder).rglob("*.py")):
            if path == package / "server" / "settings.py":
                continue
            tree = ast.parse(path.read_text())
            found += [f"{path.relative_to(package)}:{n.lineno}" for n in ast.walk(tree)
                      if (isinstance(n, ast.Attribute) and n.attr in ("environ", "getenv", "environb"))
                      or (isinstance(n, ast.Name) and n.id in ("environ", "getenv"))]
    assert found == [], found


def test_the_environment_check_sees_the_usual_spellings(tmp_path):
    for line in ('x = os.environ.get("KFORGE_TRACE")', 'x = os.getenv("KFORGE_X", "")', 'x = os.environ["KFORGE_Y"]',
                 'def f():\n    wanted = {"KFORGE_A"}\n    return {k: v for k, v in os.environ.items() if k in wanted}',
                 'from os import environ\nclass C:\n    x = environ.get("KFORGE_Z")'):
        probe = tmp_path / "probe.py"
        probe.write_text("import os\n" + line + "\n")
        assert _reads_kforge_variables(probe), line
    fine = tmp_path / "fine.py"
    fine.write_text('import os\nHELP = "set KFORGE_TOKEN"\n\ndef f():\n    return os.environ.get("CUDA_HOME")\n')
    assert not _reads_kforge_variables(fine)


def test_the_trace_file_reaches_the_workers_through_the_tool_context(tmp_path):
    from kforge.server.settings import Settings, tool_context

    trace = tmp_path / "trace.jsonl"
    assert tool_context(Settings(home=tmp_path, trace=trace)).limits.trace_file == str(trace)
    assert tool_context(Settings(home=tmp_path)).limits.trace_file is None
