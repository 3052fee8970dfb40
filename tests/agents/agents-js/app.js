// The test's page around agent.js (docs/frameworks/agents-js.md's example, verbatim): it shows the
// conversation as the SDK keeps it (history_updated), which is what tests/browser/test_agents_js.py reads.
import { agentSession } from "./agent.js";

function textOf(item) {
  if (item.type === "function_call") return `${item.name}(${item.arguments}) -> ${item.output ?? "..."}`;
  return (item.content ?? []).map((part) => part.text ?? part.transcript ?? "").join(" ");
}

function render(history) {
  const list = document.getElementById("history");
  list.replaceChildren(
    ...history.map((item) => {
      const entry = document.createElement("li");
      entry.dataset.role = item.role ?? item.type;
      entry.textContent = textOf(item);
      return entry;
    }),
  );
}

window.agentApp = {
  events: [], // the type of every server event the SDK saw, in order: a failing test prints them
  errors: [],
  toolResults: [], // [arguments, result] of each tool call the SDK ran
  session: null,
  // serverUrl and apiKey: what the app's backend hands the page (the key minted at client_secrets).
  async connect({ serverUrl, apiKey }) {
    // The microphone starts muted, as behind a talk button: session.mute(false) opens it.
    const microphone = await navigator.mediaDevices.getUserMedia({ audio: true });
    microphone.getAudioTracks()[0].enabled = false;
    const session = agentSession(serverUrl, { mediaStream: microphone });
    session.on("history_updated", render);
    session.on("transport_event", (event) => this.events.push(event.type));
    session.on("error", (event) => this.errors.push(JSON.stringify(event.error?.error ?? event.error ?? event)));
    session.on("agent_tool_end", (context, agent, tool, result, { toolCall }) =>
      this.toolResults.push([toolCall.arguments, result]),
    );
    await session.connect({ apiKey });
    session.mute(true); // the SDK's own state agrees with the muted track
    this.session = session;
    document.getElementById("state").textContent = "connected";
  },
};
