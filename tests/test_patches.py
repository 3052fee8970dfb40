"""Tripwires for rtc_omni.patches: each fails loudly when aiortc or aioice change what a patch relies on.

A failure here after an upgrade means: read the patch's module docstring, check whether the
library now does the job itself (then delete the patch), or adapt the patch to the new internals.
"""

from __future__ import annotations

import asyncio
import inspect
import queue

import aioice.ice
import aiortc.rtcrtpreceiver
import pytest
from aiortc import (
    RTCDataChannel,
    RTCDataChannelParameters,
    RTCPeerConnection,
    RTCRtpReceiver,
    RTCRtpSender,
    RTCSessionDescription,
)
from aiortc.jitterbuffer import JitterBuffer
from aiortc.rtcicetransport import RTCIceTransport
from aiortc.rtcsctptransport import DATA_CHANNEL_ACK, WEBRTC_DCEP, WEBRTC_STRING, DataChunk, RTCSctpTransport
from aiortc.rtp import RtpPacket

from rtc_omni import patches
from rtc_omni.patches import datachannel_receive, decoding, ice_candidates, jitter, sctp
from rtc_omni.patches.codecs import negotiated_codecs
from rtc_omni.signaling.ice import rtc_configuration


def parameters(function: object) -> list[str]:
    return list(inspect.signature(function).parameters)  # type: ignore[arg-type]


def test_every_patch_is_installed_once_and_on_the_names_it_replaces() -> None:
    patches.apply()
    patches.apply()
    assert aioice.ice.get_host_addresses is ice_candidates.host_addresses
    assert isinstance(aioice.ice.asyncio, ice_candidates.AsyncioForAioice)
    assert aioice.ice.Connection.close is ice_candidates.close_unless_media_arrives
    assert RTCSctpTransport._receive_data_chunk is sctp.receive_data_chunk_bounded  # type: ignore[comparison-overlap]
    assert RTCSctpTransport._data_channel_receive is datachannel_receive.data_channel_receive_checked  # type: ignore[comparison-overlap]
    assert aiortc.rtcrtpreceiver.decoder_worker is decoding.decoder_worker
    # What each wraps is still the library's own, with the signature the patch calls.
    assert parameters(ice_candidates.AIOICE_HOST_ADDRESSES) == ["use_ipv4", "use_ipv6"]
    assert parameters(ice_candidates.AIOICE_CLOSE) == ["self"]
    assert parameters(sctp.AIORTC_RECEIVE_DATA_CHUNK) == ["self", "chunk"]
    assert parameters(datachannel_receive.AIORTC_DATA_CHANNEL_RECEIVE) == ["self", "stream_id", "pp_id", "data"]
    assert parameters(decoding.AIORTC_DECODER_WORKER) == ["loop", "input_q", "output_q", "decode_error"]


@pytest.mark.parametrize("ports", [None, range(42600, 42610)])
async def test_aioice_gathers_host_candidates_only_where_the_policy_says(ports: range | None) -> None:
    patches.apply(patches.LOOPBACK, ports)
    connection = aioice.ice.Connection(ice_controlling=True, components=1)
    try:
        await connection.gather_candidates()
        assert [c.host for c in connection.local_candidates] == ["127.0.0.1"]
        if ports is not None:
            assert all(c.port in ports for c in connection.local_candidates)
    finally:
        await connection.close()
        patches.apply()


def test_aioice_consent_loop_still_ends_in_close_and_keeps_its_task() -> None:
    """The consent patch recognises aioice's own consent loop by its code object, restarts it by
    `query_consent()` and stores the task where aioice's close() cancels it."""
    source = inspect.getsource(aioice.ice.Connection.query_consent)
    assert "self._query_consent_task = None" in source and "return await self.close()" in source
    assert "self._query_consent_task" in inspect.getsource(ice_candidates.AIOICE_CLOSE)
    assert aioice.ice.Connection.query_consent.__code__ is ice_candidates._CONSENT_LOOP


async def test_aiortc_ice_transport_exposes_its_aioice_connection() -> None:
    pc = RTCPeerConnection(rtc_configuration([]))
    try:
        pc.addTransceiver("audio")
        transport = pc.getTransceivers()[0].receiver.transport.transport
        assert isinstance(transport, RTCIceTransport)
        assert isinstance(transport._connection, aioice.ice.Connection)
    finally:
        await pc.close()


