// HTTP side of the server: auth header, ICE servers, the offer, session stats, the recording.
// Every URL is relative to the page, so the client also works behind a path prefix.

let token = "";

export function setToken(value) {
  token = value.trim();
}

function headers(extra = {}, bearer = token) {
  return bearer ? { ...extra, Authorization: `Bearer ${bearer}` } : extra;
}

function url(path) {
  return new URL(path, document.baseURI).toString();
}

/** The server's reason, in words; `status` is the HTTP status (0: no answer), which says whether to try again. */
export class ServerError extends Error {
  constructor(message, status = 0, code = null) {
    super(message);
    this.status = status;
    this.code = code; // the refusal's `code`, where the server gave one (a resume's)
  }
}

/** Why a response failed, as a ServerError: the server's JSON `error` if it sent one. */
async function failure(response, prefix = "") {
  let detail = response.statusText;
  let code = null;
  try {
    const body = await response.json();
    detail = body && body.error ? body.error : JSON.stringify(body);
    code = body && typeof body.code === "string" ? body.code : null;
  } catch {
    // not JSON: the status line says it
  }
  const hint = response.status === 401 || response.status === 403 ? " Check the access token." : "";
  return new ServerError(`${prefix}${detail} (HTTP ${response.status}).${hint}`, response.status, code);
}

/**
 * The server's ICE facts from `/v1/ice-servers` when it has that endpoint: `iceServers` (none: loopback,
 * LAN) and `loopbackOnly`, true when the server says its own ICE gathers on loopback only.
 */
export async function iceConfig(timeoutMs = 3000) {
  const none = { iceServers: [], loopbackOnly: false };
  try {
    const response = await fetch(url("v1/ice-servers"), {
      headers: headers(),
      signal: AbortSignal.timeout(timeoutMs),
    });
    if (!response.ok || !(response.headers.get("content-type") || "").includes("json")) return none;
    const body = await response.json();
    const list = Array.isArray(body) ? body : body.iceServers || body.ice_servers || [];
    return { iceServers: Array.isArray(list) ? list : [], loopbackOnly: body.ice_loopback_only === true };
  } catch {
    return none;
  }
}

/**
 * POST the offer with `fields` (`kind`; for a resume also `session_id`, `resume_token` ...: docs/browser.md);
 * returns {sdp, type, session_id, session_token, view_token, resume_token, resume_grace_s} or throws
 * ServerError with the server's reason. The session token opens the session's own URLs below (docs/operations.md).
 */
export async function postOffer(sdp, fields, timeoutMs = 15000) {
  let response;
  try {
    response = await fetch(url("v1/rtc/offer"), {
      method: "POST",
      headers: headers({ "Content-Type": "application/json" }),
      body: JSON.stringify({ sdp, type: "offer", ...fields }),
      signal: AbortSignal.timeout(timeoutMs),
    });
  } catch (error) {
    if (error.name === "TimeoutError") throw new ServerError(`The server did not answer within ${timeoutMs / 1000} s.`);
    throw new ServerError(`Could not reach the server: ${error.message}`);
  }
  const what = fields.kind === "resume" ? "to resume the session" : "the session";
  if (!response.ok) throw await failure(response, `The server refused ${what}: `);
  return response.json();
}

/** The server's stats for a session (GET /v1/rtc/sessions/{id}), or null when unavailable. */
export async function sessionStats(sessionId, sessionToken) {
  try {
    const response = await fetch(url(`v1/rtc/sessions/${encodeURIComponent(sessionId)}`), {
      headers: headers({}, sessionToken),
      signal: AbortSignal.timeout(3000),
    });
    return response.ok ? await response.json() : null;
  } catch {
    return null;
  }
}

/** End a session on the server (best effort: closing the peer connection ends it too). */
export async function deleteSession(sessionId, sessionToken) {
  try {
    await fetch(url(`v1/rtc/sessions/${encodeURIComponent(sessionId)}`), {
      method: "DELETE",
      headers: headers({}, sessionToken),
      signal: AbortSignal.timeout(3000),
    });
  } catch {
    // the server closes the session when the peer connection goes away
  }
}

/** The session's MP4 recording as a Blob; throws ServerError when there is none. */
export async function fetchRecording(sessionId, sessionToken) {
  const response = await fetch(url(`v1/rtc/sessions/${encodeURIComponent(sessionId)}/recording`), {
    headers: headers({}, sessionToken),
    signal: AbortSignal.timeout(30000),
  });
  if (!response.ok) throw await failure(response);
  return response.blob();
}
