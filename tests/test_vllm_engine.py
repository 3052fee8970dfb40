"""The vLLM-Omni engines on CPU: fakes of AsyncOmni's object shapes, driven through the real
sessions and real aiortc peers, checked by what reaches the peer."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import json
import wave
from typing import Any

import numpy as np
import pytest
import simplejpeg

from rtc_omni.client.rtc_peers import GenerateClient
from rtc_omni.config import DEFAULT_TALKER_PACKET_MS
from rtc_omni.engines.engine import (
    AudioChunk,
    EngineError,
    ForcedTool,
    FunctionArguments,
    FunctionCallStarted,
    FunctionTool,
    TextDelta,
    UnderstandOutput,
    UnderstandTurn,
)
from rtc_omni.engines.vllm_omni import CODEC_FRAME_SAMPLES, OmniGenerateEngine, OmniUnderstandEngine
from rtc_omni.pcm import TALKER_SAMPLE_RATE

from .conftest import ClientFactory, ServerFactory, http_json
from .realtime_client import add_user_text, connect, text_of
from .vllm_fakes import (
    TOOL_HISTORY,
    WEATHER,
    FakeChat,
    FakeDiffusionOmni,
    FakeDiffusionRuntime,
    FakeOmni,
    FakeSamplingParams,
    FakeTensor,
)

# " red" then " reddish": a delta that starts with the one before it must still arrive whole.
WORDS = "The camera shows a red reddish wall and I hear a tone".split()


def wav_samples(event: dict[str, Any]) -> np.ndarray:
    with wave.open(io.BytesIO(base64.b64decode(event["data"]))) as wav:
        assert wav.getframerate() == 24_000
        return np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2").astype(np.float32) / 32767


async def understand_server(make_server: ServerFactory, omni: FakeOmni) -> tuple[Any, FakeChat]:
    chat = FakeChat()
    server = await make_server(engine=OmniUnderstandEngine(omni, chat))
    return server, chat


async def test_text_and_audio_reach_the_peer_as_vllm_omni_produced_them(
    make_server: ServerFactory, make_client: ClientFactory
) -> None:
    # ~4 codec frames (80 ms each) first, then outputs carrying several talker steps each.
    groups = [[4 * 1920], [25 * 1920, 960], [25 * 1920, 1920, 480]]
    steps = [n for group in groups for n in group]
    omni = FakeOmni(WORDS, groups)
    server, chat = await understand_server(make_server, omni)
    sampling = [{"temperature": 0.2}, {"top_k": 10}, {}]
    client = await make_client(
        server,
        colour="red",
        tone=440.0,
        config={
            "audio_events": True,
            "sampling_params_list": sampling,
            "system_prompt": "Be brief.",
            "model": "qwen3-omni",
        },
    )
    await client.wait_event("video.frame.ack")
    await asyncio.sleep(0.5)
    FakeTensor.copies = 0

    result = await client.ask("What do you see?")

    # Text: DELTA outputs are passed on as they come; words that came after audio began still
    # arrive, and response.text.done carries the complete text.
    assert result.text == " ".join(WORDS)
    done = next(e for e in result.events if e["type"] == "response.text.done")
    assert done["text"] == " ".join(WORDS)
    kinds = [e["type"] for e in result.events]
    assert kinds.index("response.audio.delta") < max(i for i, k in enumerate(kinds) if k == "response.text.delta")
    # Audio: every engine sample arrives once and in order, minus the turn's 1920-sample leading edge.
    audio = np.concatenate([wav_samples(e) for e in result.events if e["type"] == "response.audio.delta"])
    assert audio.size == sum(steps) - CODEC_FRAME_SAMPLES
    expected = np.arange(CODEC_FRAME_SAMPLES, sum(steps)) / 1e6
    assert np.abs(audio - expected).max() < 2e-4
    assert FakeTensor.copies == len(steps)  # each per-step tensor left the "GPU" once
    # The ramp is inaudible; only its end clicks, where the engine's audio stops at 0.1 and silence
    # follows (in the last packet and the first of the silent tail). Judged by position in the audio
    # received, not by time: that packet and the turn's done event leave together, in either order.
    pieces = [f.rms for f in client.recorder.frames]  # 20 ms each
    ramp_pieces = (sum(steps) - CODEC_FRAME_SAMPLES) // (TALKER_SAMPLE_RATE // 50)
    first_voiced = next((i for i, rms in enumerate(pieces) if rms >= client.recorder.SILENCE_RMS), len(pieces))
    assert first_voiced >= ramp_pieces - DEFAULT_TALKER_PACKET_MS // 20, (first_voiced, ramp_pieces)
    # The request: session.config's sampling params as the stages' objects, model, system prompt,
    # frames as image parts named by the md5 of their JPEG, the mic as a 16 kHz WAV part, the text.
    kwargs = omni.generate_kwargs[0]
    assert kwargs["sampling_params_list"] == [FakeSamplingParams(values) for values in sampling]
    assert kwargs["output_modalities"] == ["text", "audio"] and kwargs["prompt"] == {"prompt_token_ids": [1, 2, 3]}
    request = chat.requests[0]
    assert request["model"] == "qwen3-omni" and "sampling_params_list" not in request
    assert request["mm_processor_kwargs"] == {"use_audio_in_video": True}
    assert request["messages"][0] == {"role": "system", "content": "Be brief."}
    parts = request["messages"][-1]["content"]
    images = [p for p in parts if p["type"] == "image_pil"]
    assert len(images) == 1 and len(images[0]["uuid"]) == 32
    assert images[0]["image_pil"].getpixel((10, 10))[0] > 200  # the red camera frame
    audio_part = next(p for p in parts if p["type"] == "input_audio")
    with wave.open(io.BytesIO(base64.b64decode(audio_part["input_audio"]["data"]))) as wav:
        assert wav.getframerate() == 16_000 and wav.getnframes() > 6000  # the 0.5 s of mic before the query
    assert parts[-1] == {"type": "text", "text": "What do you see?"}

    omni.audio_groups = [[4 * 1920]]  # the second turn is about the history: 80 ms of talker, not 4.5 s
    second = await client.ask("And now?")
    history = chat.requests[1]["messages"][1:3]
    assert history == [{"role": "user", "content": "What do you see?"}, {"role": "assistant", "content": result.text}]
    assert second.text == " ".join(WORDS)


async def test_bad_sampling_params_fail_the_turn_with_vllm_omnis_message(
    make_server: ServerFactory, make_client: ClientFactory
) -> None:
    omni = FakeOmni(WORDS, [])
    server, _ = await understand_server(make_server, omni)
    client = await make_client(
        server, colour="red", tone=None, config={"modalities": ["text"], "sampling_params_list": [{"temprature": 1}]}
    )
    await client.wait_event("video.frame.ack")
    failed = await client.ask("hello")
    error = next(e for e in failed.events if e["type"] == "error")
    assert error["message"] == "Query processing failed"
    assert error["detail"].startswith("Failed to build request: SamplingParams got unexpected keyword arguments")
    assert omni.generate_kwargs == []  # nothing reached the engine


async def test_an_interrupted_request_is_aborted_before_the_next_and_a_finished_one_never(
    make_server: ServerFactory, make_client: ClientFactory
) -> None:
    omni = FakeOmni(WORDS * 5, [[960]] * 40, step_delay=0.02)  # 2 s a turn: the first is still running
    server, _ = await understand_server(make_server, omni)
    client = await make_client(server, colour="red", tone=None, config={"modalities": ["text"]})
    await client.wait_event("video.frame.ack")

    mark = len(client.events)
    client.send({"type": "video.query", "text": "long answer"})
    first = await client.wait_event("response.start", after=mark)
    await client.wait_event("response.text.delta", after=mark)
    second = await client.ask("interrupt")
    third = await client.ask("after a finished turn", timeout=60)

    calls = [(what, rid) for what, rid, _ in omni.calls]
    assert calls == [
        ("generate", first["request_id"]),
        ("abort", first["request_id"]),
        ("generate", second.request_id),
        ("generate", third.request_id),
    ]
    abort_at = next(t for what, _, t in omni.calls if what == "abort")
    second_at = [t for what, rid, t in omni.calls if rid == second.request_id][0]
    assert second_at - abort_at >= 0.09  # upstream's settle time after an abort


async def test_an_engine_error_is_reported_and_the_session_goes_on(
    make_server: ServerFactory, make_client: ClientFactory
) -> None:
    omni = FakeOmni(WORDS, [], fail_with="CUDA out of memory")
    server, _ = await understand_server(make_server, omni)
    client = await make_client(server, colour="red", tone=None, config={"modalities": ["text"]})
    await client.wait_event("video.frame.ack")
    failed = await client.ask("boom")
    assert failed.errors == ["Query processing failed"]
    omni.fail_with = None
    assert (await client.ask("again")).text == " ".join(WORDS)


async def test_a_talker_dict_without_a_penalty_keeps_the_deploys(
    make_server: ServerFactory, make_client: ClientFactory
) -> None:
    # Qwen2.5-Omni's deploy defaults; the session's talker dict has no repetition_penalty, which
    # would kill the real talker stage for good.
    deploy = [{"temperature": 0.0, "repetition_penalty": 1.1}, {"top_k": 40, "repetition_penalty": 1.05}, {}]
    omni = FakeOmni(WORDS, [])
    server = await make_server(engine=OmniUnderstandEngine(omni, FakeChat(stage_defaults=deploy)))
    talker = {"temperature": 0.9, "top_k": 20, "max_tokens": 32}
    client = await make_client(
        server, colour="red", tone=None, config={"modalities": ["text"], "sampling_params_list": [{}, talker]}
    )
    await client.wait_event("video.frame.ack")
    assert (await client.ask("hi")).text == " ".join(WORDS)
    thinker, sent_talker = omni.generate_kwargs[0]["sampling_params_list"]
    assert thinker.values == deploy[0]
    assert sent_talker.values == {"temperature": 0.9, "top_k": 20, "max_tokens": 32, "repetition_penalty": 1.05}


async def test_a_dead_stage_makes_health_fail_and_every_turn_say_why(
    make_server: ServerFactory, make_client: ClientFactory
) -> None:
    omni = FakeOmni(WORDS, [], kills_stage=1)
    server, _ = await understand_server(make_server, omni)
    assert (await http_json(server, "GET", "/healthz"))[0] == 200
    client = await make_client(server, colour="red", tone=None, config={"modalities": ["text"]})
    await client.wait_event("video.frame.ack")
    for query in ("boom", "again"):
        failed = await client.ask(query)
        assert failed.errors == ["Query processing failed"]
        error = next(e for e in failed.events if e["type"] == "error")
        assert "engine is down (Stage-1 has no live replica)" in error["detail"], error
    status, body = await http_json(server, "GET", "/healthz")
    assert status == 503 and body["status"] == "unhealthy" and "Stage-1 has no live replica" in body["detail"]


@pytest.mark.media
@pytest.mark.parametrize("shape", ["float_signed_5d", "float_unit_5d", "list_of_frames"])
async def test_diffusion_chunks_play_in_order_at_the_peer(make_server: ServerFactory, shape: str) -> None:
    omni = FakeDiffusionOmni(chunks=3, chunk_frames=8, shape=shape)
    runtime = FakeDiffusionRuntime()
    server = await make_server(video_engine=OmniGenerateEngine(omni, runtime))
    client = GenerateClient(server.url)
    await client.connect()
    try:
        await client.start(
            prompt="a red kite",
            size="160x128",
            fps=30,
            num_frames=24,
            seed=7,
            guidance_scale=1.0,
            extra_params={"is_amplify_first_chunk": True},
            lora={"name": "style", "path": "/x", "scale": 0.5},
        )
        done = await client.wait_event("session.done", timeout=20)
        await asyncio.sleep(0.3)
        frames = list(client.receiver.frames)
    finally:
        await client.close()
    assert done["frames"] == 24 and done["chunks"] == 3 and not done["stopped"]
    assert [f.index for f in frames] == list(range(24))
    assert all(f.mean_rgb[0] > 150 and f.mean_rgb[2] < 90 for f in frames)  # the red survives normalisation
    params = runtime.built[0]
    assert (params.width, params.height, params.num_frames, params.fps, params.frame_rate) == (160, 128, 24, 30, 30.0)
    assert params.seed == 7 and params.guidance_scale == 1.0
    assert params.num_inference_steps == 50  # not set by the client: the engine default stands
    assert params.extra_args == {"is_amplify_first_chunk": True}
    assert (params.lora_request, params.lora_scale) == ("lora:style", 0.5)
    assert omni.calls[0][1]["prompt"] == {"prompt": "a red kite"}


@pytest.mark.media
async def test_the_engines_own_chunk_reports_name_the_interactions_where_announced(make_server: ServerFactory) -> None:
    # vLLM-Omni starts the change two chunks after the one being made: announced as it will apply it.
    omni = FakeDiffusionOmni(chunks=6, chunk_frames=4, delay=0.3, streaming=True)
    server = await make_server(video_engine=OmniGenerateEngine(omni, FakeDiffusionRuntime()))
    client = GenerateClient(server.url)
    await client.connect()
    try:
        await client.start(prompt="red", size="160x128", fps=30, num_frames=24)
        await client.wait_event("video.chunk_metadata")
        client.send({"type": "session.interaction", "interaction": {"event_id": "e1", "event": {"prompt": "blue"}}})
        queued = await client.wait_event("session.interaction.queued")
        await client.wait_event("session.done", timeout=20)
    finally:
        await client.close()
    # No transition_chunks: vLLM-Omni's default of 3 chunks is asked for explicitly.
    assert ("interaction", {"event_id": "e1", "event": {"prompt": "blue"}, "transition_chunks": 3}) in omni.calls
    chunks = [e for e in client.events if e["type"] == "video.chunk_metadata"]
    reported = [
        {k: c[k] for k in ("generation_chunk_index", "started_event_ids", "active_event_ids", "completed_event_ids")}
        for c in chunks
    ]
    assert reported == omni.reports
    started = next(c["generation_chunk_index"] for c in chunks if c["started_event_ids"] == ["e1"])
    completed = next(c["generation_chunk_index"] for c in chunks if c["completed_event_ids"] == ["e1"])
    assert started == queued["apply_from_chunk"] and completed == started + 2


async def test_a_pipeline_without_a_video_stage_is_refused(make_server: ServerFactory) -> None:
    image_only = FakeDiffusionRuntime(video_output=False)
    server = await make_server(video_engine=OmniGenerateEngine(FakeDiffusionOmni(1, 4), image_only))
    client = GenerateClient(server.url)
    await client.connect()
    try:
        await client.start(prompt="x", size="160x128", num_frames=4)
        error = await client.wait_event("error")
        done = await client.wait_event("session.done")
    finally:
        await client.close()
    assert error["message"] == "No final video output stage found in video generation pipeline."
    assert done["stopped"] is True and done["frames"] == 0


def test_the_leading_edge_is_cut_only_from_a_long_enough_first_block() -> None:
    from rtc_omni.engines.vllm_omni import AudioDrain

    short = AudioDrain()
    assert short.take(FakeTensor(np.ones((1, 3840), np.float32))).size == 3840  # not > 2 codec frames
    assert short.take(FakeTensor(np.ones((1, 5000), np.float32))).size == 5000  # later blocks uncut
    long = AudioDrain()
    assert long.take([]) is None and long.take(FakeTensor(np.ones((1, 0), np.float32))) is None
    assert long.take([FakeTensor(np.ones((1, 3000), np.float32))] * 2).size == 6000 - CODEC_FRAME_SAMPLES
    assert long.take(FakeTensor(np.ones((1, 3841), np.float32))).size == 3841


def test_the_md5_uuid_names_the_jpeg_bytes() -> None:
    from rtc_omni.engines.engine import TurnFrame, UnderstandTurn
    from rtc_omni.engines.vllm_omni import build_messages

    jpeg = simplejpeg.encode_jpeg(np.zeros((4, 4, 3), np.uint8))
    frame = TurnFrame(frame_id="f", pts_ms=0.0, jpeg=jpeg)
    turn = UnderstandTurn(
        request_id="r",
        frames=[frame],
        audio_pcm16=b"",
        query="",
        history=[{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "x"}]}] * 3,
    )
    messages = build_messages(turn)
    assert messages[-1]["content"][0]["uuid"] == hashlib.md5(jpeg).hexdigest()
    assert messages[:2] == [{"role": "user", "content": "a"}, {"role": "user", "content": "a"}]
    assert len(messages[-1]["content"]) == 1  # no audio part, no empty text part


def test_a_clip_too_short_for_the_models_audio_encoder_is_padded_with_silence() -> None:
    import base64
    import io
    import wave

    from rtc_omni.engines.engine import UnderstandTurn
    from rtc_omni.engines.vllm_omni import build_messages

    def sent_samples(pcm16: bytes) -> np.ndarray:
        turn = UnderstandTurn(request_id="r", frames=[], audio_pcm16=pcm16, query="q", history=[])
        part = build_messages(turn)[-1]["content"][0]
        with wave.open(io.BytesIO(base64.b64decode(part["input_audio"]["data"]))) as wav:
            return np.frombuffer(wav.readframes(wav.getnframes()), "<i2")

    clip = np.full(304, 1000, "<i2")  # 19 ms: vLLM-Omni failed the turn with this (seen in CI)
    padded = sent_samples(clip.tobytes())
    assert padded.size == 1600 and (padded[:304] == 1000).all() and not padded[304:].any()
    long = np.arange(4000, dtype="<i2")
    assert (sent_samples(long.tobytes()) == long).all()


def test_the_settings_become_vllm_serves_command_line() -> None:
    from rtc_omni.config import Settings
    from rtc_omni.engines.vllm_runtime import serve_argv

    settings = Settings(
        engine="vllm",
        model="Qwen/Qwen3-Omni-30B-A3B-Instruct",
        deploy_config="qwen3_omni_moe.yaml",
        stage_overrides='{"0": {"gpu_memory_utilization": 0.8}}',
        engine_arg=["max_model_len=8192", "--enforce-eager", "async-chunk"],
    )
    assert serve_argv(settings) == [
        "serve",
        "Qwen/Qwen3-Omni-30B-A3B-Instruct",
        "--omni",
        "--deploy-config",
        "qwen3_omni_moe.yaml",
        "--stage-overrides",
        '{"0": {"gpu_memory_utilization": 0.8}}',
        "--max-model-len=8192",
        "--enforce-eager",
        "--async-chunk",
    ]


def test_serve_without_vllm_omni_exits_with_the_install_command() -> None:
    import importlib.util
    import subprocess
    import sys

    if importlib.util.find_spec("vllm_omni") is not None:
        pytest.skip("vllm-omni is installed here: the server would load the model")
    done = subprocess.run(
        [sys.executable, "-m", "rtc_omni", "serve", "--engine", "vllm", "--model", "Qwen/Qwen3-Omni-30B-A3B-Instruct"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "pip install 'rtc-omni[vllm]'" in done.stderr and "vLLM-Omni 0.30" in done.stderr


@pytest.mark.slow  # imports vLLM in its own environment
def test_the_engines_pass_the_contract_checks_against_the_real_vllm_omni() -> None:
    """tests/test_vllm_contract.py, run by the CPU-only vLLM-Omni environment that .ci/run builds
    with tests/vllm_cpu/env.sh and names in RTC_OMNI_VLLM_PYTHON."""
    import os
    import subprocess
    from pathlib import Path

    from .tools import require_loopback_namespace, unavailable

    python = os.environ.get("RTC_OMNI_VLLM_PYTHON")
    if not python:
        unavailable(
            "RTC_OMNI_VLLM_PYTHON names no vLLM-Omni environment "
            "(bash tests/vllm_cpu/env.sh DIR builds one; then RTC_OMNI_VLLM_PYTHON=DIR/bin/python)"
        )
    require_loopback_namespace()  # vLLM-Omni looks models up on the Hub; here it must find nothing
    repo = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "tests/test_vllm_contract.py"],
        cwd=repo,
        env={**os.environ, "PYTHONPATH": str(repo)},  # this checkout, whatever the environment was built from
        capture_output=True,
        text=True,
        timeout=600,
    )
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-2000:]
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert " passed" in summary and "skipped" not in summary, summary


# ----------------------------------------------------------------------------- tool calling

CLOCK = FunctionTool("get_time", "The time in a city.", {"type": "object", "properties": {"city": {"type": "string"}}})


def tool_turn(**fields: Any) -> UnderstandTurn:
    return UnderstandTurn(
        **{"request_id": "r", "frames": [], "audio_pcm16": b"", "query": "", "tools": (WEATHER,)} | fields
    )


async def outputs_of(engine: OmniUnderstandEngine, turn: UnderstandTurn) -> list[UnderstandOutput]:
    return [output async for output in engine.generate(turn)]


async def test_a_tool_call_in_the_thinkers_text_becomes_a_call_and_the_request_is_aborted_once() -> None:
    # The marker comes in three pieces, the closing tag in two; audio comes before and after it.
    script: list[str | list[int]] = [
        "Sure",
        ".",
        [4 * 1920],
        " <to",
        "ol_c",
        "all>",
        [1920],
        '\n{"name": "get_',
        'weather", "arguments": {"ci',
        [960],
        'ty": "Paris"}}\n</tool',
        "_call>",
        [960],
        " and then more",
    ]
    omni = FakeOmni([], [], script=script)
    outputs = await outputs_of(OmniUnderstandEngine(omni, FakeChat()), tool_turn(query="Weather in Paris?"))

    texts = [o.text for o in outputs if isinstance(o, TextDelta)]
    assert "".join(texts) == "Sure." and not any("<" in text for text in texts)
    audio = [o.samples for o in outputs if isinstance(o, AudioChunk)]
    assert sum(a.size for a in audio) == 3 * 1920  # the first group less its leading edge: none after the marker
    started = [o for o in outputs if isinstance(o, FunctionCallStarted)]
    assert [s.name for s in started] == ["get_weather"]
    arguments = "".join(o.delta for o in outputs if isinstance(o, FunctionArguments))
    assert json.loads(arguments) == {"city": "Paris"}
    assert all(o.call_id == started[0].call_id for o in outputs if isinstance(o, FunctionArguments))
    kinds = [type(o).__name__ for o in outputs]
    assert kinds[kinds.index("FunctionCallStarted") :] == ["FunctionCallStarted", "FunctionArguments", "Usage"]
    assert [what for what, _, _ in omni.calls] == ["generate", "abort"]
    # The thinker keeps special tokens in its text, as vLLM's hermes parser has it: a marker may be one.
    assert [p.values for p in omni.generate_kwargs[0]["sampling_params_list"]] == [{"skip_special_tokens": False}]


async def test_without_a_call_the_text_arrives_whole_with_the_marker_lookalikes() -> None:
    omni = FakeOmni([], [], script=["a <", "b> and ", "<tool", "s> end "])
    outputs = await outputs_of(OmniUnderstandEngine(omni, FakeChat()), tool_turn(query="q"))
    assert "".join(o.text for o in outputs if isinstance(o, TextDelta)) == "a <b> and <tools> end "
    assert [what for what, _, _ in omni.calls] == ["generate"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('{"name": "get_weather", "arguments": {"city": }', "not valid JSON"),
        ('{"name": "launch_rockets", "arguments": {}}', "'launch_rockets', which is not one of"),
        ('{"name": "get_weather", "arguments": "Paris"}', "not a JSON object"),
    ],
)
async def test_a_call_that_is_not_one_of_the_tools_fails_the_answer(body: str, message: str) -> None:
    omni = FakeOmni([], [], script=["Sure. ", f"<tool_call>{body}</tool_call>"])
    with pytest.raises(EngineError, match=message):
        await outputs_of(OmniUnderstandEngine(omni, FakeChat()), tool_turn(query="q"))


async def test_the_template_gets_the_tools_and_the_whole_tool_exchange() -> None:
    older = [{"role": "user", "content": f"old {i}"} for i in range(4)]
    chat = FakeChat()
    engine = OmniUnderstandEngine(FakeOmni(["It", "is", "22C."], []), chat)
    await outputs_of(engine, tool_turn(history=older + TOOL_HISTORY, tools=(WEATHER, CLOCK), system_prompt="Be brief."))

    request = chat.requests[0]
    assert request["tools"] == [
        {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
        for t in (WEATHER, CLOCK)
    ]
    # The question that led to the call stays with it, older plain history is cut as before, and
    # the tool's result is the input: no empty user turn after it.
    assert request["messages"] == [{"role": "system", "content": "Be brief."}, *TOOL_HISTORY]


async def test_a_call_is_never_cut_from_its_result_and_tool_choice_none_hides_the_tools() -> None:
    answered = [*TOOL_HISTORY, {"role": "assistant", "content": "It is 22C."}]
    chat = FakeChat()
    engine = OmniUnderstandEngine(FakeOmni(["Yes."], []), chat)
    await outputs_of(engine, tool_turn(history=answered, query="Thanks!", tool_choice="none"))

    request = chat.requests[0]
    assert "tools" not in request
    assert request["messages"] == [*answered[1:], {"role": "user", "content": [{"type": "text", "text": "Thanks!"}]}]


async def test_a_template_without_a_tool_section_gets_hermes_text() -> None:
    chat = FakeChat(renders_tools=False)
    engine = OmniUnderstandEngine(FakeOmni(["It", "is", "22C."], []), chat)
    await outputs_of(engine, tool_turn(history=TOOL_HISTORY, system_prompt="Be brief."))

    request = chat.requests[0]
    assert "tools" not in request
    system, user, assistant, results = request["messages"]
    assert system["role"] == "system" and system["content"].startswith("Be brief.\n\n# Tools")
    tools = system["content"].split("<tools>\n")[1].split("\n</tools>")[0]
    assert json.loads(tools) == {"type": "function", "function": vars(WEATHER)}
    assert user == TOOL_HISTORY[0]
    call = {"name": "get_weather", "arguments": {"city": "Paris"}}
    assert assistant == {"role": "assistant", "content": f"<tool_call>\n{json.dumps(call)}\n</tool_call>"}
    assert results == {"role": "user", "content": "<tool_response>\n22C\n</tool_response>"}


@pytest.mark.parametrize(
    ("choice", "output", "schema"),
    [
        (
            ForcedTool("get_weather"),
            ['{"city"\t', ': "Paris"}'],
            WEATHER.parameters,
        ),
        (
            "required",
            ['{"name": "get_weather", ', '"arguments": {"city": "Paris"}}'],
            {
                "anyOf": [
                    {
                        "type": "object",
                        "properties": {"name": {"const": t.name}, "arguments": t.parameters},
                        "required": ["name", "arguments"],
                        "additionalProperties": False,
                    }
                    for t in (WEATHER, CLOCK)
                ]
            },
        ),
    ],
)
async def test_a_forced_call_is_structured_output_of_the_thinker(choice: Any, output: list[str], schema: Any) -> None:
    omni = FakeOmni([], [[4 * 1920]], script=output)
    thinker = {"temperature": 0.7}
    turn = tool_turn(tools=(WEATHER, CLOCK), tool_choice=choice, sampling_params_list=[thinker, {"top_k": 5}])
    outputs = await outputs_of(OmniUnderstandEngine(omni, FakeChat()), turn)

    kwargs = omni.generate_kwargs[0]
    assert kwargs["output_modalities"] == ["text"]  # the talker does not voice a call
    sent_thinker, sent_talker = kwargs["sampling_params_list"]
    assert sent_thinker.values == {"temperature": 0.7, "structured_outputs": {"json": schema}}
    assert sent_talker.values == {"top_k": 5}
    assert [type(o).__name__ for o in outputs] == ["FunctionCallStarted", "FunctionArguments", "Usage"]
    assert outputs[0].name == "get_weather" and json.loads(outputs[1].delta) == {"city": "Paris"}
    assert [what for what, _, _ in omni.calls] == ["generate"]  # it ended by itself


async def test_a_forced_call_cut_off_by_max_tokens_fails_the_answer() -> None:
    omni = FakeOmni([], [], script=['{"city": "Par'])
    with pytest.raises(EngineError, match="'get_weather' were cut off"):
        await outputs_of(OmniUnderstandEngine(omni, FakeChat()), tool_turn(tool_choice=ForcedTool("get_weather")))
    params = omni.generate_kwargs[0]["sampling_params_list"]
    assert [p.values for p in params] == [{"structured_outputs": {"json": WEATHER.parameters}}]


async def test_over_the_realtime_api_the_client_gets_the_text_then_the_call_and_no_marker(
    make_server: ServerFactory,
) -> None:
    script: list[str | list[int]] = ["Sure", ".", [4 * 1920], " <tool", "_call>", [1920]]
    script += ['{"name": "get_weather", "arguments": {"city": "Paris"}}', "</tool_call>", [960], " more"]
    omni = FakeOmni([], [], script=script)
    server = await make_server(engine=OmniUnderstandEngine(omni, FakeChat()))
    async with connect(server) as rt:
        tool = {"type": "function", **vars(WEATHER)}
        await rt.send({"type": "session.update", "session": {"tools": [tool]}})
        await rt.until("session.updated")
        await add_user_text(rt, "Weather in Paris?")
        events = await rt.respond()

    transcript = text_of(events, "response.output_audio_transcript.delta")
    assert transcript == "Sure." and not any("<" in json.dumps(e) for e in events if "delta" in e["type"])
    speech = b"".join(base64.b64decode(e["delta"]) for e in events if e["type"] == "response.output_audio.delta")
    assert len(speech) // 2 == 3 * 1920  # 24 kHz PCM16: the first group less its leading edge, none after the marker
    call = next(e for e in events if e["type"] == "response.function_call_arguments.done")
    assert json.loads(call["arguments"]) == {"city": "Paris"}
    done = events[-1]["response"]
    assert done["status"] == "completed" and [item["type"] for item in done["output"]] == ["message", "function_call"]
    assert done["output"][1]["name"] == "get_weather"
    assert [what for what, _, _ in omni.calls] == ["generate", "abort"]