async def test_aiortc_receiver_takes_the_marker_jitter_buffer() -> None:
    pc = RTCPeerConnection(rtc_configuration([]))
    try:
        pc.addTransceiver("video")
        receiver = pc.getTransceivers()[0].receiver
        assert isinstance(receiver._RTCRtpReceiver__jitter_buffer, JitterBuffer)  # type: ignore[attr-defined]
        assert "self.__jitter_buffer.add(" in inspect.getsource(RTCRtpReceiver._handle_rtp_packet)
        jitter.release_frames_when_complete(pc)
        assert isinstance(receiver._RTCRtpReceiver__jitter_buffer, jitter.MarkerJitterBuffer)  # type: ignore[attr-defined]
    finally:
        await pc.close()
    buffer = JitterBuffer(capacity=16, is_video=True)
    assert parameters(buffer._remove_frame) == ["sequence_number"]
    assert {"_origin", "_packets"} <= vars(buffer).keys() and parameters(buffer.remove) == ["count"]
    # The receiver stores each packet's depayloaded bytes as `_data`, which aiortc's frames join.
    assert "packet._data = depayload(" in inspect.getsource(RTCRtpReceiver._handle_rtp_packet)
    assert "x._data for x in packets" in inspect.getsource(JitterBuffer._remove_frame)


async def test_aiortc_audio_receiver_takes_the_arrival_buffer() -> None:
    pc = RTCPeerConnection(rtc_configuration([]))
    try:
        pc.addTransceiver("audio")
        receiver = pc.getTransceivers()[0].receiver
        assert receiver._RTCRtpReceiver__jitter_buffer._prefetch == 4  # type: ignore[attr-defined]
        jitter.release_audio_on_arrival(pc)
        assert isinstance(receiver._RTCRtpReceiver__jitter_buffer, jitter.ArrivalAudioBuffer)  # type: ignore[attr-defined]
    finally:
        await pc.close()
    # `add` is all the receiver asks of its buffer.
    source = inspect.getsource(RTCRtpReceiver)
    assert source.count("self.__jitter_buffer.") == 1 and "self.__jitter_buffer.add(packet)" in source


def test_audio_packets_leave_as_they_arrive_and_a_loss_holds_nothing_back() -> None:
    buffer = jitter.ArrivalAudioBuffer()

    def add(seq: int) -> int | None:
        packet = RtpPacket(sequence_number=seq % 65536, timestamp=seq * 2880)
        packet._data = seq.to_bytes(4, "big")  # type: ignore[attr-defined]
        frame = buffer.add(packet)[1]
        return None if frame is None else int.from_bytes(frame.data, "big")

    assert [add(seq) for seq in [65533, 65534, 65535, 65536, 65537]] == [65533, 65534, 65535, 65536, 65537]
    # 65538 lost: the next packet leaves at once, and so does every later one (aiortc's own buffer
    # stalls until 16 have arrived, then stays 14 packets behind)
    assert [add(seq) for seq in range(65539, 65545)] == list(range(65539, 65545))
    assert add(65538) is None  # reordered behind packets already released: dropped
    assert add(65544) is None  # a duplicate
    assert add(70000) == 70000  # a jump ahead (a lost burst, or a new sequence) continues from there
    assert add(70000 - 500) == 70000 - 500  # far behind: a restarted stream, followed as aiortc does


async def test_aiortc_receiver_decodes_through_the_queue_the_mic_decoder_replaces() -> None:
    """The receiver starts `decoder_worker` by its module name with its decoder queue and its track's
    queue, and puts (codec, frame) on that decoder queue for every complete frame."""
    assert "target=decoder_worker" in inspect.getsource(RTCRtpReceiver.receive)
    assert "self.__decoder_queue,\n" in inspect.getsource(RTCRtpReceiver.receive)
    assert "self._track._queue," in inspect.getsource(RTCRtpReceiver.receive)
    assert "self.__decoder_queue.put((codec, encoded_frame))" in inspect.getsource(RTCRtpReceiver._handle_rtp_packet)
    assert "self.__decoder_queue.put(None)" in inspect.getsource(RTCRtpReceiver._RTCRtpReceiver__stop_decoder)  # type: ignore[attr-defined]
    offerer, answerer = RTCPeerConnection(rtc_configuration([])), RTCPeerConnection(rtc_configuration([]))
    try:
        offerer.addTransceiver("audio", direction="sendonly")
        await offerer.setLocalDescription(await offerer.createOffer())
        await answerer.setRemoteDescription(offerer.localDescription)
        receiver = answerer.getTransceivers()[0].receiver
        assert isinstance(receiver._RTCRtpReceiver__decoder_queue, queue.Queue)  # type: ignore[attr-defined]
        assert isinstance(receiver.track._queue, asyncio.Queue)
        decoding.decode_audio_on_the_loop(answerer)
        assert isinstance(receiver._RTCRtpReceiver__decoder_queue, decoding.MicDecoder)  # type: ignore[attr-defined]
    finally:
        await offerer.close()
        await answerer.close()


