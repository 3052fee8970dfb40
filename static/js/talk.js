// The Talk view: an understanding session (camera + mic in, text + talker audio out).

import { sessionStats } from "./api.js";
import { LevelMeter, audioContext } from "./meter.js";
import { RECONNECTING, connectSession } from "./rtc.js";
import { $, Notice, icon, mediaErrorMessage, seconds, setText } from "./ui.js";

const PING_INTERVAL_MS = 2000;
const STATS_INTERVAL_MS = 1000;
const AUDIO_POLL_MS = 100;
const LEVEL_INTERVAL_MS = 50;
// Pauses between the talker's words and sentences shorter than this still count as speaking.
const SPEAKING_HOLD_MS = 600;
// After push-to-talk is released, the last speech packets are still on their way to the server.
const PTT_TAIL_MS = 250;
// The server samples the camera at `sample_fps`; the camera sends twice that, at least MIN_SEND_FPS:
// rtc_omni/client/media.py camera_send_fps (the same rule) says why, docs/protocol.md has the figures.
const DEFAULT_SAMPLE_FPS = 2;
const MIN_SEND_FPS = 5;
// The camera's bitrate follows its frame rate: this many bits a frame, 150 kb/s at 5 fps
// (rtc_omni/client/media.py CAMERA_BITS_PER_FRAME; docs/protocol.md, "Camera bitrate", says why).
const CAMERA_BITS_PER_FRAME = 30_000;

/** The frame rate the camera sends to a session sampling `sampleFps`, at most `captureFps` when known. */
function cameraSendFps(sampleFps, captureFps) {
  const sample = Number.isFinite(sampleFps) && sampleFps > 0 ? sampleFps : DEFAULT_SAMPLE_FPS;
  const wanted = Math.max(2 * sample, MIN_SEND_FPS);
  return captureFps > 0 ? Math.min(wanted, captureFps) : wanted;
}

/** The camera's sendEncodings for a session sampling `sampleFps`: its frame rate and the bitrate that goes with it. */
export function cameraEncoding(sampleFps, captureFps) {
  const maxFramerate = cameraSendFps(sampleFps, captureFps);
  return { maxFramerate, maxBitrate: Math.round(CAMERA_BITS_PER_FRAME * maxFramerate) };
}

const PTT_HINT =
  "Push to talk: the server hears your microphone only while you hold the button (or Space while it has focus). " +
  "Releasing it asks with what you said, and the text box if filled. A typed question goes without your voice. " +
  "A new question interrupts the answer in progress.";
// The empty transcript says what to do next: how to connect (index.html), then this.
const ASK_HINT = "Type a question below, or hold “Hold to talk” and speak: the answer appears here.";
const OPEN_MIC_HINT =
  "Open mic: the server hears your microphone all the time; each question takes what it heard since the last one. " +
  "A new question interrupts the answer in progress.";

/** One question and its answer in the transcript. */
class Turn {
  constructor(transcript, question, { spoken = false, notes = [] } = {}) {
    this.requestId = null;
    this.sentAt = performance.now();
    this.firstTextMs = null;
    this.firstAudioMs = null;
    this.audioBaseline = null;
    this.text = "";
    this.notes = notes;
    // thinking | writing | speaking (open), then done | cancelled | interrupted | failed
    this.state = "thinking";
    this.el = document.createElement("article");
    this.el.className = "turn";
    const asked = document.createElement("p");
    asked.className = "asked";
    if (spoken) asked.append(icon("icon-mic"), question || "(spoken question)");
    else asked.append(question);
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
    return ["thinking", "writing", "speaking"].includes(this.state);
  }

  setState(state) {
    this.state = state;
    this.render();
  }

  addText(delta) {
    if (this.firstTextMs == null) this.firstTextMs = performance.now() - this.sentAt;
    this.text += delta;
    if (this.state === "thinking") this.state = "writing";
    this.render();
  }

  fail(message) {
    this.error = message;
    this.setState("failed");
  }

