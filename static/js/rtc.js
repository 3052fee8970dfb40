// One peer connection to the server: the `control` DataChannel, non-trickle offer/answer.

import { iceServers, postOffer } from "./api.js";

const GATHERING_TIMEOUT_MS = 5000;
const CONNECT_TIMEOUT_MS = 15000;

function gatheringComplete(pc) {
  if (pc.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    // Send what was gathered so far if gathering never completes (a dead STUN/TURN server).
    const timer = setTimeout(done, GATHERING_TIMEOUT_MS);
    function done() {
      clearTimeout(timer);
      pc.removeEventListener("icegatheringstatechange", check);
      resolve();
    }
    function check() {
      if (pc.iceGatheringState === "complete") done();
    }
    pc.addEventListener("icegatheringstatechange", check);
  });
}

function opened(pc, channel) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => fail("the connection timed out"), CONNECT_TIMEOUT_MS);
    function cleanup() {
      clearTimeout(timer);
      channel.removeEventListener("open", onOpen);
      pc.removeEventListener("connectionstatechange", onState);
    }
    function fail(why) {
      cleanup();
      reject(new Error(`Could not connect to the server: ${why}.`));
    }
    function onOpen() {
      cleanup();
      resolve();
    }
    function onState() {
      if (pc.connectionState === "failed") fail("ICE/DTLS failed (no network path to the media server)");
      if (pc.connectionState === "closed") fail("the connection closed");
    }
    channel.addEventListener("open", onOpen);
    pc.addEventListener("connectionstatechange", onState);
  });
}

/**
 * Connect a session of `kind`. `addMedia(pc)` adds the transceivers before the offer.
 * Returns {pc, channel, sessionId}. Throws Error with a message fit for the page.
 */
export async function connectSession(kind, { addMedia, onTrack, onMessage, onState }) {
  const pc = new RTCPeerConnection({ iceServers: await iceServers() });
  try {
    const channel = pc.createDataChannel("control"); // before the offer, so the SDP carries it
    channel.addEventListener("message", (event) => {
      if (typeof event.data !== "string") return;
      let message;
      try {
        message = JSON.parse(event.data);
      } catch {
        return;
      }
      onMessage(message);
    });
    pc.addEventListener("track", (event) => onTrack && onTrack(event));
    pc.addEventListener("connectionstatechange", () => onState && onState(pc.connectionState));
    addMedia(pc);
    await pc.setLocalDescription(await pc.createOffer());
    await gatheringComplete(pc);
    const answer = await postOffer(pc.localDescription.sdp, kind);
    await pc.setRemoteDescription({ type: answer.type, sdp: answer.sdp });
    await opened(pc, channel);
    const send = (message) => {
      if (channel.readyState === "open") channel.send(JSON.stringify(message));
    };
    return { pc, channel, send, sessionId: answer.session_id };
  } catch (error) {
    pc.close();
    throw error;
  }
}
