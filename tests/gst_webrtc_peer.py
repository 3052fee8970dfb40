"""A GStreamer webrtcbin peer for the interop tests (tests/test_gstreamer.py), run by /usr/bin/python3.

Debian's GStreamer (1.22) has no whipsink or whepsrc, so this script does WHIP, WHEP and the JSON
offer by hand around webrtcbin, as a GStreamer application would. webrtcbin always offers
`a=setup:actpass` with an RSA certificate, which is what the tests are about.

    gst_webrtc_peer.py whip URL          publish test video (VP8) and a 440 Hz tone (Opus)
    gst_webrtc_peer.py whep URL          play the session's video, counting decoded frames
    gst_webrtc_peer.py offer URL         POST a JSON offer: the same media sendrecv, a `control` DataChannel,
                                         and one question once the session has seen and heard a second

It prints one JSON object per line: {"event": "connected"} once ICE and DTLS are up, the
DataChannel's messages as {"event": "message", "data": ...}, and a final {"event": "result", ...}
when stdin closes (or after 60 s). Gathering uses 127.0.0.1 only, with UPnP off: run it inside a
loopback-only network namespace.
"""

from __future__ import annotations

import json
import sys
import threading
import urllib.request
from typing import Any

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstSdp", "1.0")
gi.require_version("GstWebRTC", "1.0")
gi.require_version("Nice", "0.1")
from gi.repository import GLib, Gst, GstSdp, GstWebRTC, Nice  # noqa: E402

LIFETIME_S = 60
PUBLISH = (
    "webrtcbin name=webrtc bundle-policy=max-bundle "
    "videotestsrc is-live=true pattern=red ! video/x-raw,width=320,height=240,framerate=15/1 ! videoconvert "
    "! vp8enc deadline=1 ! rtpvp8pay ! application/x-rtp,media=video,encoding-name=VP8,payload=96 ! webrtc. "
    "audiotestsrc is-live=true wave=sine freq=440 ! audioconvert ! audioresample ! opusenc ! rtpopuspay "
    "! application/x-rtp,media=audio,encoding-name=OPUS,payload=111 ! webrtc."
)
VIDEO_CAPS = "application/x-rtp,media=video,encoding-name=VP8,payload=96,clock-rate=90000"


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def http(method: str, url: str, body: bytes | None, content_type: str | None) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, data=body, method=method)
    if content_type:
        request.add_header("Content-Type", content_type)
    with urllib.request.urlopen(request, timeout=15) as response:
        return response.status, dict(response.headers), response.read()


