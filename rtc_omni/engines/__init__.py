"""Model engines: the synthetic CPU engines by default; GPU engines plug in behind the same interfaces."""

from __future__ import annotations

from dataclasses import dataclass

from ..config import Settings
from ..pcm import INPUT_SAMPLE_RATE, TALKER_SAMPLE_RATE
from ..protocol import generate_messages as generate_proto
from ..protocol import understand_messages as understand_proto
from . import whisper
from .engine import (
    AudioChunk,
    EngineError,
    GenerateEngine,
    GenerateRequest,
    TextDelta,
    Transcriber,
    TurnFrame,
    UnderstandEngine,
    UnderstandOutput,
    UnderstandTurn,
    VideoChunk,
)
from .realtime_upstream import REALTIME_PATH
from .remote import RemoteGenerateEngine, RemoteUnderstandEngine
from .synthetic import SyntheticEngine
from .synthetic_video import SyntheticVideoEngine
from .upstream import DEFAULT_MAX_MESSAGE_BYTES, UpstreamPool
from .upstream_session import UNDERSTAND_MESSAGE_BYTES


@dataclass
class Engines:
    """The engines a server runs: one per session kind it serves (None = kind not served)."""

    understand: UnderstandEngine | None = None
    generate: GenerateEngine | None = None

    @property
    def kinds(self) -> list[str]:
        return [kind for kind in ("understand", "generate") if getattr(self, kind) is not None]

    async def health(self) -> str | None:
        """Why a served kind cannot work any more, or None. Engines that can break for good (a
        vLLM-Omni stage that died) say why from an `async health()`; the others are always healthy."""
        for engine in (self.understand, self.generate):
            check = getattr(engine, "health", None)
            if check is not None and (reason := await check()) is not None:
                return str(reason)
        return None

    async def close(self) -> None:
        for engine in (self.understand, self.generate):
            if engine is not None:
                await engine.close()


def embedded_transcriber(settings: Settings) -> Transcriber | None:
    """The embedded recogniser, when the [transcribe] extra is installed and transcription is on."""
    if settings.transcriber == "none" or not whisper.available():
        return None
    return whisper.WhisperTranscriber()


async def create_engines(settings: Settings) -> Engines:
    """Build the engines named by the settings. The synthetic and remote engines serve both kinds (a
    remote server that lacks one endpoint answers that kind's requests with an error); vLLM-Omni
    serves the one kind its model supports."""
    if settings.engine == "vllm":
        from .vllm_runtime import build_vllm_engines

        understand, generate = await build_vllm_engines(settings)
        return Engines(understand=understand, generate=generate)
    if settings.engine == "remote":

        def pool(path: str, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> UpstreamPool:
            return UpstreamPool(
                settings.upstream,
                path,
                settings.upstream_retry,
                settings.upstream_connect_timeout,
                settings.upstream_health_interval,
                max_message_bytes,
                settings.upstream_api_key,
            )

        realtime = None if settings.upstream_protocol == "legacy" else pool(REALTIME_PATH, UNDERSTAND_MESSAGE_BYTES)
        return Engines(
            understand=RemoteUnderstandEngine(
                pool(understand_proto.WEBSOCKET_PATH, UNDERSTAND_MESSAGE_BYTES),
                realtime,
                settings.upstream_protocol,
            ),
            generate=RemoteGenerateEngine(pool(generate_proto.WEBSOCKET_PATH)),
        )
    if settings.engine == "synthetic":
        return Engines(
            understand=SyntheticEngine(
                ttft=settings.synthetic_ttft,
                token_rate=settings.synthetic_token_rate,
                audio_speed=settings.synthetic_audio_speed,
                voice=settings.synthetic_voice,
                transcriber=embedded_transcriber(settings),
            ),
            generate=SyntheticVideoEngine(
                chunk_frames=settings.synthetic_chunk_frames,
                first_chunk_latency=settings.synthetic_first_chunk_latency,
                chunk_latency=settings.synthetic_chunk_latency,
            ),
        )
    raise ValueError(f"unknown engine: {settings.engine}")


__all__ = [
    "INPUT_SAMPLE_RATE",
    "TALKER_SAMPLE_RATE",
    "AudioChunk",
    "EngineError",
    "Engines",
    "GenerateEngine",
    "GenerateRequest",
    "RemoteGenerateEngine",
    "RemoteUnderstandEngine",
    "SyntheticEngine",
    "SyntheticVideoEngine",
    "VideoChunk",
    "TextDelta",
    "TurnFrame",
    "UnderstandEngine",
    "UnderstandOutput",
    "UnderstandTurn",
    "UpstreamPool",
    "create_engines",
]
