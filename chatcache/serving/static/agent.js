// The agents' console. With an agent's key (a customer's gets 403 from every call here) it
// polls the tenant's queue of handed-off conversations, newest first with their summaries;
// opening one shows the whole conversation, polled too, so the customer's new messages appear.
// Claiming is the server's compare-and-set: of two agents the second is told who has it.
// Replies and the hand-back go out under the name the agent's key names (shown, not editable);
// only an open server, with no keys, lets the agent type who they are.
"use strict";

const key = keyField(document.getElementById("api-key"), "chatcache.agent-key", refresh);
const nameInput = document.getElementById("agent-name");
nameInput.value = localStorage.getItem("chatcache.agent-name") || "";
nameInput.addEventListener("change", () => { localStorage.setItem("chatcache.agent-name", nameInput.value.trim()); refresh(); });
const queue = document.getElementById("queue");
const log = document.getElementById("log");
const input = document.getElementById("message");

let openId = null;
let open = null;  // the open session as last read
let queueShown = "";  // what the queue list shows, to leave it (and its focus) alone when nothing changed

function me() {
  return nameInput.value.trim();
}

function showError(message) {
  const error = document.getElementById("error");
  error.textContent = message;
  error.hidden = !message;
}

function queueItem(session) {
  const item = document.createElement("li");
  const button = item.appendChild(document.createElement("button"));
  button.type = "button";
  button.className = "item";
  button.dataset.session = session.id;
  if (session.id === openId) button.setAttribute("aria-current", "true");
  const title = button.appendChild(document.createElement("strong"));
  title.textContent = session.title || session.id;
  const meta = button.appendChild(document.createElement("span"));
  meta.className = "meta";
  meta.textContent = when(session.updated_at) + " · " + (session.claimed_by ? "with " + session.claimed_by : "waiting");
  const summary = button.appendChild(document.createElement("span"));
  summary.className = "summary";
  summary.textContent = session.handoff_summary || "";
  button.addEventListener("click", () => openSession(session.id));
  return item;
}

async function refreshQueue() {
  const answer = await api(key(), "/v1/agent/queue");
  if (answer.agent) nameInput.value = answer.agent;  // the key's person: the server acts under that name only
  nameInput.readOnly = Boolean(answer.agent);
  const sessions = answer.data;
  const shown = JSON.stringify([openId, sessions]);
  if (shown === queueShown) return;
  queueShown = shown;
  queue.textContent = "";
  for (const session of sessions) queue.appendChild(queueItem(session));
  document.getElementById("queue-empty").hidden = sessions.length > 0;
}

function renderOpen(session) {
  const changed = !open || open.id !== session.id || open.messages.length !== session.messages.length;
  open = session;
  document.getElementById("conversation").hidden = false;
  document.getElementById("conversation-title").textContent = session.title || session.id;
  document.getElementById("summary").textContent = session.handoff_summary || "";
  const mine = session.handed_off && session.claimed_by === me() && me() !== "";
  const status = !session.handed_off ? "Back with the bot."
    : mine ? "You have this conversation."
    : session.claimed_by ? session.claimed_by + " has this conversation."
    : "Waiting for someone to claim it.";
  document.getElementById("claim-status").textContent = status;
  document.getElementById("claim").disabled = !session.handed_off || mine;
  document.getElementById("hand-back").disabled = !mine;
  input.disabled = !mine;
  document.getElementById("send").disabled = !mine;
  if (changed) {
    log.textContent = "";
    for (const message of session.messages) log.appendChild(messageNode(message, "Customer"));
    log.scrollTop = log.scrollHeight;
  }
}

async function refreshOpen() {
  if (openId) renderOpen(await api(key(), sessionPath(openId)));
}

async function openSession(id) {
  openId = id;
  open = null;
  showError("");
  try {
    await refreshOpen();
    await refreshQueue();
    document.getElementById("conversation-title").focus();
  } catch (error) { showError(error.message); }
}

async function refresh() {
  try {
    await refreshQueue();
    await refreshOpen();
  } catch (error) { showError(error.message); }
}

async function act(path, body) {
  // A claim, a reply or a hand-back as the person named above; the server's refusal shows as is.
  showError("");
  if (!me()) { showError("Enter your name first: customers see it beside your replies."); nameInput.focus(); return false; }
  try {
    await api(key(), sessionPath(openId, path), { method: "POST", body: JSON.stringify({ agent: me(), ...body }) });
    return true;
  } catch (error) {
    showError(error.message);
    return false;
  } finally {
    await refresh();
  }
}

document.getElementById("claim").addEventListener("click", async () => {
  if (await act("/claim", {})) input.focus();
});
document.getElementById("hand-back").addEventListener("click", () => act("/hand-back", {}));
document.getElementById("composer").addEventListener("submit", async (event) => {
  event.preventDefault();
  const text = input.value.trim();
  if (!text) return;
  if (await act("/agent", { content: text })) input.value = "";
  input.focus();
});
input.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    document.getElementById("composer").requestSubmit();
  }
});

document.getElementById("conversation-title").tabIndex = -1;  // focused when a conversation opens
setInterval(() => { if (!document.hidden) refresh(); }, POLL_MS);
refresh();
