// A session's peer connection to the server: the `control` DataChannel, non-trickle offer/answer,
// and a new connection on the same session when the network changed (resume).

import { ServerError, deleteSession, iceConfig, postOffer } from "./api.js";

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
function lostReason(pc) {
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

// A connection down this long is resumed on a new one: ICE consent heals a shorter hiccup by itself.
const RESUME_AFTER_DISCONNECTED_MS = 2000;
// Pauses between resume attempts, the last repeated until the server's grace has passed.
const RESUME_BACKOFF_MS = [500, 1000, 2000, 4000];
const FINAL_REFUSALS = [401, 404, 409]; // a wrong or rotated token, a session gone, one that cannot resume

/** What a view says while its session resumes. */
export const RECONNECTING = "The connection was lost: reconnecting to the same session…";

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

let resumes = 0;

/** How many times this page resumed a session on a new connection (window.rtcOmni.resumes). */
export function resumeCount() {
  return resumes;
}

/**
 * A session on the server and the peer connection that carries it now. With the server's resume
 * (`resume_grace_s` > 0 in the answer), a connection lost for good is replaced by a new one on the
 * same session (`resume`): the same local tracks, the events missed meanwhile replayed, each event
 * passed on once (`server_event_seq`). `handlers`: addMedia(pc), onTrack(event), onMessage(message),
 * onState(connectionState) (optional), and onReconnecting(), onResumed(), onLost(reason).
 */
class RtcSession {
  constructor(handlers, ice) {
    this.handlers = handlers;
    this.ice = ice;
    this.pc = null;
    this.channel = null;
    this.sessionId = null;
    this.sessionToken = null;
    this.resumeToken = null;
    this.resumeGraceS = 0;
    this.lastSeq = 0; // the last server_event_seq passed on: events up to it are not passed on again
    this.lostAt = null; // when the connection was seen going down
    this.resumeTimer = null;
    this.resuming = false;
    this.replaced = false; // another connection took the session over
    this.closed = false;
  }

  send(message) {
    if (this.channel && this.channel.readyState === "open") this.channel.send(JSON.stringify(message));
  }

  /** End the session: on the server too, unless another connection took it over. */
  close() {
    if (this.closed) return;
    this.closed = true;
    clearTimeout(this.resumeTimer);
    if (!this.replaced) deleteSession(this.sessionId, this.sessionToken);
    this.pc.close();
  }

  /** Bring up a new peer connection whose offer `post(sdp)` answers, then carry the session on it. */
  async open(post) {
    const pc = new RTCPeerConnection({ iceServers: this.ice.iceServers });
    const channel = pc.createDataChannel("control"); // before the offer, so the SDP carries it
    try {
      channel.addEventListener("message", (event) => this.receive(event.data));
      pc.addEventListener("track", (event) => this.handlers.onTrack && this.handlers.onTrack(event));
      pc.addEventListener("connectionstatechange", () => this.onState(pc));
      this.handlers.addMedia(pc);
      await pc.setLocalDescription(await pc.createOffer());
      await gatheringComplete(pc);
      const answer = await post(pc.localDescription.sdp);
      this.sessionId = answer.session_id;
      this.sessionToken = answer.session_token || this.sessionToken; // a resume keeps the session's
      this.resumeToken = answer.resume_token || null; // rotated by every resume
      if (answer.resume_grace_s != null) this.resumeGraceS = answer.resume_grace_s;
      await pc.setRemoteDescription({ type: answer.type, sdp: answer.sdp });
      await opened(pc, channel, answerAddresses(answer.sdp), this.ice.loopbackOnly);
      if (this.closed) throw new Error("The session was closed.");
    } catch (error) {
      pc.close();
      throw error;
    }
    // A browser does not stop the local tracks on close(): the new connection sends them on.
    if (this.pc) this.pc.close();
    this.pc = pc;
    this.channel = channel;
  }

  receive(data) {
    if (typeof data !== "string") return;
    let message;
    try {
      message = JSON.parse(data);
    } catch {
      return;
    }
    const seq = message.server_event_seq;
    if (Number.isInteger(seq)) {
      if (seq <= this.lastSeq) return; // seen before the resume
      this.lastSeq = seq;
    }
    if (typeof message.resume_token === "string") this.resumeToken = message.resume_token; // session.created, .resumed
    if (message.type === "session.replaced") {
      // Our own resume replaces the old connection; outside one, another client took the session.
      if (!this.resuming) {
        this.replaced = true;
        this.lose("another connection took the session over");
      }
      return;
    }
    this.handlers.onMessage(message);
  }

  /** The current connection's state (a resume attempt's speaks once it carries the session). */
  onState(pc) {
    if (this.closed || this.resuming || (this.pc && pc !== this.pc)) return;
    const state = pc.connectionState;
    if (this.handlers.onState) this.handlers.onState(state);
    if (!this.pc) return; // still coming up: `opened` says why not
    clearTimeout(this.resumeTimer);
    if (state === "connected") this.lostAt = null;
    if (state !== "disconnected" && state !== "failed") return;
    if (this.lostAt == null) this.lostAt = performance.now();
    if (!this.resumeToken || !(this.resumeGraceS > 0)) {
      if (state === "failed") this.lose(lostReason(pc));
    } else if (state === "failed") this.resume();
    else this.resumeTimer = setTimeout(() => this.resume(), RESUME_AFTER_DISCONNECTED_MS);
  }

  /** Resume on new connections, backing off, until one carries the session or the server's grace has passed. */
  async resume() {
    if (this.resuming || this.closed) return;
    this.resuming = true;
    this.handlers.onReconnecting();
    const deadline = this.lostAt + this.resumeGraceS * 1000;
    let failure = "it did not come back in time";
    for (let attempt = 0; !this.closed && performance.now() < deadline; attempt++) {
      try {
        await this.open((sdp) => postOffer(sdp, this.resumeRequest()));
        resumes += 1;
        this.resuming = false;
        this.lostAt = null;
        this.handlers.onResumed();
        return;
      } catch (error) {
        failure = error.message;
        if (error instanceof ServerError && FINAL_REFUSALS.includes(error.status) && error.code !== "session_resume_conflict") {
          break; // it will not resume (a 429, or a 409 from a try still being answered, may)
        }
      }
      await sleep(RESUME_BACKOFF_MS[Math.min(attempt, RESUME_BACKOFF_MS.length - 1)]);
    }
    this.resuming = false;
    this.lose(`the network path to the server was lost, and resuming failed: ${failure.replace(/\.$/, "")}`);
  }

  resumeRequest() {
    return {
      kind: "resume",
      session_id: this.sessionId,
      resume_token: this.resumeToken,
      last_received_server_event_seq: this.lastSeq,
      allow_resync: true, // rather the session without what was lost than no session
    };
  }

  lose(reason) {
    if (!this.closed) this.handlers.onLost(reason);
  }
}

/**
 * Connect a session of `kind`. `handlers` as RtcSession's. Returns the RtcSession
 * ({pc, channel, send, close, sessionId, sessionToken}). Throws Error with a message fit for the page.
 */
export async function connectSession(kind, handlers) {
  const session = new RtcSession(handlers, await iceConfig());
  await session.open((sdp) => postOffer(sdp, { kind }));
  return session;
}
