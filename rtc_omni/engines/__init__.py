"""Model engines: the synthetic CPU engine by default; GPU engines plug in behind the same interface."""

from __future__ import annotations

from ..config import Settings
from .base import (
    TALKER_SAMPLE_RATE,
    AudioChunk,
    TextDelta,
    TurnFrame,
    UnderstandEngine,
    UnderstandOutput,
    UnderstandTurn,
)
from .synthetic import SyntheticEngine


def create_engine(settings: Settings) -> UnderstandEngine:
    """Build the engine named by the settings."""
    if settings.engine == "synthetic":
        return SyntheticEngine(
            ttft=settings.synthetic_ttft,
            token_rate=settings.synthetic_token_rate,
            audio_speed=settings.synthetic_audio_speed,
            voice=settings.synthetic_voice,
        )
    raise ValueError(f"unknown engine: {settings.engine}")


__all__ = [
    "TALKER_SAMPLE_RATE",
    "AudioChunk",
    "SyntheticEngine",
    "TextDelta",
    "TurnFrame",
    "UnderstandEngine",
    "UnderstandOutput",
    "UnderstandTurn",
    "create_engine",
]
