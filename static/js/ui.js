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

  /** Clear a warning, whose cause has passed; an error stays until dismissed. */
  clearWarning() {
    if (this.box.dataset.level === "warning") this.clear();
  }
}

/** Set an element's text only when it changes: views refresh often, and screen readers follow live text. */
export function setText(element, text) {
  if (element.textContent !== text) element.textContent = text;
}

/** An inline SVG icon from the page's sprite (`<symbol id=...>`), hidden from screen readers. */
export function icon(id) {
  const parser = document.createElement("template"); // the HTML parser puts <svg> in the SVG namespace
  parser.innerHTML = `<svg class="icon" aria-hidden="true" focusable="false"><use href="#${id}"></use></svg>`;
  return parser.content.firstElementChild;
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