class Peer:
    def __init__(self, mode: str, url: str) -> None:
        self.mode, self.url = mode, url
        if mode in ("whip", "offer"):
            self.pipe = Gst.parse_launch(PUBLISH)
        else:  # a pipeline of webrtcbin alone; its received media is linked on pad-added
            self.pipe = Gst.Pipeline.new("player")
            webrtc = Gst.ElementFactory.make("webrtcbin", "webrtc")
            webrtc.set_property("bundle-policy", GstWebRTC.WebRTCBundlePolicy.MAX_BUNDLE)
            self.pipe.add(webrtc)
        self.webrtc = self.pipe.get_by_name("webrtc")
        # PyGObject drops a reference it does not own when reading this property: hold one more.
        self.ice = self.webrtc.get_property("ice-agent")
        self.ice.ref()
        self.agent = self.ice.get_property("agent")
        self.agent.set_property("upnp", False)  # no SSDP multicast
        address = Nice.Address()
        address.set_from_string("127.0.0.1")
        self.agent.add_local_address(address)  # libnice skips loopback otherwise
        self.webrtc.connect("notify::connection-state", self._on_connection_state)
        self.webrtc.connect("pad-added", self._on_pad_added)
        self.frames = 0
        self.messages: list[str] = []
        self.location: str | None = None
        self.channel: Any = None
        self.error: str | None = None
        self.state = "new"
        if mode == "whep":
            self.webrtc.emit(
                "add-transceiver", GstWebRTC.WebRTCRTPTransceiverDirection.RECVONLY, Gst.Caps.from_string(VIDEO_CAPS)
            )

    def start(self) -> None:
        if self.mode == "whip":
            for index in range(2):
                transceiver = self.webrtc.emit("get-transceiver", index)
                transceiver.set_property("direction", GstWebRTC.WebRTCRTPTransceiverDirection.SENDONLY)
        self.pipe.set_state(Gst.State.PLAYING)
        if self.mode == "offer":
            self.channel = self.webrtc.emit("create-data-channel", "control", None)
            self.channel.connect("on-open", self._on_channel_open)
            self.channel.connect("on-message-string", lambda _channel, text: self._on_message(text))

    # ------------------------------------------------------------------ signalling

    def offer(self) -> None:
        """One offer once everything is added (webrtcbin's negotiation-needed misses the DataChannel)."""
        promise = Gst.Promise.new_with_change_func(self._on_offer_created, None)
        self.webrtc.emit("create-offer", None, promise)

    def _on_offer_created(self, promise: Gst.Promise, _data: Any) -> None:
        promise.wait()
        reply = promise.get_reply()
        offer = reply.get_value("offer")
        if offer is None:
            print("DEBUG", reply.to_string(), file=sys.stderr)
            return
        self.webrtc.emit("set-local-description", offer, Gst.Promise.new())
        self.webrtc.connect("notify::ice-gathering-state", self._on_gathering_state)

    def _on_gathering_state(self, _element: Any, _spec: Any) -> None:
        if self.webrtc.get_property("ice-gathering-state") != GstWebRTC.WebRTCICEGatheringState.COMPLETE:
            return
        sdp = self.webrtc.get_property("local-description").sdp.as_text()
        threading.Thread(target=self._post_offer, args=(sdp,), daemon=True).start()

    def _post_offer(self, sdp: str) -> None:
        try:
            if self.mode == "offer":
                body = json.dumps({"sdp": sdp, "type": "offer", "kind": "understand"}).encode()
                _, _, reply = http("POST", self.url, body, "application/json")
                answer_sdp = json.loads(reply)["sdp"]
            else:
                status, headers, reply = http("POST", self.url, sdp.encode(), "application/sdp")
                assert status == 201, status
                self.location = headers.get("Location")
                emit("created", session_token=headers.get("Session-Token"))  # what opens the session
                answer_sdp = reply.decode()
        except Exception as exc:  # reported to the test, which shows it
            self.error = f"offer refused: {exc}"
            emit("error", message=self.error)
            return
        _, message = GstSdp.SDPMessage.new_from_text(answer_sdp)
        answer = GstWebRTC.WebRTCSessionDescription.new(GstWebRTC.WebRTCSDPType.ANSWER, message)
        self.webrtc.emit("set-remote-description", answer, Gst.Promise.new())

    def _on_connection_state(self, _element: Any, _spec: Any) -> None:
        state = self.webrtc.get_property("connection-state")
        self.state = state.value_nick
        if state == GstWebRTC.WebRTCPeerConnectionState.CONNECTED:
            emit("connected")
        elif state == GstWebRTC.WebRTCPeerConnectionState.FAILED:
            emit("error", message="connection failed")

    # ------------------------------------------------------------------ media and data

    def _on_pad_added(self, _element: Any, pad: Gst.Pad) -> None:
        if pad.direction != Gst.PadDirection.SRC:
            return
        decode = Gst.ElementFactory.make("decodebin")
        decode.connect("pad-added", self._on_decoded_pad)
        self.pipe.add(decode)
        decode.sync_state_with_parent()
        pad.link(decode.get_static_pad("sink"))

    def _on_decoded_pad(self, _decodebin: Any, pad: Gst.Pad) -> None:
        sink = Gst.ElementFactory.make("fakesink")
        self.pipe.add(sink)
        sink.sync_state_with_parent()
        pad.link(sink.get_static_pad("sink"))
        if pad.get_current_caps().to_string().startswith("video/"):
            pad.add_probe(Gst.PadProbeType.BUFFER, self._count_frame)

    def _count_frame(self, _pad: Gst.Pad, _info: Any) -> Gst.PadProbeReturn:
        self.frames += 1
        return Gst.PadProbeReturn.OK

    def _on_channel_open(self, channel: Any) -> None:
        channel.emit("send-string", json.dumps({"type": "session.config", "modalities": ["text"]}))

        def ask() -> bool:
            channel.emit("send-string", json.dumps({"type": "video.query", "text": "What do you see and hear?"}))
            return False

        GLib.timeout_add(1500, ask)

    def _on_message(self, text: str) -> None:
        self.messages.append(text)
        emit("message", data=json.loads(text))

    def finish(self) -> None:
        if self.location:
            try:
                http("DELETE", self.location, None, None)
            except Exception as exc:
                self.error = self.error or f"DELETE failed: {exc}"
        emit("result", state=self.state, frames=self.frames, messages=len(self.messages), error=self.error)
        self.pipe.set_state(Gst.State.NULL)


def main() -> None:
    mode, url = sys.argv[1], sys.argv[2]
    Gst.init(None)
    loop = GLib.MainLoop()
    peer = Peer(mode, url)
    peer.start()
    GLib.idle_add(peer.offer)

    def wait_for_stdin() -> None:
        sys.stdin.read()  # the test closes stdin when it has seen enough
        GLib.idle_add(loop.quit)

    threading.Thread(target=wait_for_stdin, daemon=True).start()
    GLib.timeout_add_seconds(LIFETIME_S, loop.quit)
    loop.run()
    peer.finish()


if __name__ == "__main__":
    main()
