// The Generate view: a generation session (prompt in, generated video out on an RTP track).

import { fetchRecording } from "./api.js";
import { RECONNECTING, connectSession } from "./rtc.js";
import { $, Notice, setText } from "./ui.js";

const PROGRESS_INTERVAL_MS = 250;
// After session.done the last frames are still in flight and in the jitter buffer.
const DRAIN_AFTER_DONE_MS = 3000;

export class GenerateView {
  constructor() {
    this.notice = new Notice("gen-notice");
    this.form = $("gen-form");
    this.video = $("gen-video");
    this.session = null;
    this.phase = "idle"; // idle | connecting | generating | draining (after session.done) | finished
    this.requested = 0;
    this.generated = 0;
    this.chunkFrames = 0; // frames in the first chunk: how many chunks the video will have
    this.framesDecoded = 0;
    this.decodedBefore = 0; // frames decoded on the connections a resume replaced
    this.decodedHere = 0; // frames decoded on the current connection
    this.frameSize = null;
    this.started = false;
    this.done = null; // the session.done event
    this.timer = null;
    this.downloadUrl = null;

    this.form.addEventListener("submit", (event) => {
      event.preventDefault();
      this.start();
    });
    $("gen-stop").addEventListener("click", () => this.stop());
    $("gen-change").addEventListener("submit", (event) => {
      event.preventDefault();
      if (!$("gen-change-btn").disabled) this.changePrompt();
    });
    $("gen-new-prompt").addEventListener("input", () => this.refresh());
    this.refresh();
  }

  /** The engine produced every requested frame: a prompt change has nothing left to apply to. */
  get engineFinished() {
    return this.requested > 0 && this.generated >= this.requested;
  }

  get acceptsPromptChange() {
    return this.phase === "generating" && this.started && !this.engineFinished;
  }

  /** Enable each control only when it can work, and say why the prompt change is closed. */
  refresh() {
    const busy = this.phase === "connecting" || this.phase === "generating";
    $("gen-start").disabled = busy || this.phase === "draining";
    $("gen-stop").disabled = !busy;
    const open = this.acceptsPromptChange;
    $("gen-new-prompt").disabled = !open;
    $("gen-transition").disabled = !open;
    $("gen-change-btn").disabled = !open || !$("gen-new-prompt").value.trim();
    let hint = "Possible while the engine generates: press Generate first.";
    if (open) hint = "Applies from a chunk the engine has not started yet; blend 0 switches at once.";
    else if (this.phase === "generating" && this.engineFinished) {
      hint = "The engine has generated every frame (the rest is still playing): a new prompt needs a new video.";
    } else if (this.phase === "draining" || this.phase === "finished") {
      hint = "This video is finished: press Generate for a new one.";
    } else if (busy) hint = "Possible once the generation has started.";
    setText($("gen-change-hint"), hint);
  }

  request() {
    const form = this.form.elements;
    const request = { prompt: form.prompt.value.trim(), size: form.size.value.trim(), record: form.record.checked };
    for (const name of ["fps", "num_frames", "seed", "num_inference_steps"]) {
      const value = form[name].value.trim();
      if (value !== "") request[name] = Number(value);
    }
    return request;
  }