  render() {
    this.el.dataset.state = this.state;
    this.answer.textContent = this.text || (this.state === "thinking" ? "…" : "");
    const parts = [];
    const label = {
      thinking: "thinking",
      writing: "writing",
      speaking: "speaking",
      done: "",
      cancelled: "cancelled: interrupted by a new question",
      interrupted: "interrupted",
      failed: `failed: ${this.error || "error"}`,
    }[this.state];
    if (label) parts.push(label);
    if (this.firstTextMs != null) parts.push(`first text ${seconds(this.firstTextMs)}`);
    if (this.firstAudioMs != null) parts.push(`first audio ${seconds(this.firstAudioMs)}`);
    parts.push(...this.notes);
    this.meta.textContent = parts.join(" · ");
  }
}

export class TalkView {
  constructor() {
    this.notice = new Notice("talk-notice");
    this.transcript = $("transcript");
    this.settings = $("talk-settings");
    this.talker = $("talker");
    this.micMeter = new LevelMeter($("mic-level"));
    this.talkerMeter = new LevelMeter($("talker-level"));
    this.session = null;
    this.connecting = false;
    this.reconnecting = false; // the connection was lost: the session resumes on a new one
    this.stream = null;
    this.cameraSender = null; // its maxFramerate follows the session's sample_fps
    this.micProbe = null; // a clone of the mic track: the meter shows the mic even while it is not sent
    this.turns = []; // every turn, oldest first
    this.pending = []; // sent, not yet bound to a request_id
    this.configState = "none"; // none | pending | applied | rejected
    this.framesBuffered = 0;
    this.framesFiltered = 0;
    this.connectHint = this.transcript.querySelector(".empty").textContent;
    this.timers = [];
    this.pingSentAt = null;
    this.muteUntilRequest = null; // a locally interrupted turn whose audio is muted
    this.pttHeld = false;
    this.talkerHeardAt = -Infinity;

    $("talk-connect").addEventListener("click", () => this.connect());
    $("talk-disconnect").addEventListener("click", () => this.disconnect("Disconnected."));
    $("talk-query").addEventListener("submit", (event) => {
      event.preventDefault();
      const input = $("query-text");
      if (!input.value.trim() || $("talk-ask").disabled) return;
      this.ask(input.value.trim());
      input.value = "";
      this.refresh();
    });
    $("query-text").addEventListener("input", () => this.refresh());
    $("talk-interrupt").addEventListener("click", () => this.interrupt());
    this.settings.addEventListener("submit", (event) => {
      event.preventDefault();
      this.sendConfig();
    });
    $("talk-open-mic").addEventListener("change", () => this.updateMic());
    this.setupPushToTalk($("talk-ptt"));
    this.refresh();
  }

  // ---- connection -------------------------------------------------------------------------

