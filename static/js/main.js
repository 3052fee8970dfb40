// Entry point: tabs, the access token, and the two views.

import { setToken } from "./api.js";
import { GenerateView } from "./generate.js";
import { resumeCount } from "./rtc.js";
import { TalkView } from "./talk.js";
import { $ } from "./ui.js";

function setupTabs() {
  const tabs = [...document.querySelectorAll('[role="tab"]')];
  function select(tab, focus) {
    for (const other of tabs) {
      const selected = other === tab;
      other.setAttribute("aria-selected", String(selected));
      other.tabIndex = selected ? 0 : -1;
      $(other.getAttribute("aria-controls")).hidden = !selected;
    }
    if (focus) tab.focus();
  }
  tabs.forEach((tab, index) => {
    tab.addEventListener("click", () => select(tab, false));
    tab.addEventListener("keydown", (event) => {
      const step = { ArrowRight: 1, ArrowLeft: -1 }[event.key];
      if (step) {
        event.preventDefault();
        select(tabs[(index + step + tabs.length) % tabs.length], true);
      } else if (event.key === "Home" || event.key === "End") {
        event.preventDefault();
        select(tabs[event.key === "Home" ? 0 : tabs.length - 1], true);
      }
    });
  });
}

function setupToken() {
  const input = $("token");
  const saved = sessionStorage.getItem("rtc-omni-token") || "";
  input.value = saved;
  setToken(saved);
  input.addEventListener("input", () => {
    setToken(input.value);
    sessionStorage.setItem("rtc-omni-token", input.value.trim());
  });
}

setupTabs();
setupToken();
// At phone width the settings start folded, so the conversation is one scroll away.
if (window.matchMedia("(max-width: 760px)").matches) document.querySelector("details.settings").open = false;
// Exposed for debugging from the console (and for the browser tests).
window.rtcOmni = {
  talk: new TalkView(),
  generate: new GenerateView(),
  get resumes() {
    return resumeCount(); // sessions resumed on a new connection after a network change
  },
};