  async start() {
    this.notice.clear();
    this.close();
    this.reset();
    const request = this.request();
    this.requested = request.num_frames || 0;
    this.phase = "connecting";
    this.refresh();
    this.status("Connecting…");
    try {
      this.session = await connectSession("generate", {
        addMedia: (pc) => pc.addTransceiver("video", { direction: "recvonly" }),
        // A resumed session arrives on a new connection's track: the video plays that one from then on.
        onTrack: (event) => {
          if (event.track.kind === "video") this.video.srcObject = new MediaStream([event.track]);
        },
        onMessage: (message) => this.onMessage(message),
        onReconnecting: () => this.notice.show(RECONNECTING, "warning"),
        onResumed: () => {
          this.decodedBefore += this.decodedHere; // the new connection counts from 0
          this.decodedHere = 0;
          this.notice.clearWarning();
        },
        onLost: (reason) => this.onLost(reason),
      });
    } catch (error) {
      this.notice.show(error.message);
      this.status("Not connected.");
      this.phase = "idle";
      this.refresh();
      return;
    }
    if (this.phase !== "connecting") {
      this.close(); // stopped while connecting
      return;
    }
    this.phase = "generating";
    this.refresh();
    this.status("Starting…");
    this.session.send({ type: "session.start", ...request });
    this.timer = setInterval(() => this.updateProgress(), PROGRESS_INTERVAL_MS);
  }

  stop() {
    if (this.session && this.started && !this.done) {
      this.session.send({ type: "session.stop" });
      this.status("Stopping…");
    } else {
      this.close();
      this.phase = "idle";
      this.refresh();
      this.status("Stopped before the generation began.");
    }
  }

  changePrompt() {
    const input = $("gen-new-prompt");
    const prompt = input.value.trim();
    if (!prompt || !this.session) return;
    const eventId = `prompt-${Date.now().toString(36)}`;
    // Sent explicitly: left out, vLLM-Omni blends over 3 chunks, longer than a short generation.
    const transition = Math.max(0, parseInt($("gen-transition").value, 10) || 0);
    const interaction = { event_id: eventId, event: { prompt }, transition_chunks: transition };
    this.session.send({ type: "session.interaction", interaction });
    this.log(`Prompt change sent: “${prompt}”`, eventId);
    input.value = "";
    this.refresh();
  }

  onMessage(message) {
    switch (message.type) {
      case "video.start": {
        this.started = true;
        const config = message.config || {};
        if (config.num_frames) this.requested = config.num_frames;
        const size = config.size || (config.width && config.height ? `${config.width}x${config.height}` : "default size");
        const frames = this.requested ? `${this.requested} frames` : "the default number of frames";
        this.status(`Generating ${frames} of ${size} at ${config.fps || "default"} fps…`);
        this.log(`Started ${message.request_id}`);
        break;
      }
      case "video.chunk_metadata":
        this.generated = message.last_frame_index + 1;
        if (!this.chunkFrames) this.chunkFrames = message.num_frames;
        if (this.engineFinished) this.status(`All ${this.generated} frames generated; playing them…`);
        this.log(`Chunk ${message.generation_chunk_index}: frames ${message.first_frame_index}–${message.last_frame_index}`);
        for (const id of message.started_event_ids || []) this.mark(id, `applied from chunk ${message.generation_chunk_index}`);
        break;
      case "session.interaction.queued": {
        const chunks = this.requested && this.chunkFrames ? Math.ceil(this.requested / this.chunkFrames) : 0;
        const late = chunks && message.apply_from_chunk >= chunks ? ", after the last one: it will not show" : "";
        this.mark(message.event_id, `acknowledged: applies from chunk ${message.apply_from_chunk}${late}`);
        break;
      }
      case "session.done":
        this.onDone(message);
        break;
      case "error":
        this.onError(message);
        break;
      default:
        break;
    }
    this.refresh();
  }

  onError(message) {
    const text = message.message || "unknown error";
    if (message.event_id) this.mark(message.event_id, `refused: ${text}`);
    this.notice.show(`Server error: ${text}`);
    if (message.code === "interaction_failed" && this.started && this.requested === 0) {
      // With the engine's default length the page cannot tell when it finished; the refusal says so.
      this.requested = this.generated;
    }
    if (!this.started) {
      // The generation never began (a bad request): end this attempt, keep the form for a fix.
      this.close();
      this.phase = "idle";
      this.status("Not started. Fix the request and press Generate again.");
    }
  }

