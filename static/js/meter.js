// Audio level meters: a Web Audio AnalyserNode on a stream, shown as a bar (role="meter").
// The Talk view reads the talker's level to tell when the answer is audible.

// Below this the bar is empty; 0 dBFS fills it.
const FLOOR_DB = -60;
// Louder than this counts as sound (speech, a tone); decoded Opus silence sits far below it.
const AUDIBLE_DB = -45;

let context = null;

/** One AudioContext for the page, created (or resumed) from a click so autoplay rules allow it. */
export function audioContext() {
  if (!context) context = new AudioContext();
  if (context.state === "suspended") context.resume();
  return context;
}

export class LevelMeter {
  constructor(element) {
    this.element = element;
    this.bar = element.querySelector(".bar");
    this.source = null;
    this.analyser = null;
    this.samples = null;
    this.db = -Infinity;
  }

  /** Measure `stream` (its first audio track) from now on; null stops measuring. */
  attach(stream) {
    this.detach();
    if (!stream || stream.getAudioTracks().length === 0) return;
    const audio = audioContext();
    this.source = audio.createMediaStreamSource(stream);
    this.analyser = audio.createAnalyser();
    this.analyser.fftSize = 1024;
    this.samples = new Float32Array(this.analyser.fftSize);
    this.source.connect(this.analyser); // not to the speakers: the page plays the talker itself
  }

  detach() {
    if (this.source) this.source.disconnect();
    this.source = null;
    this.analyser = null;
    this.db = -Infinity;
    this.show();
  }

  /** Read the level now (RMS of the last ~20 ms, in dBFS) and update the bar. */
  update() {
    if (!this.analyser) return;
    this.analyser.getFloatTimeDomainData(this.samples);
    let sum = 0;
    for (const sample of this.samples) sum += sample * sample;
    this.db = 10 * Math.log10(sum / this.samples.length || 1e-12);
    this.show();
  }

  get audible() {
    return this.db > AUDIBLE_DB;
  }

  show() {
    const fraction = Math.min(1, Math.max(0, (this.db - FLOOR_DB) / -FLOOR_DB));
    this.bar.style.transform = `scaleX(${fraction})`;
    this.element.setAttribute("aria-valuenow", String(Math.round(fraction * 100)));
  }
}
