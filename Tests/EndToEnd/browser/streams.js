// A page's own client of the gateway's browser protocols (Tests/EndToEnd/test_browser_protocols.py):
// fetch() with a streaming body reader, protobuf and gRPC-Web frames encoded by hand, no library.
// The gateway's address comes from ?gateway=...; the page is served from another origin, so every
// call below is a cross-origin request (with a CORS preflight, none of the content types or headers
// used here being CORS-safelisted). Selenium drives it through window.demo and reads window.pageState.
"use strict";

const GATEWAY = new URLSearchParams(location.search).get("gateway");
const pageState = { token: null, username: null, streams: {} };
window.pageState = pageState;
document.getElementById("origin").textContent = `page ${location.origin} → gateway ${GATEWAY}`;

function log(text, cls) {
  const li = document.createElement("li");
  li.textContent = text;
  li.className = cls || "note";
  document.getElementById("log").appendChild(li);
}

// A 5-byte-prefixed frame (gRPC-Web message, Connect envelope): flags, big-endian length, payload.
function frame(payload, flags = 0) {
  const out = new Uint8Array(5 + payload.length);
  out[0] = flags;
  new DataView(out.buffer).setUint32(1, payload.length);
  out.set(payload, 5);
  return out;
}

// Complete frames out of a byte stream that arrives in arbitrary pieces.
class Framer {
  constructor() { this.buf = new Uint8Array(0); }
  push(bytes) {
    const b = new Uint8Array(this.buf.length + bytes.length);
    b.set(this.buf);
    b.set(bytes, this.buf.length);
    this.buf = b;
    const out = [];
    while (this.buf.length >= 5) {
      const len = new DataView(this.buf.buffer, this.buf.byteOffset).getUint32(1);
      if (this.buf.length < 5 + len) break;
      out.push({ flags: this.buf[0], payload: this.buf.slice(5, 5 + len) });
      this.buf = this.buf.slice(5 + len);
    }
    return out;
  }
}

// gRPC-Web text responses: base64, each frame its own padded chunk, so whole 4-character groups
// can be decoded as they come (a group never spans two chunks).
class Base64Stream {
  constructor() { this.pending = ""; }
  push(text) {
    this.pending += text.replace(/\s/g, "");
    const n = this.pending.length - (this.pending.length % 4);
    const bytes = [];
    for (let i = 0; i < n; i += 4) {
      for (const c of atob(this.pending.slice(i, i + 4))) bytes.push(c.charCodeAt(0));
    }
    this.pending = this.pending.slice(n);
    return Uint8Array.from(bytes);
  }
}

const latin1 = (bytes) => Array.from(bytes, (b) => String.fromCharCode(b)).join("");

// The trailers frame's block: "name: value\r\n" lines.
function parseTrailers(bytes) {
  const t = {};
  for (const line of latin1(bytes).split("\r\n")) {
    const i = line.indexOf(":");
    if (i > 0) t[line.slice(0, i).trim().toLowerCase()] = line.slice(i + 1).trim();
  }
  return t;
}

async function signUp(username) {
  const r = await fetch(`${GATEWAY}/accounts.v1.Accounts/SignUp`, {
    method: "POST",
    headers: { "content-type": "application/json", "connect-protocol-version": "1" },
    body: JSON.stringify({ username, email: `${username}@example.com`, password: "correct horse battery staple", displayName: `Browser ${username}` }),
  });
  const body = await r.json();
  if (!r.ok) throw new Error(`SignUp: HTTP ${r.status} ${JSON.stringify(body)}`);
  pageState.token = body.session.accessToken;
  pageState.username = username;
  pageState.userId = body.user.userId;
  log(`signed up as ${username} (Connect JSON, POST)`, "ok");
  return { userId: body.user.userId, username };
}

// Connect's GET form (GetMyProfile is marked NO_SIDE_EFFECTS); the authorization header makes the
// browser ask with a preflight for GET.
async function getMyProfile() {
  const r = await fetch(`${GATEWAY}/accounts.v1.Accounts/GetMyProfile?encoding=json&message=${encodeURIComponent("{}")}`, {
    headers: { authorization: `Bearer ${pageState.token}` },
  });
  const body = await r.json();
  log(`GetMyProfile (Connect GET): HTTP ${r.status}, ${body.user ? body.user.username : JSON.stringify(body)}`, r.ok ? "ok" : "err");
  return { status: r.status, username: body.user ? body.user.username : null };
}