  onDone(message) {
    this.done = message;
    this.phase = "draining";
    const how = message.stopped ? "Stopped" : "Done";
    this.status(`${how}: the server sent ${message.frames} frames in ${message.chunks} chunks.`);
    this.log(`session.done: ${message.frames} frames, ${message.chunks} chunks${message.stopped ? ", stopped" : ""}`);
    if (this.form.elements.record.checked && message.frames > 0) this.offerRecording();
    setTimeout(() => this.finish(), DRAIN_AFTER_DONE_MS);
  }

  /** After the last frames drained: stop polling, keep the peer so the last frame stays on screen. */
  finish() {
    this.updateProgress();
    clearInterval(this.timer);
    this.timer = null;
    this.phase = "finished";
    this.refresh();
  }

  async offerRecording() {
    try {
      const blob = await fetchRecording(this.session.sessionId, this.session.sessionToken);
      if (this.downloadUrl) URL.revokeObjectURL(this.downloadUrl);
      this.downloadUrl = URL.createObjectURL(blob);
      const link = $("gen-download-link");
      link.href = this.downloadUrl;
      link.download = `rtc-omni-${this.session.sessionId}.mp4`;
      link.textContent = `Download the recording (MP4, ${Math.max(1, Math.round(blob.size / 1024))} KB)`;
      $("gen-download").hidden = false;
    } catch (error) {
      this.notice.show(`The recording is not available: ${error.message}`);
    }
  }

  async updateProgress() {
    if (!this.session) return;
    let decodedHere = 0;
    const pc = this.session.pc;
    const report = await pc.getStats();
    report.forEach((stat) => {
      if (stat.type === "inbound-rtp" && stat.kind === "video") {
        decodedHere = stat.framesDecoded || 0;
        if (stat.frameWidth) this.frameSize = `${stat.frameWidth}x${stat.frameHeight}`;
      }
    });
    if (!this.session || pc !== this.session.pc) return; // resumed meanwhile: the next poll reads the new one
    this.decodedHere = decodedHere;
    const decoded = this.decodedBefore + decodedHere;
    // The server repeats the last frame once (uncounted) so that it shows: do not count it.
    this.framesDecoded = this.requested ? Math.min(decoded, this.requested) : decoded;
    const progress = $("gen-progress");
    progress.max = this.requested || Math.max(decoded, 1);
    progress.value = this.framesDecoded;
    const of = this.requested ? ` of ${this.requested}` : "";
    const generated = this.generated ? ` · generated ${this.generated}` : "";
    $("gen-progress-text").textContent = `${this.framesDecoded}${of}${generated}`;
  }

  onLost(reason) {
    this.notice.show(`The connection to the server failed: ${reason}. Press Generate to try again.`);
    this.close();
    this.phase = "idle";
    this.refresh();
    this.status("Connection failed.");
  }

  close() {
    clearInterval(this.timer);
    this.timer = null;
    if (this.session) this.session.close();
    this.session = null;
  }

  reset() {
    this.started = false;
    this.done = null;
    this.generated = 0;
    this.chunkFrames = 0;
    this.framesDecoded = 0;
    this.decodedBefore = 0;
    this.decodedHere = 0;
    this.video.srcObject = null;
    $("gen-events").replaceChildren();
    $("gen-download").hidden = true;
    $("gen-progress").value = 0;
    $("gen-progress-text").textContent = "–";
  }

  status(text) {
    $("gen-status").textContent = text;
  }

  log(text, eventId) {
    const item = document.createElement("li");
    item.textContent = text;
    if (eventId) {
      item.dataset.eventId = eventId;
      const state = document.createElement("span");
      state.className = "state";
      state.textContent = " (sent)";
      item.append(state);
    }
    $("gen-events").append(item);
  }

  mark(eventId, text) {
    const item = $("gen-events").querySelector(`[data-event-id="${CSS.escape(eventId)}"]`);
    if (item) item.querySelector(".state").textContent = ` (${text})`;
  }
}
