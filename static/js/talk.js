// The Talk view: an understanding session (camera + mic in, text + talker audio out).

import { deleteSession, sessionStats } from "./api.js";
import { connectSession } from "./rtc.js";
import { $, Notice, mediaErrorMessage, seconds } from "./ui.js";

const PING_INTERVAL_MS = 2000;
const STATS_INTERVAL_MS = 1000;
const AUDIO_POLL_MS = 100;
// After push-to-talk is released, the last speech packets are still on their way to the server.
const PTT_TAIL_MS = 250;

/** One question and its answer in the transcript. */
class Turn {
  constructor(transcript, question) {
    this.requestId = null;
    this.sentAt = performance.now();
    this.firstTextMs = null;
    this.firstAudioMs = null;
    this.audioBaseline = null;
    this.text = "";
    this.state = "waiting"; // waiting | streaming | speaking | done | cancelled | interrupted | failed
    this.el = document.createElement("article");
    this.el.className = "turn";
    const asked = document.createElement("p");
    asked.className = "asked";
    asked.textContent = question;
    this.answer = document.createElement("p");
    this.answer.className = "answer";
    this.meta = document.createElement("p");
    this.meta.className = "meta";
    this.el.append(asked, this.answer, this.meta);
    transcript.querySelector(".empty")?.remove();
    transcript.append(this.el);
    this.render();
  }

  get open() {
    return ["waiting", "streaming", "speaking"].includes(this.state);
  }

  setState(state) {
    this.state = state;
    this.render();
  }

  addText(delta) {
    if (this.firstTextMs == null) this.firstTextMs = performance.now() - this.sentAt;
    this.text += delta;
    if (this.state === "waiting") this.state = "streaming";
    this.render();
  }

  fail(message) {
    this.error = message;
    this.setState("failed");
  }

  render() {
    this.el.dataset.state = this.state;
    this.answer.textContent = this.text || (this.state === "waiting" ? "…" : "");
    const parts = [];
    const label = {
      waiting: "waiting for the answer",
      streaming: "answering",
      speaking: "speaking",
      done: "",
      cancelled: "cancelled: interrupted by a new question",
      interrupted: "interrupted",
      failed: `failed: ${this.error || "error"}`,
    }[this.state];
    if (label) parts.push(label);
    if (this.firstTextMs != null) parts.push(`first text ${seconds(this.firstTextMs)}`);
    if (this.firstAudioMs != null) parts.push(`first audio ${seconds(this.firstAudioMs)}`);
    this.meta.textContent = parts.join(" · ");
  }
}

export class TalkView {
  constructor() {
    this.notice = new Notice("talk-notice");
    this.transcript = $("transcript");
    this.settings = $("talk-settings");
    this.session = null;
    this.stream = null;
    this.turns = []; // every turn, oldest first
    this.pending = []; // sent, not yet bound to a request_id
    this.configState = "none"; // none | pending | applied | rejected
    this.timers = [];
    this.pingSentAt = null;
    this.muteUntilRequest = null; // a locally interrupted turn whose audio is muted
    this.pttHeld = false;

    $("talk-connect").addEventListener("click", () => this.connect());
    $("talk-disconnect").addEventListener("click", () => this.disconnect("Disconnected."));
    $("talk-query").addEventListener("submit", (event) => {
      event.preventDefault();
      const input = $("query-text");
      if (!input.value.trim()) return;
      this.ask(input.value.trim());
      input.value = "";
    });
    $("talk-interrupt").addEventListener("click", () => this.interrupt());
    this.settings.addEventListener("submit", (event) => {
      event.preventDefault();
      this.sendConfig();
    });
    $("talk-open-mic").addEventListener("change", () => this.updateMic());
    this.setupPushToTalk($("talk-ptt"));
  }

  // ---- connection -------------------------------------------------------------------------

