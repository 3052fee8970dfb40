"""The embedded CPU video generator: deterministic frames shaped by prompt and seed.

The prompt picks the colour (a colour word in it wins, else a hash), the seed picks the pattern
(stripes of a lighter tint moving at a seed-dependent speed), and every frame carries its index
as a block code (media/blockcode.py). Frames come in chunks after a per-chunk latency, with a
slower first chunk, like a streaming diffusion model; an interaction changes the colour from
the next chunk not yet started.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import numpy as np

from ..media import blockcode
from .engine import GenerateRequest, VideoChunk

PROMPT_COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 180, 60),
    "blue": (30, 60, 220),
    "yellow": (230, 210, 40),
    "orange": (240, 140, 20),
    "purple": (140, 50, 180),
    "cyan": (40, 200, 210),
    "magenta": (210, 40, 190),
    "white": (235, 235, 235),
    "black": (20, 20, 20),
}


def prompt_colour(prompt: str) -> tuple[int, int, int]:
    """The colour a prompt asks for: its first colour word, else one derived from its text."""
    for word in prompt.lower().replace(",", " ").replace(".", " ").split():
        if word in PROMPT_COLOURS:
            return PROMPT_COLOURS[word]
    h = zlib.crc32(prompt.encode())
    return (60 + h % 160, 60 + (h >> 8) % 160, 60 + (h >> 16) % 160)


def render_frame(index: int, width: int, height: int, colour: tuple[int, int, int], seed: int) -> np.ndarray:
    frame = np.empty((height, width, 3), dtype=np.uint8)
    frame[:] = colour
    period = 48 + seed % 48
    offset = (index * (2 + seed % 5)) % period
    xs = (np.arange(width) + offset) % period < period // 3
    tint = tuple(min(255, c + 35) for c in colour)
    frame[:, xs] = tint
    blockcode.stamp(frame, index)
    return frame


def render_chunk(
    first: int, count: int, width: int, height: int, colour: tuple[int, int, int], seed: int
) -> list[np.ndarray]:
    return [render_frame(first + i, width, height, colour, seed) for i in range(count)]


@dataclass
class _Transition:
    start_chunk: int
    chunks: int  # the colour blends into the new one over this many chunks (at once when 0)
    target: tuple[int, int, int]


@dataclass
class _Generation:
    colour: tuple[int, int, int]
    transitions: list[_Transition]
    next_chunk: int = 0

    def colour_for(self, chunk: int) -> tuple[int, int, int]:
        """Apply the transitions that have begun by `chunk`; finished ones become the base colour."""
        colour = self.colour
        for t in sorted(self.transitions, key=lambda t: t.start_chunk):
            if chunk < t.start_chunk:
                break
            weight = min(1.0, (chunk - t.start_chunk + 1) / max(t.chunks, 1))
            colour = tuple(round(a + (b - a) * weight) for a, b in zip(colour, t.target))  # type: ignore[assignment]
            if weight >= 1.0:
                self.colour = colour
                self.transitions.remove(t)
        return colour


class SyntheticVideoEngine:
    """CPU-only, deterministic video generation engine (the default)."""

    name = "synthetic"

    def __init__(self, chunk_frames: int = 33, first_chunk_latency: float = 1.0, chunk_latency: float = 0.5) -> None:
        self.chunk_frames = chunk_frames
        self.first_chunk_latency = first_chunk_latency
        self.chunk_latency = chunk_latency
        self._running: dict[str, _Generation] = {}

    async def generate(self, request: GenerateRequest) -> AsyncIterator[VideoChunk]:
        state = _Generation(colour=prompt_colour(request.prompt), transitions=[])
        self._running[request.request_id] = state
        seed = request.seed if request.seed is not None else 0
        try:
            produced = 0
            while produced < request.num_frames and request.request_id in self._running:
                chunk = state.next_chunk
                await asyncio.sleep(self.first_chunk_latency if chunk == 0 else self.chunk_latency)
                count = min(self.chunk_frames, request.num_frames - produced)
                colour = state.colour_for(chunk)
                frames = await asyncio.to_thread(
                    render_chunk, produced, count, request.width, request.height, colour, seed
                )
                if request.request_id not in self._running:
                    return
                state.next_chunk += 1
                produced += count
                yield VideoChunk(frames=frames, chunk_index=chunk)
        finally:
            self._running.pop(request.request_id, None)

    async def interact(self, request_id: str, event_id: str, prompt: str, transition_chunks: int = 0) -> int:
        state = self._running.get(request_id)
        if state is None:
            raise ValueError(f"no running generation {request_id}")
        # The chunk being rendered now is committed; the change starts with the one after it.
        apply_from = state.next_chunk + 1
        state.transitions.append(_Transition(apply_from, transition_chunks, prompt_colour(prompt)))
        return apply_from

    async def abort(self, request_id: str) -> None:
        self._running.pop(request_id, None)

    async def close(self) -> None:
        self._running.clear()
