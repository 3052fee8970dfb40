"""`rtc-omni`: serve the media server, connect to one as a headless client, or benchmark it."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import logging
import sys
import time
from typing import Any

from .bench.cli import add_arguments as add_bench_arguments
from .bench.cli import main as run_bench
from .config import add_settings_arguments, load_settings
from .engines.vllm_runtime import INSTALL_HINT, EngineUnavailable
from .logs import configure_logging


def _serve(args: argparse.Namespace) -> int:
    from aiohttp import web

    from .app import create_app

    settings = load_settings(args)
    if settings.engine == "vllm" and importlib.util.find_spec("vllm_omni") is None:
        print(f"rtc-omni: {INSTALL_HINT}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, settings.log_format)
    app = create_app(settings)
    print(
        f"rtc-omni: engine={settings.engine} ice={','.join(settings.ice_address)} "
        f"on http://{settings.host}:{settings.port}",
        flush=True,
    )
    try:
        web.run_app(app, host=settings.host, port=settings.port, print=None, shutdown_timeout=10.0)
    except EngineUnavailable as exc:
        print(f"rtc-omni: {exc}", file=sys.stderr)
        return 2
    return 0


async def _run_client(args: argparse.Namespace) -> int:
    from . import patches
    from .client.media import open_audio_source, open_video_source
    from .client.peer import UnderstandClient

    video = open_video_source(args.video, fps=args.fps, size=(args.width, args.height))
    audio = open_audio_source(args.audio)
    patches.apply(args.ice_address or patches.LOOPBACK)
    client = UnderstandClient(args.server, video=video, audio=audio, token=args.token)
    try:
        await client.connect()
        print(f"connected in {client.connect_seconds:.3f} s, session {client.session_id}")
        config = json.loads(args.config) if args.config else {}
        await client.configure(**config)
        await asyncio.sleep(args.warmup)
        for query in args.query or ["What do you see and hear?"]:
            print(f"\n> {query}")
            result = await client.ask(query, timeout=args.timeout)
            print(result.text)
            for message in result.errors:
                print(f"error: {message}", file=sys.stderr)
            ttft = result.time_to_first_text
            audio_at = None
            if client.recorder is not None:
                audio_at = next(
                    (
                        f.at
                        for f in client.recorder.frames
                        if f.at >= result.sent_at and f.rms >= client.recorder.SILENCE_RMS
                    ),
                    None,
                )
            print(
                f"[{result.request_id}] first text {ttft:.3f} s" if ttft is not None else f"[{result.request_id}]",
                f"first audio {audio_at - result.sent_at:.3f} s" if audio_at else "no audio",
                f"total {result.done_at - result.sent_at:.3f} s" if result.done_at else "",
                sep=", ",
            )
        if args.save_audio and client.recorder is not None:
            await asyncio.sleep(0.3)
            client.recorder.save_wav(args.save_audio)
            print(f"talker audio saved to {args.save_audio}")
        client.send({"type": "video.done"})
        await client.wait_event("session.done", timeout=args.timeout)
        return 0
    finally:
        await client.close()


async def _run_generate(args: argparse.Namespace) -> int:
    from . import patches
    from .client.peer import GenerateClient

    patches.apply(args.ice_address or patches.LOOPBACK)
    client = GenerateClient(args.server, video_codec=args.codec, out_path=args.out, token=args.token)
    request: dict[str, Any] = {"prompt": args.prompt, "fps": args.fps}
    for name in ("size", "num_frames", "seed", "num_inference_steps", "negative_prompt"):
        if getattr(args, name) is not None:
            request[name] = getattr(args, name)
    if args.record:
        request["record"] = True
    try:
        await client.connect()
        print(f"connected in {client.connect_seconds:.3f} s, session {client.session_id}")
        started = await client.start(**request)
        sent_at = client.event_times[client.events.index(started)]
        print(f"generating {started['request_id']}: {json.dumps(started['config'])}")
        done = await client.wait_event("session.done", timeout=args.timeout)
        await asyncio.sleep(0.3)  # the last frames are still on the wire
        frames = list(client.receiver.frames) if client.receiver is not None else []
        for event in client.events:
            if event["type"] == "error":
                print(f"error: {event['message']}", file=sys.stderr)
        if frames:
            span = frames[-1].at - frames[0].at
            fps = (len(frames) - 1) / span if span > 0 else 0.0
            print(
                f"received {len(frames)} frames of {frames[0].width}x{frames[0].height} "
                f"(server sent {done['frames']} in {done['chunks']} chunks, stopped={done['stopped']}); "
                f"first frame after {frames[0].at - sent_at:.3f} s; effective {fps:.2f} fps"
            )
        else:
            print("received no frames")
        if args.out:
            await client.close()
            print(f"wrote what was received to {args.out}")
        return 0 if frames else 1
    finally:
        await client.close()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rtc-omni", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the media server")
    add_settings_arguments(serve)
    serve.set_defaults(func=_serve)

    client = commands.add_parser("client", help="connect as a headless aiortc peer")
    kinds = client.add_subparsers(dest="kind", required=True)
    understand = kinds.add_parser("understand", help="stream camera and mic, ask questions")
    understand.add_argument("--server", default="http://127.0.0.1:8080", help="server base URL")
    understand.add_argument("--video", default="testsrc", help="testsrc | colour:NAME | none | FILE")
    understand.add_argument("--audio", default="tone", help="tone | tone:HZ | silence | none | FILE")
    understand.add_argument("--width", type=int, default=640)
    understand.add_argument("--height", type=int, default=480)
    understand.add_argument("--fps", type=int, default=30)
    understand.add_argument("--query", action="append", help="a question; repeat for several turns")
    understand.add_argument("--config", help="session.config fields as JSON, e.g. '{\"num_frames\": 8}'")
    understand.add_argument("--warmup", type=float, default=1.5, help="seconds of media before the first query")
    understand.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for each answer")
    understand.add_argument("--save-audio", help="write the received talker audio to this WAV file")
    understand.add_argument("--ice-address", action="append", help="local ICE address (default 127.0.0.1)")
    understand.add_argument("--token", help="Bearer token, if the server requires one")
    understand.set_defaults(func=lambda a: asyncio.run(_run_client(a)))

    generate = kinds.add_parser("generate", help="send a prompt, receive the generated video")
    generate.add_argument("--server", default="http://127.0.0.1:8080", help="server base URL")
    generate.add_argument("--prompt", required=True)
    generate.add_argument("--negative-prompt")
    generate.add_argument("--size", help="WIDTHxHEIGHT, e.g. 832x480")
    generate.add_argument("--fps", type=int, default=16)
    generate.add_argument("--frames", dest="num_frames", type=int, help="number of frames")
    generate.add_argument("--seed", type=int)
    generate.add_argument("--steps", dest="num_inference_steps", type=int)
    generate.add_argument("--codec", choices=["vp8", "h264"], help="force the video codec")
    generate.add_argument("--out", help="write the received frames to this MP4 file")
    generate.add_argument("--record", action="store_true", help="ask the server to record an MP4 too")
    generate.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the whole video")
    generate.add_argument("--ice-address", action="append", help="local ICE address (default 127.0.0.1)")
    generate.add_argument("--token", help="Bearer token, if the server requires one")
    generate.set_defaults(func=lambda a: asyncio.run(_run_generate(a)))

    bench = commands.add_parser(
        "bench",
        help="measure latency, interrupt, capacity over 127.0.0.1 ([bench] extra)",
        description="Start `rtc-omni serve` on 127.0.0.1, drive it with headless peers, print the figures "
        "(method and latest figures: docs/benchmarks.md).",
    )
    add_bench_arguments(bench)
    bench.set_defaults(func=run_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    started = time.monotonic()
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a CLI reports, it does not dump a traceback at users
        if logging.getLogger().isEnabledFor(logging.DEBUG):
            raise
        print(f"rtc-omni: {exc or type(exc).__name__} (after {time.monotonic() - started:.1f} s)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
