"""The server's builder's answer (`inline.read_served_build`) and what follows a promoted build
(`fast_build.header_to_build`): the build policy the server's plumbing (`build_service`) asks of the build code."""

from __future__ import annotations

import json
import os
import time

from kforge.backends.build.fast_build import header_to_build
from kforge.backends.build.inline import read_served_build

KEY, HEADER = "0123456789abcdef0123", "fedcba9876543210fedc"


def _lines(*items) -> bytes:
    return "".join(json.dumps(i) + "\n" for i in items).encode()


def test_the_builders_answer_is_read_only_with_its_keys_first_and_a_last_line():
    served = read_served_build(b"compiler noise\n" + _lines({"key": KEY, "pch_key": HEADER},
                                                            {"ninja": ".building-a", "cmd": "c++ -c old"},
                                                            {"ninja": ".building-a", "cmd": "c++ -c main.cpp"},
                                                            {"done": True, "ok": True, "build_dir": ".building-a"}))
    assert served is not None and (served.key, served.pch_key) == (KEY, HEADER)
    assert served.done["build_dir"] == ".building-a"
    assert served.main_cpp_commands == {".building-a": "c++ -c main.cpp"}  # ninja's last run of that directory
    assert read_served_build(_lines({"key": KEY, "pch_key": HEADER})) is None  # it never finished
    assert read_served_build(_lines({"key": "../../etc", "pch_key": HEADER}, {"done": True, "ok": True})) is None
    assert read_served_build(_lines({"done": True, "ok": True}, {"key": KEY, "pch_key": HEADER})) is None


def test_a_build_that_used_a_header_marks_it_used_and_one_that_did_not_asks_for_it(tmp_path):
    pch = tmp_path / "pch" / HEADER
    pch.mkdir(parents=True)
    old = time.time() - 86400
    os.utime(pch, (old, old))
    assert header_to_build(tmp_path, ["precompiled header"], HEADER, True, True) is None
    assert pch.stat().st_mtime > old + 3600  # marked used: `kforge prune` keeps it
    assert header_to_build(tmp_path, ["split"], HEADER, True, True) == pch
    assert header_to_build(tmp_path, ["split"], HEADER, True, False) is None  # headers off
    assert header_to_build(tmp_path, ["split"], HEADER, False, True) is None  # no recorded command to build it with