  async connect() {
    this.notice.clear();
    this.connecting = true;
    audioContext(); // from the click, so that the browser lets it run
    $("hud-state").textContent = "opening camera";
    this.refresh();
    try {
      // 640x480 lies inside the pixel range Qwen-Omni's video processor keeps as it is (docs/protocol.md).
      this.stream = await navigator.mediaDevices.getUserMedia({
        video: { width: { ideal: 640 }, height: { ideal: 480 } },
        audio: { echoCancellation: true, noiseSuppression: true, autoGainControl: true },
      });
    } catch (error) {
      this.notice.show(mediaErrorMessage(error));
      this.connecting = false;
      $("hud-state").textContent = "not connected";
      this.refresh();
      return;
    }
    $("talk-camera").srcObject = this.stream;
    const [mic] = this.stream.getAudioTracks();
    if (mic) {
      this.micProbe = new MediaStream([mic.clone()]);
      this.micMeter.attach(this.micProbe);
    }
    this.updateMic();
    $("hud-state").textContent = "connecting";
    try {
      this.session = await connectSession("understand", {
        addMedia: (pc) => {
          const [video] = this.stream.getVideoTracks();
          const [audio] = this.stream.getAudioTracks();
          if (video) {
            // Under CPU or bandwidth pressure, send fewer frames rather than smaller ones: the model
            // sees a few frames a second, each of which should keep its detail.
            video.contentHint = "detail";
            const encoding = cameraEncoding(this.config().sample_fps, video.getSettings().frameRate);
            const sendEncodings = [encoding];
            this.cameraSender = pc.addTransceiver(video, { direction: "sendonly", streams: [this.stream], sendEncodings }).sender;
            $("hud-camera").textContent = `≤ ${encoding.maxFramerate} fps`;
          }
          if (audio) pc.addTransceiver(audio, { direction: "sendrecv", streams: [this.stream] });
          else pc.addTransceiver("audio", { direction: "recvonly" });
        },
        onTrack: (event) => {
          if (event.track.kind !== "audio") return;
          const stream = new MediaStream([event.track]);
          this.talker.srcObject = stream;
          this.talkerMeter.attach(stream);
        },
        onMessage: (message) => this.onMessage(message),
        onState: (state) => this.onConnectionState(state),
        onReconnecting: () => this.onReconnecting(),
        onResumed: () => this.onResumed(),
        onLost: (reason) => this.onLost(reason),
      });
    } catch (error) {
      this.connecting = false;
      this.stopMedia();
      $("hud-state").textContent = "failed";
      this.notice.show(error.message);
      this.refresh();
      return;
    }
    this.connecting = false;
    $("hud-state").textContent = this.session.pc.connectionState;
    this.sendConfig();
    this.timers.push(setInterval(() => this.ping(), PING_INTERVAL_MS));
    this.timers.push(setInterval(() => this.refreshStats(), STATS_INTERVAL_MS));
    this.timers.push(setInterval(() => this.pollAudio(), AUDIO_POLL_MS));
    this.timers.push(setInterval(() => this.measure(), LEVEL_INTERVAL_MS));
    this.ping();
    this.refresh();
  }

  disconnect(reason) {
    const session = this.session;
    this.session = null;
    for (const timer of this.timers) clearInterval(timer);
    this.timers = [];
    if (session) session.close();
    this.reconnecting = false;
    this.interruptOpenTurns();
    this.stopMedia();
    this.configState = "none";
    this.framesBuffered = 0;
    this.framesFiltered = 0;
    $("hud-state").textContent = reason === "Disconnected." ? "not connected" : "closed";
    $("talk-settings-state").textContent = "Sent when you connect; fixed for the session once applied.";
    $("talk-apply").hidden = true;
    this.refresh();
  }

  stopMedia() {
    for (const stream of [this.stream, this.micProbe]) if (stream) for (const track of stream.getTracks()) track.stop();
    this.stream = null;
    this.cameraSender = null;
    $("hud-camera").textContent = "–";
    this.micProbe = null;
    this.micMeter.detach();
    this.talkerMeter.detach();
    this.talkerHeardAt = -Infinity;
    $("talk-camera").srcObject = null;
    this.talker.srcObject = null;
  }

  onConnectionState(state) {
    $("hud-state").textContent = state;
    if (state === "disconnected") {
      this.notice.show("The connection is interrupted; waiting for it to come back…", "warning");
    } else if (state === "connected") this.notice.clearWarning();
  }

  onReconnecting() {
    this.reconnecting = true;
    $("hud-state").textContent = "reconnecting";
    this.notice.show(RECONNECTING, "warning");
    this.refresh();
  }

  /** The session goes on over a new connection: its talker track is new, and so are its stats. */
  onResumed() {
    this.reconnecting = false;
    $("hud-state").textContent = this.session.pc.connectionState;
    this.notice.clearWarning();
    this.pingSentAt = null; // a ping sent into the lost connection gets no pong
    for (const turn of this.turns) turn.audioBaseline = null;
    this.refresh();
  }

  onLost(reason) {
    this.notice.show(`The connection to the server failed: ${reason}. Connect again.`);
    this.disconnect("failed");
  }