function newStream(name, protocol) {
  const s = { name, protocol, httpStatus: null, contentType: null, started: false, messages: [], notifications: [], end: null, error: null };
  pageState.streams[name] = s;
  return s;
}

// A server stream with gRPC-Web (binary or text), social.v1.Social/SubscribeNotifications unless
// another path is given. Resolves once the first message (for notifications: `started`, field 1)
// has arrived; reading goes on in the background. Every message is kept (base64) in s.messages.
async function openGrpcWeb(name, text, path = "/social.v1.Social/SubscribeNotifications") {
  const s = newStream(name, text ? "grpc-web-text" : "grpc-web");
  const controller = new AbortController();
  s.abort = () => controller.abort();
  const request = frame(new Uint8Array(0)); // SubscribeNotificationsRequest {}, JoinQueueRequest {}: empty messages
  const r = await fetch(`${GATEWAY}${path}`, {
    method: "POST",
    signal: controller.signal,
    headers: {
      "content-type": text ? "application/grpc-web-text" : "application/grpc-web+proto",
      accept: text ? "application/grpc-web-text" : "application/grpc-web+proto",
      "x-grpc-web": "1",
      "x-user-agent": "streams.js/1",
      authorization: `Bearer ${pageState.token}`,
    },
    body: text ? btoa(latin1(request)) : request,
  });
  s.httpStatus = r.status;
  s.contentType = r.headers.get("content-type");
  if (r.headers.get("grpc-status") !== null) { // trailers-only: the call ended before any message
    s.end = { status: Number(r.headers.get("grpc-status")), message: decodeURIComponent(r.headers.get("grpc-message") || "") };
    log(`${name}: ended at once, grpc-status ${s.end.status} ${s.end.message}`, "err");
    return s;
  }
  let resolveStarted;
  const started = new Promise((res) => { resolveStarted = res; });
  (async () => {
    const reader = r.body.getReader();
    const framer = new Framer();
    const b64 = new Base64Stream();
    const utf8 = new TextDecoder();
    try {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        const bytes = text ? b64.push(utf8.decode(value, { stream: true })) : value;
        for (const f of framer.push(bytes)) {
          if (f.flags & 0x80) {
            const t = parseTrailers(f.payload);
            s.end = { status: Number(t["grpc-status"]), message: decodeURIComponent(t["grpc-message"] || "") };
            log(`${name}: trailers, grpc-status ${s.end.status}`, "note");
          } else if (!s.started) { // the first message (notifications: `started`, field 1)
            s.started = true;
            s.messages.push(btoa(latin1(f.payload)));
            log(`${name}: stream started (${s.contentType}) on ${path}`, "ok");
            resolveStarted();
          } else if (f.payload[0] === 0x12) { // field 2: a notification; its bytes, as text, hold the actor's username
            s.notifications.push(latin1(f.payload));
            log(`${name}: notification frame of ${f.payload.length} bytes`, "ok");
          }
        }
      }
    } catch (e) {
      s.error = String(e);
    }
    resolveStarted();
  })();
  await started;
  return s;
}

// The same with the Connect protocol's streaming (application/connect+json): one enveloped JSON
// request, enveloped JSON messages, then the end-of-stream envelope (flag 0x02).
async function openConnect(name) {
  const s = newStream(name, "connect+json");
  const controller = new AbortController();
  s.abort = () => controller.abort();
  const r = await fetch(`${GATEWAY}/social.v1.Social/SubscribeNotifications`, {
    method: "POST",
    signal: controller.signal,
    headers: { "content-type": "application/connect+json", "connect-protocol-version": "1", authorization: `Bearer ${pageState.token}` },
    body: frame(new TextEncoder().encode("{}")),
  });
  s.httpStatus = r.status;
  s.contentType = r.headers.get("content-type");
  let resolveStarted;
  const started = new Promise((res) => { resolveStarted = res; });
  (async () => {
    const reader = r.body.getReader();
    const framer = new Framer();
    const utf8 = new TextDecoder();
    try {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        for (const f of framer.push(value)) {
          const message = JSON.parse(utf8.decode(f.payload));
          if (f.flags & 0x02) {
            s.end = message;
            log(`${name}: end of stream ${JSON.stringify(message)}`, message.error ? "err" : "note");
          } else if (message.started) {
            s.started = true;
            log(`${name}: stream started (${s.contentType})`, "ok");
            resolveStarted();
          } else if (message.notification) {
            s.notifications.push(message.notification);
            const n = message.notification;
            log(`${name}: ${n.kind} from ${n.actor ? n.actor.username : "?"}: ${n.title}`, "ok");
          }
        }
      }
    } catch (e) {
      s.error = String(e);
    }
    resolveStarted();
  })();
  await started;
  return s;
}

