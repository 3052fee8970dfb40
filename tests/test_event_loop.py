"""`--event-loop`: which loop a server process runs, and a clear refusal when it is not installed."""

from __future__ import annotations

import asyncio
import importlib.util

import pytest
import uvloop

from rtc_omni.event_loop import EventLoopUnavailable, loop_factory


def test_auto_and_uvloop_run_uvloop_and_asyncio_runs_the_standard_loop() -> None:
    for choice in ("auto", "uvloop"):
        factory = loop_factory(choice)
        assert factory is not None
        with asyncio.Runner(loop_factory=factory) as runner:
            assert isinstance(runner.get_loop(), uvloop.Loop)
    assert loop_factory("asyncio") is None


def test_without_uvloop_auto_falls_back_and_uvloop_is_refused_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "uvloop" else find_spec(name))
    assert loop_factory("auto") is None
    with pytest.raises(EventLoopUnavailable, match="pip install uvloop"):
        loop_factory("uvloop")
