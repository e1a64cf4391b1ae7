"""Configuration mistakes are said with the file's name (or the variable) and the key, never dropped."""

from __future__ import annotations

import subprocess

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