// Resolves when each of the named streams has a notification naming `username` (or after
// timeoutMs), with which did.
async function waitForNotifications(names, username, timeoutMs) {
  const seen = (s) => s.notifications.some((n) => (typeof n === "string" ? n.includes(username) : n.actor && n.actor.username === username));
  const streams = names.map((n) => pageState.streams[n]);
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (streams.every(seen)) break;
    await new Promise((r) => setTimeout(r, 50));
  }
  return Object.fromEntries(streams.map((s) => [s.name, seen(s)]));
}

// A unary call with gRPC-Web text (accounts.v1.Accounts/GetMyProfile): the message frame and the
// trailers frame, decoded by hand.
async function grpcWebUnary() {
  const r = await fetch(`${GATEWAY}/accounts.v1.Accounts/GetMyProfile`, {
    method: "POST",
    headers: { "content-type": "application/grpc-web-text", accept: "application/grpc-web-text", "x-grpc-web": "1", authorization: `Bearer ${pageState.token}` },
    body: btoa(latin1(frame(new Uint8Array(0)))),
  });
  const frames = new Framer().push(new Base64Stream().push(await r.text()));
  const trailers = frames.length ? parseTrailers(frames[frames.length - 1].payload) : {};
  const result = {
    httpStatus: r.status,
    flags: frames.map((f) => f.flags),
    grpcStatus: trailers["grpc-status"],
    hasUsername: frames.length > 0 && latin1(frames[0].payload).includes(pageState.username),
  };
  log(`GetMyProfile (gRPC-Web text, unary): frames ${JSON.stringify(result.flags)}, grpc-status ${result.grpcStatus}`, result.hasUsername ? "ok" : "err");
  return result;
}

// An upload over the method's limit, the whole body sent after the head (what fetch does): the
// page must read the refusal, not a network error (issue 35: net::ERR_CONNECTION_RESET before).
async function uploadTooLarge(bytes, withToken) {
  const headers = { "content-type": "application/grpc-web+proto", "x-grpc-web": "1" };
  if (withToken) headers.authorization = `Bearer ${pageState.token}`;
  const r = await fetch(`${GATEWAY}/accounts.v1.Accounts/UploadAvatar`, { method: "POST", headers, body: new Uint8Array(bytes) });
  await r.arrayBuffer();
  const result = { httpStatus: r.status, grpcStatus: r.headers.get("grpc-status"), grpcMessage: r.headers.get("grpc-message") };
  log(`UploadAvatar of ${bytes} bytes: HTTP ${result.httpStatus}, grpc-status ${result.grpcStatus}`, "ok");
  return result;
}

function closeAll() {
  for (const s of Object.values(pageState.streams)) if (s.abort) s.abort();
  log("streams closed by the page", "note");
}

// A call that a page from an origin the gateway does not list must not be able to make.
async function tryCall() {
  try {
    const r = await fetch(`${GATEWAY}/accounts.v1.Accounts/GetSigningKeys`, {
      method: "POST",
      headers: { "content-type": "application/grpc-web+proto", "x-grpc-web": "1" },
      body: frame(new Uint8Array(0)),
    });
    log(`call from ${location.origin}: HTTP ${r.status} (it should have been refused)`, "err");
    return { ok: true, status: r.status };
  } catch (e) {
    log(`call from ${location.origin} refused by the browser: ${e}`, "ok");
    return { ok: false, error: String(e) };
  }
}

// Selenium calls these through execute_async_script: run(name, args...) resolves with a plain value.
window.demo = {
  signUp, getMyProfile, grpcWebUnary, uploadTooLarge, openGrpcWeb, openConnect, waitForNotifications, closeAll, tryCall,
  run(fn, args, done) {
    Promise.resolve()
      .then(() => this[fn](...args))
      .then((v) => done({ value: v && v.name && v.protocol ? { name: v.name, started: v.started, end: v.end, httpStatus: v.httpStatus, contentType: v.contentType, first: v.messages[0] || null } : v }))
      .catch((e) => { log(`${fn} failed: ${e}`, "err"); done({ error: String(e) }); });
  },
};
log("page ready", "note");
