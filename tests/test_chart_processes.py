"""The drawing processes of a profile's charts (`kforge.profilers.chart_processes`): each is warm before its first
chart, and they draw a real profile's charts as the server's own code does."""

from __future__ import annotations

import os

import pytest

from kforge.profilers import chart_processes
from kforge.profilers.charts import profile_charts
from kforge.tools.models import ProfileResult

from .test_answers import png_data, result

pytestmark = pytest.mark.anyio


# Run in a drawing process (a builtin, so the task pickles): its pid and whether its charts were drawn once.
_STATE = "__import__('time').sleep(0.2) or (__import__('os').getpid(), __import__('kforge.profilers.chart_processes', fromlist=['_'])._warmed)"


@pytest.fixture
def drawing_processes():
    chart_processes.start_chart_processes()
    assert chart_processes._executor is not None, "the drawing processes did not start"
    yield chart_processes._executor
    chart_processes.stop_chart_processes()


def test_every_drawing_process_is_warm_before_its_first_task(drawing_processes):
    states = [f.result(timeout=120) for f in [drawing_processes.submit(eval, _STATE) for _ in range(24)]]
    assert len(drawing_processes._processes) == len(chart_processes._DRAWERS)  # one each, both started at once
    assert os.getpid() not in {pid for pid, _ in states}
    assert all(warm for _, warm in states), states  # whichever process took a task had drawn its charts first


async def test_a_profiles_charts_come_from_the_drawing_processes(drawing_processes, tmp_path):
    report = result("profile_cpu", ProfileResult).report
    await chart_processes.PendingCharts(report).keep(tmp_path)
    expected = {c.name: c.data for c in profile_charts(report)}
    assert sorted(p.name for p in tmp_path.glob("*.png")) == sorted(expected)
    for name, data in expected.items():
        assert png_data((tmp_path / name).read_bytes())[1] == data
