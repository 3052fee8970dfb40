// Small DOM helpers shared by the views.

export const $ = (id) => document.getElementById(id);

/** A dismissable message box (role="alert") for errors the user must see. */
export class Notice {
  constructor(id) {
    this.box = $(id);
    this.text = $(`${id}-text`);
    this.box.querySelector(".dismiss").addEventListener("click", () => this.clear());
  }

  show(message, level = "error") {
    this.text.textContent = message;
    this.box.dataset.level = level;
    this.box.hidden = false;
  }

  clear() {
    this.box.hidden = true;
    this.text.textContent = "";
  }
}

export function seconds(ms) {
  return ms == null ? "–" : `${(ms / 1000).toFixed(2)} s`;
}

/** A user-facing sentence for a getUserMedia failure. */
export function mediaErrorMessage(error) {
  switch (error && error.name) {
    case "NotAllowedError":
    case "SecurityError":
      return "Camera or microphone access was refused. Allow both for this page in the browser's site settings, then connect again.";
    case "NotFoundError":
    case "OverconstrainedError":
      return "No camera or microphone was found. Connect one and try again.";
    case "NotReadableError":
      return "The camera or microphone is in use by another application, or failed to start.";
    default:
      if (!navigator.mediaDevices) {
        return "This page cannot use the camera here: browsers allow it only on https:// or http://localhost pages.";
      }
      return `Could not open the camera and microphone: ${error && error.message ? error.message : error}`;
  }
}