  async connect() {
    this.notice.clear();
    this.setConnected(false, true);
    $("hud-state").textContent = "opening camera";
    try {
      this.stream = await navigator.mediaDevices.getUserMedia({
        video: { width: { ideal: 640 }, height: { ideal: 480 } },
        audio: { echoCancellation: true, noiseSuppression: true, autoGainControl: true },
      });
    } catch (error) {
      this.notice.show(mediaErrorMessage(error));
      this.setConnected(false);
      $("hud-state").textContent = "not connected";
      return;
    }
    $("talk-camera").srcObject = this.stream;
    this.updateMic();
    $("hud-state").textContent = "connecting";
    try {
      this.session = await connectSession("understand", {
        addMedia: (pc) => {
          const [video] = this.stream.getVideoTracks();
          const [audio] = this.stream.getAudioTracks();
          if (video) pc.addTransceiver(video, { direction: "sendonly", streams: [this.stream] });
          if (audio) pc.addTransceiver(audio, { direction: "sendrecv", streams: [this.stream] });
          else pc.addTransceiver("audio", { direction: "recvonly" });
        },
        onTrack: (event) => {
          if (event.track.kind === "audio") $("talker").srcObject = new MediaStream([event.track]);
        },
        onMessage: (message) => this.onMessage(message),
        onState: (state) => this.onConnectionState(state),
      });
    } catch (error) {
      this.stopMedia();
      this.setConnected(false);
      $("hud-state").textContent = "failed";
      this.notice.show(error.message);
      return;
    }
    $("hud-state").textContent = this.session.pc.connectionState;
    this.setConnected(true);
    this.sendConfig();
    this.timers.push(setInterval(() => this.ping(), PING_INTERVAL_MS));
    this.timers.push(setInterval(() => this.refreshStats(), STATS_INTERVAL_MS));
    this.timers.push(setInterval(() => this.pollAudio(), AUDIO_POLL_MS));
    this.ping();
  }

  disconnect(reason) {
    const session = this.session;
    this.session = null;
    for (const timer of this.timers) clearInterval(timer);
    this.timers = [];
    if (session) {
      deleteSession(session.sessionId);
      session.pc.close();
    }
    for (const turn of this.turns) if (turn.open) turn.setState("interrupted");
    this.pending = [];
    this.stopMedia();
    this.configState = "none";
    this.setConnected(false);
    $("hud-state").textContent = reason === "Disconnected." ? "not connected" : "closed";
    $("talk-settings-state").textContent = "Sent when you connect; fixed for the session once applied.";
    $("talk-apply").hidden = true;
  }

  stopMedia() {
    if (this.stream) for (const track of this.stream.getTracks()) track.stop();
    this.stream = null;
    $("talk-camera").srcObject = null;
    $("talker").srcObject = null;
  }

  onConnectionState(state) {
    $("hud-state").textContent = state;
    if (state === "failed" && this.session) {
      this.notice.show("The connection to the server failed (no media path). Connect again.");
      this.disconnect("failed");
    } else if (state === "disconnected") {
      this.notice.show("The connection is interrupted; waiting for it to come back…", "warning");
    } else if (state === "connected") {
      if (this.notice.box.dataset.level === "warning") this.notice.clear();
    }
  }

  setConnected(connected, busy = false) {
    $("talk-connect").disabled = connected || busy;
    $("talk-disconnect").disabled = !connected;
    for (const id of ["query-text", "talk-ask", "talk-ptt", "talk-interrupt"]) $(id).disabled = !connected;
  }

  // ---- settings ---------------------------------------------------------------------------

  config() {
    const form = this.settings.elements;
    const number = (name) => Number(form[name].value);
    const config = {
      num_frames: number("num_frames"),
      max_frames: number("max_frames"),
      sample_fps: number("sample_fps"),
      enable_frame_filter: form.enable_frame_filter.checked,
      frame_filter_threshold: number("frame_filter_threshold"),
      modalities: form.modalities.value.split(","),
    };
    const prompt = form.system_prompt.value.trim();
    if (prompt) config.system_prompt = prompt;
    return config;
  }

