// Replies as Markdown: marked parses, DOMPurify sanitises (a model's output is untrusted:
// it may hold HTML such as <img onerror=...>), and each reply gets a copy button. Both
// libraries are vendored in vendor/ (.ci/vendor-web.sh): nothing is fetched from a CDN.
import { marked } from './vendor/marked.esm.js';

/** Sanitised HTML of `markdown` (GitHub-flavoured; single newlines kept as line breaks). */
export function markdownToHtml(markdown) {
  const html = marked.parse(markdown, { gfm: true, breaks: true, async: false });
  return globalThis.DOMPurify.sanitize(html, { USE_PROFILES: { html: true } });
}

/** Renders `markdown` into `body` (a reply's element), replacing what it held. */
export function renderReply(body, markdown) {
  body.innerHTML = markdownToHtml(markdown);
  body.dataset.markdown = markdown;
}

/** A reply's element: its rendered body and a button that copies the Markdown source. */
export function replyElement() {
  const turn = document.createElement('div');
  turn.className = 'turn assistant';
  const body = document.createElement('div');
  body.className = 'reply-body';
  const copy = document.createElement('button');
  copy.type = 'button';
  copy.className = 'copy';
  copy.title = 'Copy this reply as Markdown';
  copy.setAttribute('aria-label', 'Copy reply');
  copy.addEventListener('click', () => copyReply(body, copy));
  turn.append(body, copy);
  return { turn, body };
}

async function copyReply(body, button) {
  try {
    await navigator.clipboard.writeText(body.dataset.markdown || '');
    button.dataset.state = 'copied';
  } catch {
    button.dataset.state = 'failed';
  }
  setTimeout(() => delete button.dataset.state, 1500);
}
