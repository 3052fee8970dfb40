"""End to end over real aiortc peers on 127.0.0.1: camera and mic in, text and talker audio out."""

from __future__ import annotations

import asyncio
import re
import time

import av
import pytest

from rtc_omni.client.media import COLOURS
from rtc_omni.sessions.frame_buffer import sample_indices

from .conftest import ClientFactory, RunningServer, ServerFactory, http_json


def _accepted(event: dict) -> bool:
    return event.get("type") == "video.frame.ack" and event["accepted"]


async def test_answer_names_the_camera_colour_and_the_tone(
    make_server: ServerFactory, make_client: ClientFactory
) -> None:
    server = await make_server(spoken_sentences=1)
    client = await make_client(server, colour="red", tone=440.0, config={})
    await client.wait_event(where=_accepted)
    await asyncio.sleep(1.0)  # let the microphone fill the audio buffer

    result = await client.ask("What colour is the camera showing?")

    assert not result.cancelled and not result.errors
    assert "mostly red" in result.text
    hz = float(re.search(r"dominant frequency about (\d+) Hz", result.text).group(1))
    assert 430 <= hz <= 450
    deltas = "".join(e["delta"] for e in result.events if e["type"] == "response.text.delta")
    text_done = next(e for e in result.events if e["type"] == "response.text.done")
    assert deltas == text_done["text"] == result.text
    assert result.events[-1]["type"] == "response.audio.done"

    recorder = client.recorder
    assert recorder is not None
    assert recorder.voiced_frames(result.sent_at, result.done_at) > 25  # > 0.5 s of speech heard
    quiet_from = time.monotonic() + 0.3  # what was in flight at audio.done has played by then
    await asyncio.sleep(1.0)
    assert recorder.voiced_frames(quiet_from) == 0
    # An idle talker sends nothing (its answer ended with a few silent packets, long gone).
    path = f"/v1/rtc/sessions/{client.session_id}"
    sent = (await http_json(server, "GET", path, headers=client.session_headers))[1]["talker_packets_sent"]
    await asyncio.sleep(1.0)
    assert (await http_json(server, "GET", path, headers=client.session_headers))[1]["talker_packets_sent"] == sent


async def test_answer_follows_the_camera_when_it_changes(server: RunningServer, make_client: ClientFactory) -> None:
    client = await make_client(server, colour="blue", tone=None, config={"modalities": ["text"]})
    await client.wait_event(where=_accepted)
    first = await client.ask("colour?")
    assert "mostly blue" in first.text

    mark = len(client.events)
    client.video.set_colour(COLOURS["green"])
    await client.wait_event(where=_accepted, after=mark)
    second = await client.ask("and now?")
    assert "mostly green" in second.text


async def test_interrupt_cancels_the_turn_and_silences_the_talker(
    make_server: ServerFactory, make_client: ClientFactory
) -> None:
    # Speech made in real time (two sentences, ~2.6 s), as a streaming talker does: the engine request
    # is still running when the talker is first heard, so the interrupt must abort it.
    server = await make_server(synthetic_ttft=1.0, synthetic_audio_speed=1.0, spoken_sentences=2)
    client = await make_client(server, colour="red", tone=None, config={})
    await client.wait_event(where=_accepted)
    recorder = client.recorder

    mark = len(client.events)
    client.send({"type": "video.query", "text": "talk to me"})
    start = await client.wait_event("response.start", after=mark)
    first_id = start["request_id"]
    async with asyncio.timeout(10):
        while recorder.voiced_frames(since=time.monotonic() - 0.1) == 0:
            await asyncio.sleep(0.02)

    mark = len(client.events)
    interrupted_at = time.monotonic()
    second = asyncio.ensure_future(client.ask("stop, another question", timeout=30))
    cancelled = await client.wait_event("response.cancelled", after=mark)
    assert cancelled["request_id"] == first_id
    # Nothing more of the interrupted turn arrives after its cancellation.
    await asyncio.sleep(0.8)
    later = client.events[client.events.index(cancelled) + 1 :]
    assert all(e.get("request_id") != first_id for e in later)
    # The talker went quiet: the new turn speaks only after its 1 s time to first token.
    assert recorder.voiced_frames(interrupted_at + 0.3, interrupted_at + 0.8) == 0

    result = await second
    assert result.request_id != first_id and not result.cancelled
    assert "mostly red" in result.text
    assert result.events[-1]["type"] == "response.audio.done"
    assert first_id in server.engine.recent_aborts
    assert result.request_id not in server.engine.recent_aborts  # a finished request is never aborted

    third = await client.ask("once more")
    assert not third.cancelled
    assert result.request_id not in server.engine.recent_aborts


async def test_static_camera_is_filtered_and_moving_camera_accepted(
    server: RunningServer, make_client: ClientFactory
) -> None:
    still = await make_client(server, colour="yellow", tone=None, config={"sample_fps": 5})
    moving = await make_client(server, colour="yellow", tone=None, moving=True, config={"sample_fps": 5})
    for _ in range(4):
        await still.wait_event(where=lambda e: e.get("reason") == "filtered", after=len(still.events) - 1)
    await asyncio.sleep(1.0)

    still_acks = [e for e in still.events if e["type"] == "video.frame.ack"]
    moving_acks = [e for e in moving.events if e["type"] == "video.frame.ack"]
    assert still_acks[0]["accepted"] and all(not e["accepted"] for e in still_acks[1:])
    assert all(e["reason"] == "filtered" for e in still_acks[1:])
    assert len(moving_acks) >= 4 and all(e["accepted"] for e in moving_acks)
    assert [e["buffered_frames"] for e in moving_acks[:4]] == [1, 2, 3, 4]
    # Frames are sampled at the requested rate, in order of media time: each sample is the first
    # frame at or after its due time, so a gap is 200 ms give or take one 33 ms camera frame.
    pts = [e["pts_ms"] for e in moving_acks]
    assert pts == sorted(pts) and all(166 <= b - a <= 234 for a, b in zip(pts, pts[1:]))
    assert abs((pts[-1] - pts[0]) / (len(pts) - 1) - 200) < 34


