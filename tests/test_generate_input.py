"""Generation protocol details: bad input gets vLLM-Omni's errors and the session stays usable;
request resolution and frame normalisation follow the reference exactly."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from rtc_omni.client.rtc_peers import GenerateClient
from rtc_omni.media.frames import normalize_videos, split_videos
from rtc_omni.protocol.generate_messages import VideoGenerationRequest, coerce_start_fields

from .conftest import ServerFactory


async def error_after(client: GenerateClient, message) -> dict:
    mark = len(client.events)
    client.send(message)
    return await client.wait_event("error", after=mark)


async def test_bad_start_messages_get_errors_and_a_good_one_still_works(make_server: ServerFactory) -> None:
    server = await make_server(
        model="wan-synthetic",
        synthetic_chunk_frames=10,
        synthetic_first_chunk_latency=0.05,
        synthetic_chunk_latency=0.05,
    )
    client = GenerateClient(server.url)
    await client.connect()
    try:
        cases = [
            ("{oops", "Invalid JSON in session.start"),
            ("[1]", "session.start must be a JSON object"),
            ({"type": "session.ping"}, "Expected session.start, got: session.ping"),
            ({"prompt": "x"}, "Expected session.start, got: None"),
            (
                {"type": "session.start", "prompt": "x", "format": "mp4"},
                "Invalid session.start format: expected 'm4s'.",
            ),
            (
                {"type": "session.start", "model": "other", "prompt": "x"},
                "Model mismatch: request specifies 'other' but server is running 'wan-synthetic'.",
            ),
        ]
        for message, expected in cases:
            assert (await error_after(client, message))["message"] == expected
        for bad in ({"size": "big"}, {"num_inference_steps": 0}, {"guidance_scale": 21}, {"seconds": "0"}, {}):
            message = await error_after(client, {"type": "session.start", **({"prompt": "x"} if bad else {}), **bad})
            assert message["message"].startswith("Invalid session.start: ")

        start = await client.start(
            prompt="ok", format="m4s", model="wan-synthetic", fps=30, num_frames=30, size="160x128"
        )
        assert start["config"]["model"] == "wan-synthetic"
        control_cases = [
            ("{oops", "Invalid JSON message"),
            ('"text"', "WebSocket messages must be JSON objects"),
            ({"type": "video.frame"}, "Unknown message type: video.frame"),
            (
                {"type": "session.prompt_update", "prompt": "y"},
                "session.prompt_update is not supported; send session.interaction instead",
            ),
            (
                {"type": "session.start", "prompt": "again"},
                "session.start was already received; one session generates one video",
            ),
            (json.dumps({"type": "session.ping", "pad": "x" * 140_000}), "control message too large"),
        ]
        for message, expected in control_cases:
            assert (await error_after(client, message))["message"] == expected
        bad_interaction = await error_after(
            client, {"type": "session.interaction", "interaction": {"event": {"prompt": "y", "negative_prompt": "z"}}}
        )
        assert bad_interaction["code"] == "invalid_interaction"

        done = await client.wait_event("session.done", timeout=20)
        assert done["frames"] == 30 and done["stopped"] is False
        late = await error_after(client, {"type": "session.interaction", "interaction": {"event": {"prompt": "y"}}})
        assert late["code"] == "interaction_failed"
    finally:
        await client.close()


async def test_start_timeout_ends_the_session(make_server: ServerFactory) -> None:
    server = await make_server(config_timeout=0.5)
    client = GenerateClient(server.url)
    await client.connect()
    try:
        error = await client.wait_event("error", timeout=5)
        assert error["message"] == "Timeout waiting for session.start"
    finally:
        await client.close()


async def test_a_generate_offer_without_video_is_refused(make_server: ServerFactory) -> None:
    from rtc_omni.client.rtc_peers import ControlClient, SignalingError

    server = await make_server()
    client = ControlClient(server.url)
    try:
        with pytest.raises(SignalingError) as refused:
            await client.connect(kind="generate")
        assert refused.value.status == 400 and "video m-line" in refused.value.body["error"]
    finally:
        await client.close()


def test_video_params_resolution_follows_the_reference() -> None:
    r = VideoGenerationRequest(prompt="p", seconds="3")
    assert r.resolve_video_params().model_dump() == {"width": None, "height": None, "num_frames": 72, "fps": 24}
    r = VideoGenerationRequest(
        prompt="p", width=100, video_params={"width": 50, "height": 60, "fps": 8, "num_frames": 9}
    )
    assert r.resolve_video_params().model_dump() == {"width": 100, "height": 60, "num_frames": 9, "fps": 8}
    r = VideoGenerationRequest(prompt="p", size="832x480", width=1, height=2, fps=16, seconds="2")
    assert r.resolve_video_params().model_dump() == {"width": 832, "height": 480, "num_frames": 32, "fps": 16}


def test_sampling_params_are_lifted_as_the_reference_does() -> None:
    data = coerce_start_fields(
        {
            "type": "session.start",
            "prompt": "p",
            "seed": 1,
            "format": "m4s",
            "extra_params": {"a": 1, "b": 1},
            "sampling_params": {"seed": 2, "guidance_scale": 3.0, "b": 2, "c": 3},
        }
    )
    assert data == {
        "prompt": "p",
        "seed": 1,
        "guidance_scale": 3.0,
        "extra_params": {"a": 1, "b": 2, "seed": 2, "c": 3},
    }


def test_frames_normalise_from_every_form_the_reference_accepts() -> None:
    rgb = np.random.default_rng(0).integers(0, 256, (4, 6, 8, 3), dtype=np.uint8)
    unit = rgb.astype(np.float32) / 255.0
    signed = unit * 2 - 1
    forms = {
        "uint8 video": rgb,
        "float [0,1]": unit,
        "float [-1,1]": signed,
        "batch of one (5-D)": rgb[None],
        "list of frames": list(rgb),
        "list of PIL images (one video each)": None,
        "channels first (C, F, H, W)": np.transpose(rgb, (3, 0, 1, 2)),
        "list of 5-D batches": [rgb[None], rgb[None]],
    }
    for name, form in forms.items():
        if form is None:
            videos = normalize_videos([Image.fromarray(f) for f in rgb])
            assert len(videos) == 4 and all(v.shape == (1, 6, 8, 3) for v in videos), name
            continue
        videos = normalize_videos(form)
        assert all(v.dtype == np.uint8 and v.shape == (4, 6, 8, 3) for v in videos), name
        assert np.abs(videos[0].astype(int) - rgb).max() <= 1, name
    assert len(normalize_videos([rgb[None], rgb[None]])) == 2
    assert split_videos(None) == [] and split_videos([]) == []
    rgba = np.concatenate([rgb, np.full((4, 6, 8, 1), 255, np.uint8)], axis=-1)
    assert normalize_videos(rgba)[0].shape == (4, 6, 8, 3)