async def test_aiortc_transceiver_codecs_are_the_negotiated_ones_in_order() -> None:
    offerer, answerer = RTCPeerConnection(rtc_configuration([])), RTCPeerConnection(rtc_configuration([]))
    try:
        transceiver = offerer.addTransceiver("video", direction="recvonly")
        capabilities = RTCRtpSender.getCapabilities("video")
        assert capabilities is not None
        transceiver.setCodecPreferences([c for c in capabilities.codecs if c.mimeType == "video/H264"])
        await offerer.setLocalDescription(await offerer.createOffer())
        await answerer.setRemoteDescription(RTCSessionDescription(offerer.localDescription.sdp, "offer"))
        codecs = negotiated_codecs(answerer.getTransceivers()[0])
        assert codecs and {c.mimeType for c in codecs} == {"video/H264"}
    finally:
        await offerer.close()
        await answerer.close()


class NoDtls:
    """Just enough of an RTCDtlsTransport to build an RTCSctpTransport that never sends."""

    state = "new"

    def _register_data_receiver(self, receiver: object) -> None:
        pass


async def test_aiortc_sctp_receiver_state_the_bound_reads() -> None:
    transport = RTCSctpTransport(NoDtls())  # type: ignore[arg-type]
    assert transport._last_received_tsn is None
    assert transport._sack_misordered == set() and transport._advertised_rwnd == 1024 * 1024
    assert "self._mark_received(chunk.tsn)" in inspect.getsource(sctp.AIORTC_RECEIVE_DATA_CHUNK)
    assert hasattr(DataChunk(), "user_data") and hasattr(DataChunk(), "tsn")


OPEN_LABEL_C = b"\x03\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00c"  # DATA_CHANNEL_OPEN, label "c"


def channel_on(transport: RTCSctpTransport, stream_id: int) -> RTCDataChannel:
    """A DataChannel registered on `transport` as an opened remote channel is."""
    channel = RTCDataChannel(transport, RTCDataChannelParameters(label="c", id=stream_id), False)
    transport._data_channels[stream_id] = channel
    return channel


async def test_aiortc_still_raises_on_a_text_message_that_is_not_utf8() -> None:
    """When this fails, aiortc copes itself: delete patches/datachannel_receive.py."""
    transport = RTCSctpTransport(NoDtls())  # type: ignore[arg-type]
    channel_on(transport, 1)
    with pytest.raises(UnicodeDecodeError):
        await datachannel_receive.AIORTC_DATA_CHANNEL_RECEIVE(transport, 1, WEBRTC_STRING, b"\xff{}")
    assert 'data.decode("utf8")' in inspect.getsource(datachannel_receive.AIORTC_DATA_CHANNEL_RECEIVE)


async def test_a_text_message_that_is_not_utf8_becomes_one_event_and_the_rest_go_on() -> None:
    patches.apply()
    transport = RTCSctpTransport(NoDtls())  # type: ignore[arg-type]
    channel = channel_on(transport, 1)
    got: list[object] = []
    channel.on("message", got.append)
    channel.on(datachannel_receive.NOT_UTF8, lambda size: got.append(("not utf-8", size)))
    for data in (b"{}", b"\xff{}", b"\xc3\xa9"):
        await transport._data_channel_receive(1, WEBRTC_STRING, data)
    assert got == ["{}", ("not utf-8", 3), "\u00e9"]
    # A channel open whose label is not UTF-8 is dropped: no channel, no exception.
    opening = b"\x03\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\x00\xff\xfe"  # DATA_CHANNEL_OPEN, label \xff\xfe
    await transport._data_channel_receive(3, WEBRTC_DCEP, opening)
    assert 3 not in transport._data_channels