async def test_frames_consumed_lists_the_sampled_frames(server: RunningServer, make_client: ClientFactory) -> None:
    client = await make_client(
        server,
        colour="cyan",
        tone=None,
        moving=True,
        config={"sample_fps": 10, "num_frames": 4, "modalities": ["text"]},
    )
    for _ in range(9):
        await client.wait_event(where=_accepted, after=len(client.events))
    client.video.stop()  # freeze the buffer so the sample is deterministic
    path = f"/v1/rtc/sessions/{client.session_id}"
    previous, current = -1, 0
    while previous != current:  # until the frames in flight have arrived
        await asyncio.sleep(0.3)
        previous, current = (
            current,
            (await http_json(server, "GET", path, headers=client.session_headers))[1]["frames_received"],
        )
    accepted = [e["frame_id"] for e in client.events if _accepted(e)]

    result = await client.ask("what happened?")

    consumed = next(e for e in result.events if e["type"] == "video.frames.consumed")
    expected = [accepted[i] for i in sample_indices(len(accepted), 4)]
    assert consumed["frame_ids"] == expected
    assert consumed["request_id"] == result.request_id
    assert [f["frame_id"] for f in consumed["frames"]] == expected
    assert consumed["latest_pts_ms"] == consumed["frames"][-1]["pts_ms"]
    assert "I see 4 frames of 320x240" in result.text


async def test_still_scene_query_sees_the_newest_frame(
    server: RunningServer, make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The newest frame stands in for the buffer's, though EVS filtered it; filtered frames cost no
    JPEG until then."""
    from rtc_omni.sessions import camera

    encoded: list[int] = []
    encode = camera.frame_to_jpeg
    monkeypatch.setattr(camera, "frame_to_jpeg", lambda frame, quality: encoded.append(1) or encode(frame, quality))
    client = await make_client(server, colour="magenta", tone=None, config={"modalities": ["text"]})
    await client.wait_event(where=lambda e: e.get("reason") == "filtered")
    await client.wait_event(where=lambda e: e.get("reason") == "filtered", after=len(client.events))
    newest_filtered = [e for e in client.events if e.get("reason") == "filtered"][-1]
    assert len(encoded) == len([e for e in client.events if _accepted(e)]) == 1

    result = await client.ask("still there?")

    consumed = next(e for e in result.events if e["type"] == "video.frames.consumed")
    assert consumed["frame_ids"][-1] != "rtp-1"
    assert int(consumed["frame_ids"][-1].split("-")[1]) >= int(newest_filtered["frame_id"].split("-")[1])
    assert "The newest frame is mostly magenta" in result.text
    assert len(encoded) == 2


async def test_a_newest_frame_that_fails_to_encode_leaves_the_turn_the_buffered_one(
    server: RunningServer, make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rtc_omni.sessions import camera

    encode = camera.frame_to_jpeg
    calls: list[int] = []

    def first_only(frame: av.VideoFrame, quality: int) -> bytes:  # the kept first frame encodes; the newest not
        calls.append(1)
        if len(calls) > 1:
            raise ValueError("broken planes")
        return encode(frame, quality)

    monkeypatch.setattr(camera, "frame_to_jpeg", first_only)
    client = await make_client(server, colour="magenta", tone=None, config={"modalities": ["text"]})
    await client.wait_event(where=lambda e: e.get("reason") == "filtered")

    result = await client.ask("still there?")

    assert not result.errors and "The newest frame is mostly magenta" in result.text
    consumed = next(e for e in result.events if e["type"] == "video.frames.consumed")
    assert consumed["frame_ids"] == ["rtp-1"]
    assert len(calls) == 2


@pytest.mark.parametrize("kind", ["talk", "nonsense"])
async def test_unknown_session_kind_is_refused(server: RunningServer, make_client: ClientFactory, kind: str) -> None:
    from rtc_omni.client.rtc_peers import SignalingError, UnderstandClient

    client = UnderstandClient(server.url)
    try:
        with pytest.raises(SignalingError) as refused:
            await client.connect(kind=kind)
        assert refused.value.status == 400 and "unknown session kind" in refused.value.body["error"]
    finally:
        await client.close()
    assert len(server.registry) == 0


async def test_response_cancel_stops_the_answer_without_a_new_turn(
    make_server: ServerFactory, make_client: ClientFactory
) -> None:
    server = await make_server(synthetic_audio_speed=4.0)
    client = await make_client(server, colour="red", tone=None, config={})
    await client.wait_event(where=_accepted)
    mark = len(client.events)
    client.send({"type": "response.cancel"})
    assert (await client.wait_event("error", after=mark))["message"] == "No active response to cancel"

    mark = len(client.events)
    client.send({"type": "video.query", "text": "talk"})
    start = await client.wait_event("response.start", after=mark)
    async with asyncio.timeout(10):
        while client.recorder.voiced_frames(since=time.monotonic() - 0.1) == 0:
            await asyncio.sleep(0.02)
    cancelled_at = time.monotonic()
    client.send({"type": "response.cancel"})
    cancelled = await client.wait_event("response.cancelled", after=mark)
    await asyncio.sleep(1.0)
    assert cancelled["request_id"] == start["request_id"]
    assert start["request_id"] in server.engine.recent_aborts
    assert client.recorder.voiced_frames(cancelled_at + 0.3) == 0
    assert [e["type"] for e in client.events[mark:]].count("response.start") == 1
