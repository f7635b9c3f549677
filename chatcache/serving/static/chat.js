// The customer's page. It keeps its session id (and the API key, when the server needs one) in
// localStorage, so a reload shows the conversation; replies stream from
// POST /v1/sessions/{id}/messages as chat.completion.chunk events, and Stop or Escape aborts
// the request, which ends the turn on the server with what was generated so far. Once the bot
// has handed the conversation to a person, the page polls the session for their replies: a
// poll works behind any load balancer and across replicas, where a held-open stream would
// need the one replica the person happens to write through.
"use strict";

const log = document.getElementById("log");
const input = document.getElementById("message");
const sendButton = document.getElementById("send");
const stopButton = document.getElementById("stop");
const figuresButton = document.getElementById("show-figures");
const settings = document.getElementById("settings");
const key = keyField(document.getElementById("api-key"), "chatcache.key", () => { settings.open = false; start(); });

let sessionId = null;
let shownCount = 0;  // how many of the session's stored messages the log shows
let handedOff = false;
let turn = null;  // the AbortController of the reply streaming now

function showError(message) {
  const error = document.getElementById("error");
  error.textContent = message;
  error.hidden = !message;
}

function scrollDown() {
  log.scrollTop = log.scrollHeight;
}

function render(session) {
  // The whole conversation as the server recorded it: the one truth after every turn and poll.
  const title = session.title || "New conversation";
  document.getElementById("title").textContent = title;
  document.title = title;
  log.textContent = "";
  for (const message of session.messages) {
    log.appendChild(messageNode(message));
    if (message.role === "assistant" && !message.agent && message.served) log.appendChild(figuresNode(message.served));
  }
  shownCount = session.messages.length;
  handedOff = session.handed_off;
  document.getElementById("handoff").hidden = !handedOff;
  scrollDown();
}

async function sync() {
  render(await api(key(), sessionPath(sessionId)));
}

async function start() {
  sendButton.disabled = true;
  showError("");
  log.textContent = "";
  sessionId = localStorage.getItem("chatcache.session");
  try {
    if (sessionId) {
      try {
        await sync();
      } catch (error) {
        if (error.status !== 404) throw error;
        sessionId = null;  // gone (expired, deleted): start another
      }
    }
    if (!sessionId) {
      const session = await api(key(), "/v1/sessions", { method: "POST", body: "{}" });
      sessionId = session.id;
      localStorage.setItem("chatcache.session", sessionId);
      render({ ...session, messages: [] });
    }
    log.dataset.session = sessionId;  // tests and support read which session the page shows
    sendButton.disabled = false;  // only once the session exists
  } catch (error) {
    showError(error.message);
    if (error.status === 401) {  // this server needs a key: ask for it where it is typed
      settings.open = true;
      document.getElementById("api-key").focus();
    }
  }
}

async function send(text) {
  log.appendChild(messageNode({ role: "user", content: text }));
  const reply = messageNode({ role: "assistant", content: "" });
  reply.setAttribute("aria-busy", "true");
  log.appendChild(reply);
  scrollDown();
  turn = new AbortController();
  stopButton.hidden = false;
  let received = "", stopped = false;
  try {
    const response = await fetch(sessionPath(sessionId, "/messages"), {
      method: "POST", signal: turn.signal,
      headers: { "Content-Type": "application/json", ...(key() ? { Authorization: "Bearer " + key() } : {}) },
      body: JSON.stringify({ content: text, stream: true }),
    });
    if (!response.ok) throw await apiError(response);
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const line = buffer.slice(0, end).trim();
        buffer = buffer.slice(end + 2);
        if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
        const event = JSON.parse(line.slice(6));
        if (event.error) throw new Error(event.error.message);
        const delta = event.choices && event.choices[0] ? event.choices[0].delta : {};
        if (delta.content) {
          received += delta.content;
          fillBubble(reply.querySelector(".bubble"), { role: "assistant", content: received });
          scrollDown();
        }
      }
    }
  } catch (error) {
    stopped = error.name === "AbortError";
    if (!stopped) showError(error.message);
  } finally {
    turn = null;
    stopButton.hidden = true;
    reply.removeAttribute("aria-busy");
  }
  try {
    await sync();  // the record: the title, a handoff, a person's reply
    // A stopped reply is recorded once the server notices the request went away, a moment later.
    for (let tries = 0; stopped && tries < 20 && !repliedLast(); tries++) {
      await new Promise((resolve) => setTimeout(resolve, 250));
      await sync();
    }
  } catch (error) {
    showError(error.message);
  }
}

function repliedLast() {
  const last = log.querySelector("article.msg:last-of-type");
  return last !== null && !last.classList.contains("user");
}

function stop() {
  if (turn) turn.abort();
}

document.getElementById("composer").addEventListener("submit", async (event) => {
  event.preventDefault();
  const text = input.value.trim();
  if (!text || turn || sendButton.disabled) return;
  input.value = "";
  input.style.height = "";
  showError("");
  sendButton.disabled = true;
  try { await send(text); } finally { sendButton.disabled = false; input.focus(); }
});
input.addEventListener("keydown", (event) => {
  // Enter sends, Shift+Enter is a new line (and Enter while an input method composes is its own).
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    document.getElementById("composer").requestSubmit();
  }
});
input.addEventListener("input", () => {
  input.style.height = "";
  input.style.height = Math.min(input.scrollHeight, 160) + "px";
});
document.addEventListener("keydown", (event) => {
  if (event.key === "Escape" && turn) { event.preventDefault(); stop(); }
});
stopButton.addEventListener("click", stop);

function showFigures(on) {
  document.body.classList.toggle("show-figures", on);
  figuresButton.setAttribute("aria-pressed", String(on));
  localStorage.setItem("chatcache.figures", on ? "1" : "");
}
figuresButton.addEventListener("click", () => showFigures(figuresButton.getAttribute("aria-pressed") !== "true"));
showFigures(localStorage.getItem("chatcache.figures") === "1");

document.getElementById("rename").addEventListener("click", async () => {
  // An empty name goes back to none; the list of conversations then shows the session's id.
  const title = prompt("Name this conversation", document.getElementById("title").textContent);
  if (title === null || !sessionId) return;
  try {
    await api(key(), sessionPath(sessionId), { method: "PATCH", body: JSON.stringify({ title: title.trim() || null }) });
    await sync();
  } catch (error) { showError(error.message); }
});

document.getElementById("new-session").addEventListener("click", () => {
  stop();
  localStorage.removeItem("chatcache.session");
  start();
});

setInterval(async () => {
  // While a person has the conversation: their replies, and the moment they hand it back.
  if (!handedOff || turn || !sessionId) return;
  try {
    const session = await api(key(), sessionPath(sessionId));
    if (session.messages.length !== shownCount || session.handed_off !== handedOff) render(session);
  } catch (error) { /* the next poll tries again */ }
}, POLL_MS);

start();