  sendConfig() {
    if (!this.session || this.configState === "pending" || this.configState === "applied") return;
    this.configState = "pending";
    $("talk-apply").hidden = true;
    $("talk-settings-state").textContent = "Applying…";
    this.session.send({ type: "session.config", ...this.config() });
    // The pong after the config says it applied; an error before it says why not.
    this.pingSentAt = performance.now();
    this.session.send({ type: "ping" });
  }

  // ---- turns ------------------------------------------------------------------------------

  ask(text, label) {
    if (!this.session) return;
    this.notice.clear();
    this.unmuteTalker();
    const turn = new Turn(this.transcript, label || text);
    this.turns.push(turn);
    this.pending.push(turn);
    this.session.send({ type: "video.query", text });
    this.transcript.scrollTop = this.transcript.scrollHeight;
  }

  /** Stop the answer in progress: the talker goes quiet here at once, and the turn is marked. */
  interrupt() {
    const turn = [...this.turns].reverse().find((t) => t.open);
    if (!turn) return;
    turn.setState("interrupted");
    // The server stops the turn (response.cancel -> response.cancelled); what is already on the
    // wire is muted here until then.
    if (turn.requestId) {
      this.muteUntilRequest = turn.requestId;
      this.session.send({ type: "response.cancel" });
    }
    $("talker").muted = true;
    this.pending = this.pending.filter((t) => t !== turn);
  }

  unmuteTalker() {
    this.muteUntilRequest = null;
    $("talker").muted = false;
  }

  turnFor(requestId) {
    return this.turns.find((t) => t.requestId === requestId);
  }

  onMessage(message) {
    const turn = message.request_id ? this.turnFor(message.request_id) : null;
    switch (message.type) {
      case "pong":
        if (this.pingSentAt != null) $("hud-rtt").textContent = `${Math.round(performance.now() - this.pingSentAt)} ms`;
        this.pingSentAt = null;
        if (this.configState === "pending") {
          this.configState = "applied";
          $("talk-settings-state").textContent = "Applied.";
        }
        break;
      case "response.start": {
        const next = this.pending.shift();
        if (next) next.requestId = message.request_id;
        else if (this.muteUntilRequest == null) this.muteUntilRequest = message.request_id; // interrupted before it began
        break;
      }
      case "response.text.delta":
        if (turn && turn.open) turn.addText(message.delta);
        break;
      case "response.text.done":
        if (turn && turn.open) {
          turn.text = message.text;
          const speaks = this.config().modalities.includes("audio");
          turn.setState(turn.state === "failed" ? "failed" : speaks ? "speaking" : "done");
        }
        break;
      case "response.audio.done":
        if (turn && turn.open) turn.setState("done");
        if (message.request_id === this.muteUntilRequest) this.unmuteTalker();
        break;
      case "response.cancelled":
        if (turn && turn.state !== "interrupted") turn.setState("cancelled");
        if (message.request_id === this.muteUntilRequest) this.unmuteTalker();
        break;
      case "error":
        this.onError(message, turn);
        break;
      default:
        break; // video.frame.ack, video.frames.consumed, session.done: the HUD polls stats instead
    }
    const latest = [...this.turns].reverse().find((t) => t.firstTextMs != null || t.firstAudioMs != null);
    if (latest) {
      $("hud-first-text").textContent = seconds(latest.firstTextMs);
      $("hud-first-audio").textContent = seconds(latest.firstAudioMs);
    }
  }