  /** Mark the open turns interrupted: their answers will not come (disconnected, or lost in a resume). */
  interruptOpenTurns() {
    for (const turn of this.turns) if (turn.open) turn.setState("interrupted");
    this.pending = [];
  }

  // ---- what the page shows: state, meters, which controls work ---------------------------

  /** The server can take a question: settings applied and at least one camera frame buffered. */
  get ready() {
    return Boolean(this.session) && !this.reconnecting && this.configState === "applied" && this.framesBuffered > 0;
  }

  get micLive() {
    return this.pttHeld || $("talk-open-mic").checked;
  }

  get openTurn() {
    return [...this.turns].reverse().find((t) => t.open);
  }

  get talkerSpeaking() {
    return performance.now() - this.talkerHeardAt < SPEAKING_HOLD_MS;
  }

  /** Every LEVEL_INTERVAL_MS: read both meters; the talker's level says when the answer is audible. */
  measure() {
    this.micMeter.update();
    this.talkerMeter.update();
    if (this.talkerMeter.audible && !this.talker.muted) {
      this.talkerHeardAt = performance.now();
      const turn = [...this.turns].reverse().find((t) => t.open && t.requestId);
      if (turn && turn.state !== "speaking") turn.setState("speaking");
    }
    this.refresh();
  }

  /** The conversation's state (listening / thinking / speaking), the meters' notes, and the controls. */
  refresh() {
    const [state, text] = this.conversationState();
    const box = $("talk-state");
    if (box.dataset.state !== state) box.dataset.state = state;
    setText($("talk-state-text"), text);

    let mic = "off";
    if (this.micProbe) mic = this.micLive ? "sending" : "muted: hold to talk";
    setText($("mic-state"), mic);
    $("mic-level").parentElement.dataset.muted = String(!this.micLive);
    let talker = "off";
    if (this.session) talker = this.talker.muted ? "muted" : this.talkerSpeaking ? "speaking" : "silent";
    setText($("talker-state"), talker);
    setText($("ptt-hint"), $("talk-open-mic").checked ? OPEN_MIC_HINT : PTT_HINT);

    const connected = Boolean(this.session);
    const empty = this.transcript.querySelector(".empty");
    if (empty) setText(empty, connected ? ASK_HINT : this.connectHint);
    const hasMic = Boolean(this.stream && this.stream.getAudioTracks().length);
    $("talk-connect").disabled = connected || this.connecting;
    $("talk-disconnect").disabled = !connected;
    $("query-text").disabled = !connected;
    $("talk-ask").disabled = !this.ready || !$("query-text").value.trim();
    $("talk-ptt").disabled = !this.pttHeld && !(this.ready && hasMic);
    $("talk-interrupt").disabled = !connected || !this.openTurn;
  }

  conversationState() {
    if (this.connecting) return ["connecting", "Connecting…"];
    if (this.reconnecting) return ["connecting", "Reconnecting…"];
    if (!this.session) return ["off", "Not connected"];
    if (this.configState === "rejected") return ["connecting", "Settings rejected: fix them and apply again"];
    if (this.configState !== "applied") return ["connecting", "Applying the settings…"];
    if (this.framesBuffered === 0) return ["connecting", "Waiting for the camera's first frame…"];
    if (this.pttHeld) return ["listening", "Listening: speak, then release the button"];
    if (this.talkerSpeaking && !this.talker.muted) return ["speaking", "Speaking"];
    if (this.openTurn) return ["thinking", "Thinking"];
    if ($("talk-open-mic").checked) return ["listening", "Listening (open mic)"];
    return ["listening", "Your turn: type a question, or hold “Hold to talk” and speak"];
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
    const config = this.config();
    this.limitCamera(config.sample_fps);
    this.session.send({ type: "session.config", ...config });
    // The pong after the config says it applied; an error before it says why not.
    this.pingSentAt = performance.now();
    this.session.send({ type: "ping" });
    this.refresh();
  }

