// One peer connection to the server: the `control` DataChannel, non-trickle offer/answer.

import { iceConfig, postOffer } from "./api.js";

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

/** The server's addresses from its answer ("127.0.0.1:50123 udp"), for error messages. */
function answerAddresses(sdp) {
  const found = [];
  for (const line of sdp.split(/\r?\n/)) {
    // a=candidate:<foundation> <component> <transport> <priority> <address> <port> typ <type>
    const fields = line.startsWith("a=candidate:") ? line.split(" ") : [];
    if (fields.length >= 6 && fields[1] === "1") found.push(`${fields[4]}:${fields[5]} ${fields[2].toLowerCase()}`);
  }
  return found.length ? found.slice(0, 3).join(", ") : "none";
}

/**
 * Why the connection did not come up, from the stage it reached: ICE, then DTLS, then the channel.
 * `iceConnected` says whether ICE ever found a path: the browser may report the connection failed
 * before it reports ICE failed, and without a path there was no DTLS handshake to fail.
 */
function notConnectedReason(pc, addresses, timedOut, iceConnected, loopbackOnly) {
  const ice = pc.iceConnectionState;
  const seconds = `${CONNECT_TIMEOUT_MS / 1000} s`;
  const silent = `none of the server's addresses (${addresses}) answered`;
  const hint = loopbackOnly
    ? "The server's ICE listens on loopback only, which only a browser on its own machine reaches: " +
      "restart it with --ice-address set to an address this browser reaches (or all)"
    : "A firewall or NAT is in the way; a TURN server (rtc-omni serve --ice-server) gets through most";
  if (ice === "failed" || (pc.connectionState === "failed" && !iceConnected)) return `ICE failed: ${silent}. ${hint}`;
  if (timedOut && (ice === "new" || ice === "checking")) return `ICE found no network path within ${seconds}: ${silent}. ${hint}`;
  if (pc.connectionState === "failed") return "the network path works, but the secure media handshake (DTLS) failed";
  if (pc.connectionState === "closed") return "the connection was closed";
  if (pc.connectionState !== "connected") {
    return `the network path works, but the secure media handshake (DTLS) did not finish within ${seconds}`;
  }
  return `the connection is up, but the control channel did not open within ${seconds}`;
}

/** Why an established connection failed: the network path (ICE) or the encryption (DTLS). */
export function lostReason(pc) {
  return pc.iceConnectionState === "failed"
    ? "the network path to the server was lost (ICE failed)"
    : "the secure media connection failed (DTLS)";
}

function opened(pc, channel, addresses, loopbackOnly) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => fail(true), CONNECT_TIMEOUT_MS);
    let iceConnected = false;
    function cleanup() {
      clearTimeout(timer);
      channel.removeEventListener("open", onOpen);
      pc.removeEventListener("connectionstatechange", onState);
      pc.removeEventListener("iceconnectionstatechange", onState);
    }
    function fail(timedOut) {
      cleanup();
      reject(new Error(`Could not connect to the server: ${notConnectedReason(pc, addresses, timedOut, iceConnected, loopbackOnly)}.`));
    }
    function onOpen() {
      cleanup();
      resolve();
    }
    function onState() {
      if (["connected", "completed"].includes(pc.iceConnectionState)) iceConnected = true;
      if (pc.iceConnectionState === "failed" || ["failed", "closed"].includes(pc.connectionState)) fail(false);
    }
    channel.addEventListener("open", onOpen);
    pc.addEventListener("connectionstatechange", onState);
    pc.addEventListener("iceconnectionstatechange", onState);
    // On a loaded machine Chromium can open the channel before setRemoteDescription's promise
    // resumes the caller: the "open" event has then fired already, and waiting for it would hang
    // until the timeout while the channel works.
    if (channel.readyState === "open") onOpen();
  });
}

/**
 * Connect a session of `kind`. `addMedia(pc)` adds the transceivers before the offer.
 * Returns {pc, channel, sessionId, sessionToken}. Throws Error with a message fit for the page.
 */
export async function connectSession(kind, { addMedia, onTrack, onMessage, onState }) {
  const ice = await iceConfig();
  const pc = new RTCPeerConnection({ iceServers: ice.iceServers });
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
    await opened(pc, channel, answerAddresses(answer.sdp), ice.loopbackOnly);
    const send = (message) => {
      if (channel.readyState === "open") channel.send(JSON.stringify(message));
    };
    return { pc, channel, send, sessionId: answer.session_id, sessionToken: answer.session_token };
  } catch (error) {
    pc.close();
    throw error;
  }
}
