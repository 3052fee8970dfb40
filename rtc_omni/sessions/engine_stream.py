"""An engine's answer as a session consumes it: each output bounded by the stall timeout."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from ..engines.engine import UnderstandEngine, UnderstandOutput, UnderstandTurn


async def stall_bounded(
    engine: UnderstandEngine, turn: UnderstandTurn, stall_timeout: float
) -> AsyncIterator[UnderstandOutput]:
    """The engine's stream for `turn`; TimeoutError when no output comes within `stall_timeout`."""
    stream = engine.generate(turn)
    try:
        while True:
            try:
                async with asyncio.timeout(stall_timeout):
                    output = await anext(stream)
            except StopAsyncIteration:
                return
            yield output
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
