// What both pages share: the API key kept in localStorage, JSON requests with the server's
// error messages, a message as the pages show it, and a reply's cache figures.
"use strict";

const POLL_MS = 1500;  // how often a page asks for what a person on the other side wrote

function keyField(input, storageName, onChange) {
  // The key lives in localStorage, so a reload does not ask again; never in the URL.
  input.value = localStorage.getItem(storageName) || "";
  input.addEventListener("change", () => { localStorage.setItem(storageName, input.value.trim()); onChange(); });
  return () => input.value.trim();
}

class ApiError extends Error {
  constructor(status, message, code) { super(message); this.status = status; this.code = code; }
}

async function api(key, path, options = {}) {
  // The parsed JSON answer; an ApiError carrying the server's own message otherwise.
  const headers = { "Content-Type": "application/json" };
  if (key) headers["Authorization"] = "Bearer " + key;
  const response = await fetch(path, { ...options, headers });
  if (!response.ok) throw await apiError(response);
  return response.status === 204 ? null : response.json();
}

async function apiError(response) {
  let message = response.status + " " + response.statusText, code = null;
  try { const body = await response.json(); message = body.error.message; code = body.error.code; } catch (e) { /* not JSON */ }
  return new ApiError(response.status, message, code);
}

function sessionPath(id, tail = "") {
  return "/v1/sessions/" + encodeURIComponent(id) + tail;
}

function speaker(message) {
  // Who wrote a message, in the words a reader needs: a person's reply says so.
  if (message.role === "user") return { kind: "user", label: "You" };
  if (message.agent) return { kind: "agent", label: message.agent + " · from our team" };
  return { kind: "bot", label: "Assistant" };
}

function messageNode(message, you = "You") {
  // One message as an article: who wrote it, then its text (Markdown for replies, plain for
  // what a customer typed, which is shown exactly as typed).
  const who = speaker(message);
  const article = document.createElement("article");
  article.className = "msg " + who.kind;
  const label = who.kind === "user" ? you : who.label;
  article.setAttribute("aria-label", label);
  const name = article.appendChild(document.createElement("div"));
  name.className = "who";
  name.textContent = label;
  const bubble = article.appendChild(document.createElement("div"));
  bubble.className = "bubble";
  fillBubble(bubble, message);
  return article;
}

function fillBubble(bubble, message) {
  bubble.textContent = "";
  if (message.role === "user") {
    bubble.classList.add("plain");
    bubble.textContent = message.content;
  } else {
    bubble.appendChild(renderMarkdown(message.content));
  }
}

function figuresText(served) {
  // The per-turn figures of the terminal app's cache panel: what chatcache is for.
  if (!served || !served.tier) return "";
  const parts = ["served by " + served.tier];
  if (served.answer_cache_hit) parts.push("answer cache hit");
  if (typeof served.ttft_s === "number") parts.push("first token " + Math.round(served.ttft_s * 1000) + " ms");
  if (served.reused_tokens !== undefined) parts.push(served.reused_tokens + " tokens reused, " + served.prefilled_tokens + " prefilled");
  if (served.generated_tokens) parts.push(served.generated_tokens + " generated");
  if (served.drafted_tokens) parts.push(served.accepted_tokens + " of " + served.drafted_tokens + " drafted tokens kept");
  if (served.finish_reason === "length") parts.push("cut at the length limit");
  if (served.drift) parts.push("topic changed");
  if (served.intent) parts.push("intent " + served.intent);
  return parts.join(" · ");
}

function figuresNode(served) {
  const div = document.createElement("div");
  div.className = "figures";
  div.textContent = figuresText(served);
  return div;
}

function when(iso) {
  const date = new Date(iso.endsWith("Z") || iso.includes("+") ? iso : iso + "Z");
  return date.toLocaleString([], { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit" });
}
