"""Who uses a device at a time (`kforge.tools.device_use`): correctness runs together, a timing alone, and a
timing that waits goes before runs that arrive after it."""

from __future__ import annotations

import anyio

from kforge.tools.device_use import DeviceUse


def _run(main) -> list[str]:
    events: list[str] = []
    anyio.run(main, events)
    return events


def test_runs_share_the_device_and_a_timing_waits_for_them_to_end():
    async def main(events: list[str]) -> None:
        use = DeviceUse()

        async def run(name: str, hold_s: float) -> None:
            async with use.run():
                events.append(f"{name} in")
                await anyio.sleep(hold_s)
                events.append(f"{name} out")

        async def timing() -> None:
            await anyio.sleep(0.05)  # the runs are in
            async with use.timing():
                events.append("timing in")
                assert use.busy == "a timing"
                await anyio.sleep(0.05)
                events.append("timing out")

        async with anyio.create_task_group() as tg:
            tg.start_soon(run, "a", 0.2)
            tg.start_soon(run, "b", 0.3)
            tg.start_soon(timing)

    events = _run(main)
    assert events[:2] == ["a in", "b in"]  # together
    assert events.index("timing in") > max(events.index("a out"), events.index("b out"))


def test_a_run_that_arrives_while_a_timing_waits_goes_after_it():
    async def main(events: list[str]) -> None:
        use = DeviceUse()

        async def run(name: str, start_s: float, hold_s: float) -> None:
            await anyio.sleep(start_s)
            async with use.run():
                events.append(f"{name} in")
                await anyio.sleep(hold_s)
                events.append(f"{name} out")

        async def timing() -> None:
            await anyio.sleep(0.05)
            async with use.timing():
                events.append("timing in")
                await anyio.sleep(0.1)
                events.append("timing out")

        async with anyio.create_task_group() as tg:
            tg.start_soon(run, "first", 0.0, 0.3)
            tg.start_soon(timing)
            tg.start_soon(run, "late", 0.1, 0.01)  # the timing waits for "first" by then

    events = _run(main)
    assert events == ["first in", "first out", "timing in", "timing out", "late in", "late out"]


def test_a_timing_given_up_while_waiting_lets_the_runs_behind_it_go_on():
    async def main(events: list[str]) -> None:
        use = DeviceUse()

        async def first() -> None:
            async with use.run():
                await anyio.sleep(0.5)
            events.append("first out")

        async def impatient_timing() -> None:
            await anyio.sleep(0.05)
            with anyio.move_on_after(0.1):
                async with use.timing():
                    events.append("timing in")
            events.append("timing gave up")

        async def late() -> None:
            await anyio.sleep(0.1)
            async with use.run():
                events.append("late in")

        async with anyio.create_task_group() as tg:
            tg.start_soon(first)
            tg.start_soon(impatient_timing)
            tg.start_soon(late)

    events = _run(main)
    assert "timing in" not in events
    assert events.index("late in") < events.index("first out")  # not held until the first run ended


def test_a_timing_that_gives_way_lets_a_waiting_run_go_first_then_takes_the_device_back():
    """`give_way` (a warm-up's timing ahead, between its rounds): a run that arrived during the timing runs at once,
    and the timing goes on only once it is done; with nothing waiting it keeps the device."""
    async def main(events: list[str]) -> None:
        use = DeviceUse()

        async def background_timing() -> None:
            async with use.timing():
                events.append("timing in")
                assert not use.contended
                await use.give_way()  # nothing waits: it keeps the device
                await anyio.sleep(0.1)
                assert use.contended  # the run below waits
                await use.give_way()
                events.append("timing back")
                assert use.busy == "a timing"

        async def run() -> None:
            await anyio.sleep(0.05)
            async with use.run():
                events.append("run in")
                await anyio.sleep(0.05)
                events.append("run out")

        async with anyio.create_task_group() as tg:
            tg.start_soon(background_timing)
            tg.start_soon(run)

    assert _run(main) == ["timing in", "run in", "run out", "timing back"]
