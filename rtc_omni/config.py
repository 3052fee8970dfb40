"""Server settings: one pydantic model, filled from defaults, `RTC_OMNI_*` variables and CLI flags.

Every field is exposed as a `rtc-omni serve` flag (`ice_connect_timeout` -> `--ice-connect-timeout`)
and as an environment variable (`RTC_OMNI_ICE_CONNECT_TIMEOUT`); a flag beats the variable, which
beats the default. Lists are comma-separated in the environment and repeatable as flags.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import re
import types
import typing
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from .event_loop import EventLoopChoice
from .media import denoise
from .protocol.validation import describe_validation_error
from .tls import server_ssl_context

ENV_PREFIX = "RTC_OMNI_"
MAX_WORKERS = 256
# Opus packet lengths the talker can send: one 20-60 ms frame, or two 60 ms frames in one packet
# (RFC 6716 code 1); an offer's a=ptime or a=maxptime caps the choice (signaling/ptime.py).
TALKER_PACKET_MS_CHOICES = (20, 40, 60, 120)
DEFAULT_TALKER_PACKET_MS = 120
DEFAULT_MIN_INTERRUPTION_MS = 400  # a cough or a click is shorter, "wait, stop" longer


MIN_CLUSTER_KEY_CHARS = 32
# A node id names a gateway in session ids (n3.w1.<random>): no dot, and never a worker's `w<digits>`.
_NODE_ID = re.compile(r"^[a-z][a-z0-9-]{0,31}$")
NODE_ID_RULE = "a lower-case letter, then up to 31 lower-case letters, digits or '-', other than w0, w1, ..."


def valid_node_id(name: str) -> bool:
    return _NODE_ID.match(name) is not None and re.fullmatch(r"w\d+", name) is None


# What a session speaks to an upstream (--upstream-protocol): docs/deployment.md.
UpstreamProtocol = Literal["auto", "realtime", "legacy"]


class Settings(BaseModel):
    """Everything `rtc-omni serve` can be told."""

    host: str = Field("127.0.0.1", description="HTTP listen address.")
    port: int = Field(8080, ge=0, le=65535, description="HTTP listen port (0 picks a free one).")
    tls_cert: str | None = Field(
        None,
        description="PEM certificate chain: serve HTTPS and WSS on --port (with --tls-key). Behind a reverse proxy "
        "that terminates TLS, leave it out and set --trusted-proxy.",
    )
    tls_key: str | None = Field(None, description="PEM private key of --tls-cert.")
    trusted_proxy: list[str] = Field(
        default_factory=list,
        description="Address or CIDR network of a reverse proxy whose Forwarded / X-Forwarded-Proto / "
        "X-Forwarded-Host headers give the public URL the server writes into Location headers; repeat for "
        "several. Those headers from any other address are ignored.",
    )
    engine: Literal["synthetic", "vllm", "remote"] = Field(
        "synthetic",
        description="Model engine: the embedded CPU engines, vLLM-Omni in-process (GPU, or CPU for tiny models), "
        "or 'remote': every session bridged to the --upstream servers.",
    )
    model: str | None = Field(
        None,
        description="Model name reported to clients (default: 'synthetic'; with --engine remote, none: clients' "
        "model names pass through to the upstream, which checks them); with --engine vllm, the model id or "
        "path to load.",
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto",
        description="--engine vllm: where the model runs. 'auto' follows the installed vLLM (its CPU build: cpu). "
        "'cpu' needs vLLM's CPU build (docs/vllm.md) and applies rtc-omni's CPU deploy settings unless "
        "--deploy-config is given.",
    )
    deploy_config: str | None = Field(
        None,
        description="--engine vllm: vLLM-Omni deploy config YAML (on CPU it replaces rtc-omni's CPU deploy settings).",
    )
    stage_overrides: str | None = Field(None, description="--engine vllm: vLLM-Omni stage overrides as JSON.")
    engine_arg: list[str] = Field(
        default_factory=list,
        description="--engine vllm: a further `vllm serve --omni` argument, KEY=VALUE or a bare KEY for a "
        "switch (e.g. gpu-memory-utilization=0.8, diffusion-streaming-output); repeat for several.",
    )
    upstream: list[str] = Field(
        default_factory=list,
        description="A vLLM-Omni (or rtc-omni) server the remote engine forwards sessions to, as ws://HOST:PORT. "
        "Repeat for several: each turn or generation goes to the healthy one with the fewest sessions.",
    )
    upstream_protocol: UpstreamProtocol = Field(
        "auto",
        description="What the remote engine's realtime sessions speak to an upstream: 'realtime' is vLLM-Omni's "
        "duplex /v1/realtime (voice-only calls, items mirrored, resume); 'legacy' its /v1/video/chat/stream "
        "(every turn needs a camera frame); 'auto' uses /v1/realtime where an upstream serves it and the older "
        "endpoint where it does not. Understanding sessions speak the older endpoint, except with 'realtime'.",
    )
    upstream_retry: float = Field(
        10.0, gt=0, description="Seconds an upstream that failed is skipped before it is tried again."
    )
    upstream_connect_timeout: float = Field(5.0, gt=0, description="Seconds to open a WebSocket to an upstream.")
    upstream_health_interval: float = Field(
        5.0, ge=0, description="Seconds between health checks (GET /health) of each upstream; 0 turns them off."
    )
    upstream_api_key: str | None = Field(
        None,
        description="Bearer token the remote engine presents to every --upstream (Authorization: Bearer ...): "
        "a vLLM-Omni server's --api-key, or an rtc-omni upstream's --auth-token. Prefer the environment "
        "variable to the flag, which `ps` shows.",
    )

    ice_address: list[str] = Field(
        default_factory=lambda: ["127.0.0.1"],
        description="Local addresses ICE gathers candidates on; 'all' means every interface "
        "(aioice's default, loopback excluded). Repeat for several.",
    )
    ice_server: list[str] = Field(
        default_factory=list,
        description="STUN/TURN URL the server's ICE agent uses, e.g. 'turn:127.0.0.1:3478?transport=udp'. "
        "None by default: no STUN server is ever contacted.",
    )
    ice_username: str | None = Field(None, description="Username for the TURN servers in --ice-server.")
    ice_credential: str | None = Field(None, description="Password for the TURN servers in --ice-server.")
    ice_public_address: list[str] = Field(
        default_factory=list,
        description="Public or 1:1-NAT address advertised first in every answer, as a host candidate on the "
        "port of the first gathered one (FFmpeg's WHIP muxer uses only the first). Repeat for several.",
    )
    ice_port_min: int | None = Field(
        None, ge=1, le=65535, description="Lowest UDP port ICE host candidates bind to (with --ice-port-max)."
    )
    ice_port_max: int | None = Field(
        None, ge=1, le=65535, description="Highest UDP port ICE host candidates bind to (with --ice-port-min)."
    )
    turn_secret: str | None = Field(
        None,
        description="coturn's static-auth-secret: TURN URLs in --ice-server get ephemeral TURN REST "
        "credentials (username 'expiry:name', password base64 HMAC-SHA1) instead of --ice-username.",
    )
    turn_ttl: int = Field(86400, ge=60, description="Seconds TURN REST credentials stay valid.")
    max_remote_candidates: int = Field(
        100,
        ge=1,
        description="Remote ICE candidates one peer may give, in its offer and trickled by PATCH together "
        "(aioice's cost per candidate grows with their number); past it, 4xx.",
    )
    ice_connect_timeout: float = Field(
        15.0, gt=0, description="Seconds a new session may take to connect before it is closed."
    )
    peer_silence_timeout: float = Field(
        15.0,
        gt=0,
        description="Seconds a connected peer may send nothing at all (media, RTCP, DataChannel) before its "
        "session is freed: a peer that vanished without a goodbye.",
    )
    resume_grace: float = Field(
        30.0,
        ge=0,
        lt=60,
        description="Seconds a session outlives a lost connection (a network change, a laptop waking) for its "
        "client to resume it with its resume token (docs/resume.md); 0: no resume, a session ends with its "
        "connection. Below 60 s, the talker's write timeout: a detached session's parked speech must not "
        "fail its answer.",
    )
    resume_journal_bytes: int = Field(
        4 * 1024 * 1024,
        ge=64 * 1024,
        description="Bytes of sent events one session keeps for a resuming client to be sent again; older ones "
        "are dropped, and a client that missed them is told to resync (session.resync_required).",
    )
    resume_journal_retain_s: float = Field(
        40.0,
        gt=0,
        description="Seconds a sent event is kept while its client is connected: longer than a lost connection "
        "takes to be noticed (a generation's viewer: ICE consent, ~30 s); clients that send session.event_ack "
        "free it sooner.",
    )
    publisher_media_timeout: float = Field(
        10.0,
        gt=0,
        description="Seconds without RTP before a WHIP publisher's session ends. FFmpeg answers no ICE consent "
        "checks, so its media is what keeps its connection alive.",
    )

    config_timeout: float = Field(
        10.0, gt=0, description="Seconds to wait for session.config before applying defaults."
    )
    idle_timeout: float = Field(
        60.0, gt=0, description="Seconds without any control message or media before a session ends."
    )
    engine_stall_timeout: float = Field(
        60.0, gt=0, description="Seconds the engine may go without output before a turn fails."
    )
    turn_detection: Literal["none", "server_vad", "semantic_vad"] = Field(
        "none",
        description="Turn detection for sessions that never send session.config (e.g. WHIP publishers): "
        "'server_vad' answers when the speaker pauses and lets them interrupt; 'semantic_vad' also asks "
        "the end-of-turn model whether they finished (docs/turn-taking.md).",
    )
    end_of_turn_model: Literal["auto", "none"] = Field(
        "auto",
        description="Semantic turn detection's model: 'auto' runs Smart Turn v3.2 when the [turn] extra is "
        "installed; 'none' turns it off, and semantic_vad falls back to silence.",
    )
    noise_reduction: Literal["none", "near_field", "far_field"] = Field(
        "none",
        description="Noise suppression (RNNoise, the [denoise] extra) for sessions that never send session.config "
        "(e.g. WHIP publishers): the microphone is cleaned before turn detection and the model hear it.",
    )
    websocket_audio_events: Literal["response.audio", "response.output_audio"] = Field(
        "response.audio",
        description="Names of the speech events on WS /v1/video/chat/stream: 'response.audio' "
        "(.delta/.done, the reference protocol) or 'response.output_audio' (vLLM-Omni 0.30's handler).",
    )
    max_frame_size: int = Field(
        10 * 1024 * 1024,
        ge=1,
        description="Longest video.frame base64 string accepted (the reference's 10 MiB; SCTP further "
        "limits one DataChannel message to 256 KiB).",
    )
    max_video_bitrate: int = Field(
        300,
        ge=0,
        description="kb/s of camera video the server asks each sender for: b=AS on the video m-lines of its "
        "answers and a ceiling on the REMB estimates it sends back (0: no cap). Chromium and aiortc (no lower "
        "than 250) honour it; FFmpeg, GStreamer and OBS publishers keep their own bitrate (docs/whip.md).",
    )
    talker_packet_ms: int = Field(
        DEFAULT_TALKER_PACKET_MS,
        description="Milliseconds of speech in each talker packet: 20, 40, 60 or 120 (an offer's a=ptime or "
        "a=maxptime can only lower it). Longer packets cost the server and the peer less per second of speech "
        "and delay nothing (the talker has its audio before its time); an interrupt can leave one packet "
        "playing at the peer; an interrupt sends short silent packets at once, so a plain aiortc receiver, which "
        "holds four, stops too (docs/protocol.md, Talker packet time).",
    )
    min_interruption_ms: int = Field(
        DEFAULT_MIN_INTERRUPTION_MS,
        ge=0,
        le=5000,
        description="Milliseconds of voice over an answer before server turn detection cancels it: the answer's "
        "speech pauses as soon as the user's voice starts, and resumes where it stopped if the voice ends sooner "
        "(a cough, a click, a short 'mm'), which is then no turn. 0: any voice cancels at once. A session's "
        "turn_detection.min_interruption_ms overrides it (docs/turn-taking.md).",
    )
    max_image_pixels: int = Field(
        1920 * 1080,
        ge=64 * 64,
        description="Most pixels (width x height) of one camera image: a larger video.frame gets an error before "
        "it is decoded, a larger RTP frame is scaled down to fit. Default: Full HD (a turn decodes up to 128 "
        "frames, 6 MB of RGB each).",
    )
    auth_token: str | None = Field(
        None,
        description="Bearer token every HTTP request must carry (Authorization: Bearer ...), except OPTIONS "
        "preflights, /healthz and a session's routes, which its own token opens too; it opens every session. "
        "None: creating sessions is open, a session's routes still need its token.",
    )
    session_rate_limit: int = Field(
        60, ge=0, description="New sessions per minute allowed from one client address (0: no limit); more get 429."
    )
    cors_origin: list[str] = Field(
        default_factory=list,
        description="Browser origins allowed to call the API from other sites ('*' for any); repeat for "
        "several. Empty: handlers' defaults (WHIP allows any origin, as RFC 9725 expects).",
    )
    max_sessions: int = Field(64, ge=1, description="Concurrent sessions, across all workers; more get 503.")
    workers: str = Field(
        "1",
        description="Worker processes sharing the HTTP port (SO_REUSEPORT), each owning the media of the sessions "
        "it answered; 'auto': one per CPU core. With --engine vllm the model runs once, in an engine process the "
        'workers reach as the remote engine reaches an upstream (docs/deployment.md, "Several workers").',
    )
    node_id: str | None = Field(
        None,
        description="This gateway's name in a fleet (e.g. n3): the first part of every session id and ephemeral "
        "key it makes (n3.w1.<random>), so any gateway of the fleet passes a request for one of them to it "
        '(docs/deployment.md, "A gateway fleet").',
    )
    peer: list[str] = Field(
        default_factory=list,
        description="Another gateway of the fleet, as NODE=URL (n1=http://gw1.internal:8080; an IP address is fine): "
        "requests for its sessions and keys are forwarded to it, signed with --cluster-key. Repeat for each; "
        "this node's own entry is skipped, so every gateway can be given the same list.",
    )
    cluster_key: str | None = Field(
        None,
        description="The fleet's shared secret, at least 32 characters (openssl rand -hex 32): session and view "
        "tokens are HMACs under a key derived from it, so every gateway checks every gateway's tokens, and it "
        "signs the requests gateways forward to each other. Never logged nor sent to clients; prefer the "
        "environment variable to the flag, which `ps` shows.",
    )
    drain_timeout: float = Field(
        600.0,
        gt=0,
        description="Seconds a draining server (SIGUSR2, or POST /v1/admin/drain) waits for its live sessions to "
        "end before it closes the rest; it then exits 0.",
    )
    event_loop: EventLoopChoice = Field(
        "auto",
        description="The event loop every server process runs: 'uvloop' (libuv; about 4 % less CPU per "
        "session, docs/benchmarks.md), 'asyncio' (the standard library's), 'auto': uvloop where it is installed.",
    )
    engine_start_timeout: float = Field(
        900.0,
        gt=0,
        description="--engine vllm with --workers > 1: seconds the engine process may take to load the model "
        "and listen before the server gives up.",
    )
    max_connections_per_client: int = Field(
        64,
        ge=1,
        description="Open HTTP and WebSocket connections allowed from one client address; more get 503 and are "
        "closed (raise it when many users share one NAT address).",
    )
    http_idle_timeout: float = Field(
        15.0,
        gt=0,
        description="Seconds a connection may take to send a request's headers, or stay idle between requests, "
        "before it is closed.",
    )
    http_body_timeout: float = Field(
        30.0, gt=0, description="Seconds a request's body may take to arrive; slower gets 408."
    )

    synthetic_ttft: float = Field(0.15, ge=0, description="Synthetic engine: seconds before the first text token.")
    synthetic_token_rate: float = Field(40.0, gt=0, description="Synthetic engine: text tokens (words) per second.")
    synthetic_audio_speed: float = Field(
        4.0, gt=0, description="Synthetic engine: talker audio produced this many times faster than real time."
    )
    synthetic_voice: Literal["auto", "tone", "espeak"] = Field(
        "auto",
        description="Synthetic engine: 'espeak' speaks with espeak-ng, 'tone' plays tones, "
        "'auto' uses espeak-ng when installed.",
    )
    transcriber: Literal["auto", "none"] = Field(
        "auto",
        description="Input transcription for realtime sessions: 'auto' uses the engine's recogniser (vLLM: the "
        "model transcribes; synthetic: the embedded Whisper base, when the [transcribe] extra is installed), "
        "'none' turns it off.",
    )

    synthetic_chunk_frames: int = Field(
        33, ge=1, description="Synthetic video engine: frames per chunk (Helios yields ~33)."
    )
    synthetic_first_chunk_latency: float = Field(
        1.0, ge=0, description="Synthetic video engine: seconds before the first chunk."
    )
    synthetic_chunk_latency: float = Field(
        0.5, ge=0, description="Synthetic video engine: seconds to produce each later chunk."
    )
    max_video_pixels: int = Field(
        1920 * 1080,
        ge=1,
        description="Largest generated frame (width x height) a session.start may ask for; larger gets an error. "
        "Raise it on a GPU deployment that generates more.",
    )
    max_video_fps: int = Field(60, ge=1, description="Highest fps a session.start may ask for.")
    max_video_frames: int = Field(
        14_400, ge=1, description="Most frames one generation may ask for (num_frames, or seconds x fps)."
    )
    recording_dir: str | None = Field(
        None, description="Where `record: true` generations are written (default: a temporary folder)."
    )
    max_recordings: int = Field(
        16,
        ge=1,
        description="Recordings kept for download; the oldest finished one is deleted to make room, one still "
        "being written never is (a new `record: true` start is refused while all are).",
    )
    max_recording_bytes: int = Field(
        256 * 1024 * 1024,
        ge=64 * 1024,
        description="Largest recording: it stops there, the generation goes on. The recordings never take more "
        "than --max-recordings x this on disk.",
    )

    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="Log level.")
    log_format: Literal["text", "json"] = Field(
        "text", description="Log lines as text or JSON objects; both carry the session id."
    )

    @field_validator("ice_address")
    @classmethod
    def _check_addresses(cls, value: list[str]) -> list[str]:
        if "all" in value and len(value) > 1:
            raise ValueError("'all' cannot be combined with explicit addresses")
        return value

    @field_validator("trusted_proxy")
    @classmethod
    def _check_trusted_proxies(cls, value: list[str]) -> list[str]:
        for entry in value:
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise ValueError(f"{entry!r} is not an IP address or CIDR network (e.g. 127.0.0.1, ::1/128)") from None
        return value

    @model_validator(mode="after")
    def _check_tls_files(self) -> Settings:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("set both --tls-cert and --tls-key, or neither")
        if self.tls_cert is not None and self.tls_key is not None:
            server_ssl_context(self.tls_cert, self.tls_key)  # TlsFilesError names the file and what is wrong
        return self

    @model_validator(mode="after")
    def _default_model(self) -> Settings:
        if self.model is None and self.engine != "remote":
            self.model = "synthetic"
        return self

    @model_validator(mode="after")
    def _check_noise_reduction(self) -> Settings:
        if self.noise_reduction != "none" and not denoise.available():
            raise ValueError(f"--noise-reduction needs RNNoise: {denoise.INSTALL_HINT}")
        return self

    @model_validator(mode="after")
    def _check_port_range(self) -> Settings:
        if (self.ice_port_min is None) != (self.ice_port_max is None):
            raise ValueError("set both --ice-port-min and --ice-port-max, or neither")
        if self.ice_port_min is not None and self.ice_port_max is not None and self.ice_port_min > self.ice_port_max:
            raise ValueError("--ice-port-min must not exceed --ice-port-max")
        return self

    @model_validator(mode="after")
    def _check_workers(self) -> Settings:
        count = self.worker_count
        ports = self.ice_ports
        if ports is not None and len(ports) < count:
            raise ValueError(
                f"--ice-port-min..--ice-port-max has {len(ports)} ports, fewer than the {count} workers sharing them"
            )
        return self

    @model_validator(mode="after")
    def _check_remote_has_upstreams(self) -> Settings:
        if self.engine == "remote" and not self.upstream:
            raise ValueError("--engine remote needs at least one --upstream ws://HOST:PORT")
        return self

    @model_validator(mode="after")
    def _check_fleet(self) -> Settings:
        # Messages that never quote the key (a model validator's input is no scalar, so none is shown).
        if self.cluster_key is not None and len(self.cluster_key) < MIN_CLUSTER_KEY_CHARS:
            raise ValueError(f"--cluster-key must be at least {MIN_CLUSTER_KEY_CHARS} characters: openssl rand -hex 32")
        if self.peer and (self.node_id is None or self.cluster_key is None):
            raise ValueError("--peer needs --node-id (this gateway's name) and --cluster-key (the fleet's secret)")
        return self

    @field_validator("node_id")
    @classmethod
    def _check_node_id(cls, value: str | None) -> str | None:
        if value is not None and not valid_node_id(value):
            raise ValueError(NODE_ID_RULE)
        return value

    @field_validator("peer")
    @classmethod
    def _check_peers(cls, value: list[str]) -> list[str]:
        names: set[str] = set()
        for entry in value:
            name, _, url = entry.partition("=")
            if not valid_node_id(name) or not url.startswith(("http://", "https://")):
                raise ValueError(f"{entry!r} is not NODE=http://HOST:PORT (NODE: {NODE_ID_RULE})")
            if name in names:
                raise ValueError(f"node {name} is given twice")
            names.add(name)
        return [entry.rstrip("/") for entry in value]

    @field_validator("workers")
    @classmethod
    def _check_worker_count(cls, value: str) -> str:
        if value != "auto" and not (value.isdigit() and 1 <= int(value) <= MAX_WORKERS):
            raise ValueError(f"must be 'auto' or a number of worker processes from 1 to {MAX_WORKERS}")
        return value

    @field_validator("talker_packet_ms")
    @classmethod
    def _check_packet_ms(cls, value: int) -> int:
        if value not in TALKER_PACKET_MS_CHOICES:
            raise ValueError(f"must be one of {', '.join(map(str, TALKER_PACKET_MS_CHOICES))}")
        return value

    @field_validator("upstream")
    @classmethod
    def _check_upstreams(cls, value: list[str]) -> list[str]:
        for url in value:
            if not url.startswith(("ws://", "wss://")):
                raise ValueError(f"{url!r} is not a ws:// or wss:// URL")
        return [url.rstrip("/") for url in value]

    @property
    def gather_all_interfaces(self) -> bool:
        return self.ice_address == ["all"]

    @property
    def ice_loopback_only(self) -> bool:
        """ICE gathers on loopback only: no peer on another machine can reach this server's media."""
        return all(is_loopback(address) for address in self.ice_address)

    @property
    def worker_count(self) -> int:
        """--workers as a number: 'auto' is the CPU cores this process may run on."""
        if self.workers == "auto":
            return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        return int(self.workers)

    @property
    def peers(self) -> dict[str, str]:
        """--peer as node id -> base URL, without this node's own entry."""
        pairs = (entry.split("=", 1) for entry in self.peer)
        return {name: url for name, url in pairs if name != self.node_id}

    @property
    def ice_ports(self) -> range | None:
        """The UDP ports ICE host candidates bind to; None: ephemeral ports."""
        if self.ice_port_min is None or self.ice_port_max is None:
            return None
        return range(self.ice_port_min, self.ice_port_max + 1)


