import { OpenAIRealtimeWebRTC, RealtimeAgent, RealtimeSession, tool } from "@openai/agents-realtime";
import { z } from "zod";

const getWeather = tool({
  name: "get_weather",
  description: "The current temperature in a city.",
  parameters: z.object({ city: z.string() }),
  execute: async ({ city }) => "22C",
});

const agent = new RealtimeAgent({
  name: "Assistant",
  instructions: "You are a brief, friendly assistant.",
  tools: [getWeather],
});

// serverUrl: where rtc-omni serves, e.g. "http://127.0.0.1:8080". transportOptions: the WebRTC
// transport's own, e.g. { mediaStream } to choose the microphone.
export function agentSession(serverUrl, transportOptions = {}) {
  return new RealtimeSession(agent, {
    transport: new OpenAIRealtimeWebRTC({ baseUrl: `${serverUrl}/v1/realtime/calls`, ...transportOptions }),
    model: "qwen3-omni",
  });
}