  onError(message, turn) {
    const text = message.message || "unknown error";
    if (this.configState === "rejected" && text.startsWith("Expected session.config")) {
      // The ping sent behind a rejected config: the server still waits for a valid one.
      this.pingSentAt = null;
      return;
    }
    if (this.configState === "pending") {
      this.configState = "rejected";
      this.notice.show(`The server rejected the settings: ${text}`);
      $("talk-settings-state").textContent = "Rejected: fix the settings and apply them again.";
      $("talk-apply").hidden = false;
      return;
    }
    if (turn) {
      turn.fail(text);
    } else if (text === "No frames buffered" && this.pending.length) {
      this.pending.shift().fail("the camera has not sent a frame yet; try again in a moment");
    }
    this.notice.show(`Server error: ${text}`);
  }

  // ---- push to talk -----------------------------------------------------------------------

  setupPushToTalk(button) {
    const press = (event) => {
      if (button.disabled || this.pttHeld) return;
      event.preventDefault();
      this.pttHeld = true;
      button.classList.add("held");
      button.setAttribute("aria-pressed", "true");
      this.unmuteTalker();
      // Speaking over the answer interrupts it: the question sent on release cancels it.
      $("talker").muted = true;
      this.updateMic();
    };
    const release = () => {
      if (!this.pttHeld) return;
      this.pttHeld = false;
      button.classList.remove("held");
      button.setAttribute("aria-pressed", "false");
      const input = $("query-text");
      const text = input.value.trim();
      input.value = "";
      setTimeout(() => {
        this.updateMic();
        this.ask(text, text ? `🎤 ${text}` : "🎤 (spoken question)");
      }, PTT_TAIL_MS);
    };
    button.addEventListener("pointerdown", (event) => {
      button.setPointerCapture?.(event.pointerId);
      press(event);
    });
    button.addEventListener("pointerup", release);
    button.addEventListener("pointercancel", release);
    button.addEventListener("keydown", (event) => {
      if ((event.key === " " || event.key === "Enter") && !event.repeat) press(event);
      else if (event.key === " " || event.key === "Enter") event.preventDefault();
    });
    button.addEventListener("keyup", (event) => {
      if (event.key === " " || event.key === "Enter") {
        event.preventDefault();
        release();
      }
    });
    button.addEventListener("blur", release);
    button.addEventListener("contextmenu", (event) => event.preventDefault());
  }

  /** The microphone reaches the server only while push-to-talk is held, or always with "Open mic". */
  updateMic() {
    if (!this.stream) return;
    const live = this.pttHeld || $("talk-open-mic").checked;
    for (const track of this.stream.getAudioTracks()) track.enabled = live;
  }

  // ---- HUD --------------------------------------------------------------------------------

  ping() {
    // Before a config applied, the server reads every message as a session.config attempt.
    if (!this.session || this.pingSentAt != null || this.configState !== "applied") return;
    this.pingSentAt = performance.now();
    this.session.send({ type: "ping" });
  }

  async refreshStats() {
    if (!this.session) return;
    const stats = await sessionStats(this.session.sessionId);
    if (!stats) return;
    $("hud-buffered").textContent = String(stats.frames_buffered ?? "–");
    $("hud-filtered").textContent = String(stats.frames_filtered ?? "–");
  }

  /** Time to first audio: the talker track's energy starts growing after the question. */
  async pollAudio() {
    if (!this.session) return;
    let energy = 0;
    let packets = 0;
    const report = await this.session.pc.getStats();
    report.forEach((stat) => {
      if (stat.type === "inbound-rtp" && stat.kind === "audio") {
        energy += stat.totalAudioEnergy || 0;
        packets += stat.packetsReceived || 0;
      }
    });
    $("hud-talker").textContent = String(packets);
    for (const turn of this.turns) {
      // The baseline is taken once the server started the turn, i.e. after it silenced any earlier one.
      if (!turn.requestId || !turn.open || turn.firstAudioMs != null) continue;
      if (turn.audioBaseline == null) turn.audioBaseline = energy;
      else if (energy > turn.audioBaseline + 1e-6) {
        turn.firstAudioMs = performance.now() - turn.sentAt;
        turn.render();
        $("hud-first-audio").textContent = seconds(turn.firstAudioMs);
      }
    }
  }
}