async def test_aiortc_still_asserts_on_a_second_open_and_an_unknown_ack() -> None:
    """When this fails, aiortc copes itself: drop `_contradicts` from patches/datachannel_receive.py."""
    transport = RTCSctpTransport(NoDtls())  # type: ignore[arg-type]
    channel_on(transport, 1)
    with pytest.raises(AssertionError):
        await datachannel_receive.AIORTC_DATA_CHANNEL_RECEIVE(transport, 1, WEBRTC_DCEP, OPEN_LABEL_C)
    with pytest.raises(AssertionError):
        await datachannel_receive.AIORTC_DATA_CHANNEL_RECEIVE(transport, 5, WEBRTC_DCEP, bytes([DATA_CHANNEL_ACK]))


async def test_a_second_open_and_an_unknown_ack_are_dropped_and_the_channel_goes_on() -> None:
    patches.apply()
    transport = RTCSctpTransport(NoDtls())  # type: ignore[arg-type]
    channel = channel_on(transport, 1)
    got: list[object] = []
    channel.on("message", got.append)
    await transport._data_channel_receive(1, WEBRTC_DCEP, OPEN_LABEL_C)  # the stream is open already
    await transport._data_channel_receive(5, WEBRTC_DCEP, bytes([DATA_CHANNEL_ACK]))  # no stream 5
    await transport._data_channel_receive(1, WEBRTC_STRING, b"{}")
    assert transport._data_channels == {1: channel} and got == ["{}"]


def test_aiortc_sender_answers_keyframe_requests_through_send_keyframe() -> None:
    """patches/keyframes.py replaces this method; tests/test_fanout.py drives a real PLI through it."""
    assert callable(getattr(RTCRtpSender, "_send_keyframe", None))
    source = inspect.getsource(RTCRtpSender._handle_rtcp_packet)
    assert "self._send_keyframe()" in source


def test_marker_jitter_buffer_releases_a_complete_frame_at_once() -> None:
    from aiortc.rtp import RtpPacket

    from rtc_omni.patches.jitter import MarkerJitterBuffer

    def packet(seq: int, ts: int, marker: bool, data: bytes) -> RtpPacket:
        p = RtpPacket(sequence_number=seq, timestamp=ts, marker=marker)
        p._data = data  # type: ignore[attr-defined]
        return p

    buffer = MarkerJitterBuffer()
    assert buffer.add(packet(10, 3000, False, b"a"))[1] is None  # frame not complete yet
    frame = buffer.add(packet(11, 3000, True, b"b"))[1]
    assert frame is not None and frame.data == b"ab" and frame.timestamp == 3000
    # no marker bit: aiortc's rule, released when the next frame begins
    assert buffer.add(packet(12, 6000, False, b"c"))[1] is None
    frame = buffer.add(packet(13, 9000, False, b"d"))[1]
    assert frame is not None and frame.data == b"c"


async def test_aiortc_receiver_sends_remb_through_send_rtcp_and_the_cap_lowers_it() -> None:
    """aiortc's video receiver sends its REMB through `_send_rtcp`, where patches.remb lowers it."""
    from aiortc.rtp import RTCP_PSFB_APP, RtcpPacket, RtcpPsfbPacket, pack_remb_fci, unpack_remb_fci

    from rtc_omni.patches.remb import cap_remb

    source = inspect.getsource(RTCRtpReceiver._handle_rtp_packet)
    assert "pack_remb_fci" in source and "await self._send_rtcp(rtcp_packet)" in source

    sent: list[bytes] = []

    class Transport:
        state = "connected"

        async def _send_rtp(self, data: bytes) -> None:
            sent.append(data)

    receiver = RTCRtpReceiver("video", Transport())  # type: ignore[arg-type]
    cap_remb(receiver, 300_000)
    for bitrate in (1_500_000, 200_000):
        remb = pack_remb_fci(bitrate, [1234])
        await receiver._send_rtcp(RtcpPsfbPacket(fmt=RTCP_PSFB_APP, ssrc=1, media_ssrc=0, fci=remb))
    sent_rates = [unpack_remb_fci(RtcpPacket.parse(data)[0].fci) for data in sent]  # type: ignore[union-attr]
    assert sent_rates == [(300_000, [1234]), (200_000, [1234])]
