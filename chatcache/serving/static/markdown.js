// A small Markdown renderer that builds DOM nodes and sets only their text, never innerHTML: a
// message's "<img onerror=...>" stays text, and a link is made only for http, https and
// mailto addresses. It covers what a chat reply uses (paragraphs, line breaks, headings,
// lists, code blocks, inline code, bold, italics, links) and deliberately nothing else: no
// raw HTML, no images, no tables.
"use strict";

const SAFE_LINK = /^(https?:|mailto:)/i;

function safeHref(url) {
  // The URL as the browser would resolve it, so "JaVaScRiPt:" or " javascript:" cannot pass.
  try {
    const resolved = new URL(url, "https://invalid.example/");
    return SAFE_LINK.test(resolved.protocol) && SAFE_LINK.test(url.trim()) ? resolved.href : null;
  } catch (e) {
    return null;
  }
}

// Inline spans, first match wins at each position: `code`, **bold**, *italic* or _italic_, [text](url).
const INLINE = /`([^`\n]+)`|\*\*([^*\n]+)\*\*|(?:\*([^*\n]+)\*|\b_([^_\n]+)_\b)|\[([^\]\n]+)\]\(([^)\s]+)\)/g;

function appendInline(parent, text) {
  let at = 0;
  for (const match of text.matchAll(INLINE)) {
    if (match.index > at) appendText(parent, text.slice(at, match.index));
    const [whole, code, bold, star, underscore, label, url] = match;
    if (code !== undefined) {
      parent.appendChild(element("code", code));
    } else if (bold !== undefined) {
      appendInline(parent.appendChild(document.createElement("strong")), bold);
    } else if (star !== undefined || underscore !== undefined) {
      appendInline(parent.appendChild(document.createElement("em")), star !== undefined ? star : underscore);
    } else {
      const href = safeHref(url);
      if (href === null) {
        appendText(parent, whole);  // an unsafe link shows as the text it was
      } else {
        const link = element("a", label);
        link.href = href;
        link.rel = "noopener noreferrer nofollow";
        link.target = "_blank";
        parent.appendChild(link);
      }
    }
    at = match.index + whole.length;
  }
  if (at < text.length) appendText(parent, text.slice(at));
}

function appendText(parent, text) {
  // Line breaks inside a paragraph are kept, as people type them in a chat.
  text.split("\n").forEach((line, i) => {
    if (i > 0) parent.appendChild(document.createElement("br"));
    if (line) parent.appendChild(document.createTextNode(line));
  });
}

function element(tag, text) {
  const node = document.createElement(tag);
  node.textContent = text;
  return node;
}

const BULLET = /^\s*[-*+]\s+(.*)$/;
const NUMBERED = /^\s*\d+[.)]\s+(.*)$/;
const HEADING = /^(#{1,6})\s+(.*)$/;
const FENCE = /^\s*```/;

function renderMarkdown(source) {
  // The message as a fragment of block nodes; an unfinished code block (a reply still
  // streaming) shows as code so far.
  const fragment = document.createDocumentFragment();
  const lines = String(source).replace(/\r\n?/g, "\n").split("\n");
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    if (!line.trim()) { i++; continue; }
    if (FENCE.test(line)) {
      const code = [];
      for (i++; i < lines.length && !FENCE.test(lines[i]); i++) code.push(lines[i]);
      i++;
      fragment.appendChild(document.createElement("pre")).appendChild(element("code", code.join("\n")));
      continue;
    }
    const heading = HEADING.exec(line);
    if (heading) {
      // h3 and below: a reply's heading sits under the page's own.
      appendInline(fragment.appendChild(document.createElement("h" + Math.min(6, heading[1].length + 2))), heading[2]);
      i++;
      continue;
    }
    const kind = BULLET.test(line) ? BULLET : NUMBERED.test(line) ? NUMBERED : null;
    if (kind) {
      const list = fragment.appendChild(document.createElement(kind === BULLET ? "ul" : "ol"));
      for (; i < lines.length && kind.test(lines[i]); i++) appendInline(list.appendChild(document.createElement("li")), kind.exec(lines[i])[1]);
      continue;
    }
    const paragraph = [];
    for (; i < lines.length && lines[i].trim() && !FENCE.test(lines[i]) && !HEADING.test(lines[i]) && !BULLET.test(lines[i]) && !NUMBERED.test(lines[i]); i++) paragraph.push(lines[i]);
    appendInline(fragment.appendChild(document.createElement("p")), paragraph.join("\n"));
  }
  return fragment;
}