  /** The camera sends what the server samples at `sampleFps`, with headroom (cameraEncoding). */
  async limitCamera(sampleFps) {
    const sender = this.cameraSender;
    if (!sender || !sender.track) return;
    const { maxFramerate, maxBitrate } = cameraEncoding(sampleFps, sender.track.getSettings().frameRate);
    const parameters = sender.getParameters();
    const current = parameters.encodings?.[0];
    if (!current || (current.maxFramerate === maxFramerate && current.maxBitrate === maxBitrate)) return;
    Object.assign(current, { maxFramerate, maxBitrate });
    try {
      await sender.setParameters(parameters);
      $("hud-camera").textContent = `≤ ${maxFramerate} fps`;
    } catch (error) {
      // The session still works, at the camera's full rate and the server's bitrate cap.
      this.notice.show(`Could not set the camera's frame rate and bitrate: ${error.message}`, "warning");
    }
  }

  // ---- turns ------------------------------------------------------------------------------

  ask(text, { spoken = false } = {}) {
    if (!this.session) return;
    this.notice.clear();
    this.unmuteTalker();
    // Said where it applies: a typed question with push-to-talk carries only silence.
    const notes = [];
    if (!spoken && !this.micLive && this.micProbe) notes.push("typed; mic muted (push to talk), so no voice was sent");
    const frames = this.framesNote();
    if (frames) notes.push(frames);
    const turn = new Turn(this.transcript, text, { spoken, notes });
    this.turns.push(turn);
    this.pending.push(turn);
    this.session.send({ type: "video.query", text });
    this.transcript.scrollTop = this.transcript.scrollHeight;
    this.refresh();
  }

  /** Why a turn sees fewer frames than "Frames per question" asks for; "" when it sees them all. */
  framesNote() {
    const wanted = this.config().num_frames;
    const frames = Math.min(wanted, this.framesBuffered);
    if (frames >= wanted) return "";
    // The server keeps only frames that differ (EVS): a still camera leaves one.
    const why = this.framesFiltered > 0 ? "similar frames are skipped (a still camera gives 1)" : "no more sent yet";
    return `${frames} of ${wanted} frames: ${why}`;
  }

  /** Stop the answer in progress: the talker goes quiet here at once, and the turn is marked. */
  interrupt() {
    const turn = this.openTurn;
    if (!turn) return;
    turn.setState("interrupted");
    // The server stops the turn (response.cancel -> response.cancelled); what is already on the
    // wire is muted here until then.
    if (turn.requestId) {
      this.muteUntilRequest = turn.requestId;
      this.session.send({ type: "response.cancel" });
    }
    this.talker.muted = true;
    this.pending = this.pending.filter((t) => t !== turn);
    this.refresh();
  }

  unmuteTalker() {
    this.muteUntilRequest = null;
    this.talker.muted = false;
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
      case "video.frame.ack":
        if (typeof message.buffered_frames === "number") this.framesBuffered = message.buffered_frames;
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
          // With speech the turn stays open until the talker finished (response.audio.done).
          if (this.config().modalities.includes("audio")) turn.render();
          else turn.setState("done");
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
      case "session.resync_required": // events of the session were lost in a resume
        this.interruptOpenTurns();
        break;
      default:
        break; // video.frames.consumed, session.done: the HUD polls stats instead
    }
    const latest = [...this.turns].reverse().find((t) => t.firstTextMs != null || t.firstAudioMs != null);
    if (latest) {
      $("hud-first-text").textContent = seconds(latest.firstTextMs);
      $("hud-first-audio").textContent = seconds(latest.firstAudioMs);
    }
    this.refresh();
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
      this.talker.muted = true;
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
        this.ask(text, { spoken: true });
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
    if (this.stream) for (const track of this.stream.getAudioTracks()) track.enabled = this.micLive;
    this.refresh();
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
    const stats = await sessionStats(this.session.sessionId, this.session.sessionToken);
    if (!stats) return;
    if (typeof stats.frames_buffered === "number") this.framesBuffered = stats.frames_buffered;
    if (typeof stats.frames_filtered === "number") this.framesFiltered = stats.frames_filtered;
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