def is_loopback(address: str) -> bool:
    """`address` (an IP address or 'localhost') is reached from this machine only."""
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def _is_list(annotation: Any) -> bool:
    return typing.get_origin(annotation) is list


def _scalar_type(annotation: Any) -> Any:
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return str
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _scalar_type(args[0])
    return annotation if annotation in (int, float, str) else str


def add_settings_arguments(parser: argparse.ArgumentParser) -> None:
    """Add one flag per Settings field; unset flags stay None so env and defaults can apply."""
    for name, field in Settings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        default = field.get_default(call_default_factory=True)
        shown = ",".join(default) if isinstance(default, list) else default
        default_text = f" Default: {shown}." if shown not in (None, "") else ""
        help_text = f"{field.description}{default_text} (env {ENV_PREFIX}{name.upper()})"
        help_text = help_text.replace("%", "%%")  # argparse formats help with %
        choices = None
        if typing.get_origin(field.annotation) is Literal:
            choices = list(typing.get_args(field.annotation))
        if _is_list(field.annotation):
            parser.add_argument(flag, dest=name, action="append", default=None, help=help_text)
        else:
            parser.add_argument(
                flag,
                dest=name,
                type=_scalar_type(field.annotation),
                choices=choices,
                default=None,
                help=help_text,
            )


class SettingsError(ValueError):
    """A flag or environment variable has a value the server cannot use."""


def setting_source(field: str) -> str:
    """How a user sets a field: `port` -> `--port (RTC_OMNI_PORT)`."""
    name = field.split(".")[0]
    if name not in Settings.model_fields:
        return field
    return f"--{name.replace('_', '-')} ({ENV_PREFIX}{name.upper()})"


def load_settings(args: argparse.Namespace | None = None, environ: dict[str, str] | None = None) -> Settings:
    """Merge defaults, environment variables and parsed flags, validating the result."""
    environ = dict(os.environ) if environ is None else environ
    values: dict[str, Any] = {}
    for name, field in Settings.model_fields.items():
        raw = environ.get(ENV_PREFIX + name.upper())
        if raw is not None:
            values[name] = (
                [item.strip() for item in raw.split(",") if item.strip()] if _is_list(field.annotation) else raw
            )
        if args is not None and getattr(args, name, None) is not None:
            values[name] = getattr(args, name)
    try:
        return Settings(**values)
    except ValidationError as exc:
        raise SettingsError(describe_validation_error(exc, setting_source)) from None
