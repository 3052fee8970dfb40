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

from pydantic import BaseModel, ValidationError

from .bench.command import add_arguments as add_bench_arguments
from .bench.command import main as run_bench
from .client.rtc_peers import check_server_url
from .config import Settings, add_settings_arguments, is_loopback, load_settings
from .engines.vllm_runtime import INSTALL_HINT
from .logs import configure_logging
from .protocol.generate_messages import VideoGenerationRequest, coerce_start_fields
from .protocol.understand_messages import SessionConfig
from .protocol.validation import FieldLabel, describe_validation_error, error_text
from .serve import listen_error, refused, serve_process

DEFAULT_SERVER = "http://127.0.0.1:8080"
# `rtc-omni client generate` flags not named after the request field they set, for error messages.
GENERATE_FLAGS = {"num_frames": "--frames", "num_inference_steps": "--steps"}


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """`--help` shows each flag's default, except where there is none to show."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, False) or action.default is argparse.SUPPRESS:
            return action.help
        return super()._get_help_string(action)


def _serve(args: argparse.Namespace) -> int:
    settings = load_settings(args)
    if settings.engine == "vllm" and importlib.util.find_spec("vllm_omni") is None:
        print(f"rtc-omni: {INSTALL_HINT}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, settings.log_format)
    for warning in (model_warning(settings), ice_warning(settings)):
        if warning is not None:
            print(f"rtc-omni: warning: {warning}", file=sys.stderr, flush=True)
    workers = settings.worker_count
    scheme = "http" if settings.tls_cert is None else "https"

    def listening(port: int) -> None:  # once the engines are up and the port is bound (in every worker)
        print(
            f"rtc-omni: engine={settings.engine} ice={','.join(settings.ice_address)} on {scheme}://{settings.host}:{port}"
            + (f" ({workers} workers)" if workers > 1 else ""),
            flush=True,
        )

    if workers == 1:
        return serve_process(settings, None, listening)
    from .workers.engine_process import EngineStartError
    from .workers.supervisor import run_workers

    try:
        return run_workers(settings, serve_process, listening)
    except OSError as exc:
        return refused(listen_error(exc, settings.host, settings.port))
    except EngineStartError as exc:
        return refused(exc)


def model_warning(settings: Settings) -> str | None:
    """A --model that names a real model while the synthetic engine answers (it is only reported)."""
    if settings.engine != "synthetic" or settings.model in (None, "synthetic"):
        return None
    return (
        f"--model {settings.model} only names the model reported to clients: the synthetic engine answers. "
        "To load it, add --engine vllm (pip install 'rtc-omni[vllm]')"
    )


def ice_warning(settings: Settings) -> str | None:
    """--host open to other machines while ICE gathers on loopback only: their media cannot arrive."""
    if is_loopback(settings.host) or not settings.ice_loopback_only:
        return None
    return (
        f"--host {settings.host} takes requests from other machines, but ICE gathers on loopback only "
        f"(--ice-address {','.join(settings.ice_address)}): their media cannot reach this server. "
        "Set --ice-address to an address of this machine they reach (or 'all')"
    )


def _checked(model: type[BaseModel], data: dict[str, Any], label: FieldLabel = str) -> None:
    """Catch a request the server would refuse before connecting, naming what to fix."""
    try:
        model.model_validate(data)
    except ValidationError as exc:
        raise ValueError(describe_validation_error(exc, label)) from None


def _generate_flag(field: str) -> str:
    return GENERATE_FLAGS.get(field, "--" + field.replace("_", "-"))


def _server_url(text: str) -> str:
    try:
        return check_server_url(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _session_config(text: str) -> dict[str, Any]:
    """--config: a JSON object of valid session.config fields."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON ({exc}); e.g. '{{\"num_frames\": 8}}'") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object, e.g. '{\"num_frames\": 8}'")
    try:
        _checked(SessionConfig, value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def _print_now(text: str) -> None:
    print(text, end="", flush=True)


async def _run_client(args: argparse.Namespace) -> int:
    from . import patches
    from .client.media import open_audio_source, open_video_source
    from .client.rtc_peers import UnderstandClient

    try:
        video = open_video_source(args.video, fps=args.fps, size=(args.width, args.height))
    except ValueError as exc:
        raise ValueError(f"--video: {exc}") from None
    try:
        audio = open_audio_source(args.audio)
    except ValueError as exc:
        raise ValueError(f"--audio: {exc}") from None
    patches.apply(args.ice_address or patches.LOOPBACK)
    client = UnderstandClient(args.server, video=video, audio=audio, token=args.token, auto_resume=args.resume)
    try:
        await client.connect()
        print(f"connected in {client.connect_seconds:.3f} s, session {client.session_id}")
        print(f"watch it over WHEP (view only): {client.view_url}")
        await client.configure(**(args.config or {}))
        await asyncio.sleep(args.warmup)
        for query in args.query or ["What do you see and hear?"]:
            print(f"\n> {query}")
            try:
                result = await client.ask(query, timeout=args.timeout, on_text=_print_now)
            except TimeoutError as exc:
                raise TimeoutError(f"{exc} (--timeout)") from None
            print()
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
    from .client.rtc_peers import GenerateClient

    patches.apply(args.ice_address or patches.LOOPBACK)
    client = GenerateClient(
        args.server, video_codec=args.codec, out_path=args.out, token=args.token, auto_resume=args.resume
    )
    request: dict[str, Any] = {"prompt": args.prompt, "fps": args.fps}
    for name in ("size", "num_frames", "seed", "num_inference_steps", "negative_prompt"):
        if getattr(args, name) is not None:
            request[name] = getattr(args, name)
    if args.record:
        request["record"] = True
    _checked(VideoGenerationRequest, coerce_start_fields(request), _generate_flag)
    try:
        await client.connect()
        print(f"connected in {client.connect_seconds:.3f} s, session {client.session_id}")
        print(f"watch it over WHEP (view only): {client.view_url}")
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
        if done.get("recording"):
            print(f"recording: {client.server}{done['recording']}")
        if args.out:
            await client.close()
            print(f"wrote what was received to {args.out}")
        return 0 if frames else 1
    finally:
        await client.close()


def _add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--server", type=_server_url, default=DEFAULT_SERVER, help="the server's base URL")
    parser.add_argument(
        "--ice-address", action="append", help="local ICE address; repeat for several (default: 127.0.0.1)"
    )
    parser.add_argument("--token", help="Bearer token, if the server requires one (its --auth-token)")
    parser.add_argument(
        "--no-resume",
        dest="resume",
        action="store_false",
        help="end when the connection is lost, instead of resuming the session on a new one (a network change)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rtc-omni", description=__doc__, formatter_class=HelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the media server", formatter_class=HelpFormatter)
    add_settings_arguments(serve)
    serve.set_defaults(func=_serve)

    client = commands.add_parser("client", help="connect as a headless aiortc peer", formatter_class=HelpFormatter)
    kinds = client.add_subparsers(dest="kind", required=True)
    understand = kinds.add_parser(
        "understand", help="stream camera and mic, ask questions", formatter_class=HelpFormatter
    )
    _add_connection_arguments(understand)
    understand.add_argument("--video", default="testsrc", help="camera: testsrc | colour:NAME | none | FILE")
    understand.add_argument("--audio", default="tone", help="microphone: tone | tone:HZ | silence | none | FILE")
    understand.add_argument("--width", type=int, default=640, help="width of the testsrc or colour camera")
    understand.add_argument("--height", type=int, default=480, help="height of the testsrc or colour camera")
    understand.add_argument(
        "--fps",
        type=int,
        default=30,
        help="capture rate of the testsrc or colour camera; it sends at most max(2 x sample_fps, 5) fps of it",
    )
    understand.add_argument("--query", action="append", help="a question; repeat for several turns")
    understand.add_argument(
        "--config", type=_session_config, help="session.config fields as JSON, e.g. '{\"num_frames\": 8}'"
    )
    understand.add_argument("--warmup", type=float, default=1.5, help="seconds of media before the first query")
    understand.add_argument(
        "--timeout", type=float, default=60.0, help="seconds each answer may take, its speech included"
    )
    understand.add_argument("--save-audio", help="write the received talker audio to this WAV file")
    understand.set_defaults(func=lambda a: asyncio.run(_run_client(a)))

    generate = kinds.add_parser(
        "generate", help="send a prompt, receive the generated video", formatter_class=HelpFormatter
    )
    _add_connection_arguments(generate)
    generate.add_argument("--prompt", required=True, help="what the video shows")
    generate.add_argument("--negative-prompt", help="what it should not show")
    generate.add_argument("--size", help="WIDTHxHEIGHT, e.g. 832x480 (default: the engine's)")
    generate.add_argument("--fps", type=int, default=16, help="frames per second of the video")
    generate.add_argument("--frames", dest="num_frames", type=int, help="number of frames (default: the engine's)")
    generate.add_argument("--seed", type=int, help="random seed, for a repeatable video")
    generate.add_argument("--steps", dest="num_inference_steps", type=int, help="diffusion inference steps")
    generate.add_argument("--codec", choices=["vp8", "h264"], help="force the video codec")
    generate.add_argument("--out", help="write the received frames to this MP4 file")
    generate.add_argument("--record", action="store_true", help="ask the server to record an MP4 too")
    generate.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the whole video")
    generate.set_defaults(func=lambda a: asyncio.run(_run_generate(a)))

    bench = commands.add_parser(
        "bench",
        formatter_class=HelpFormatter,
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
        elapsed = time.monotonic() - started
        after = f" (after {elapsed:.1f} s)" if elapsed >= 1 else ""
        print(f"rtc-omni: {error_text(exc)}{after}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
