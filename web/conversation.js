// The conversation and system prompt, kept in localStorage so that a reload keeps them.
// Only text is stored; a stored value that does not parse is ignored, not trusted.

const KEY = 'webshard.chat.v1';

/** `{ system, messages }` as last saved, or an empty conversation. */
export function loadConversation() {
  try {
    const saved = JSON.parse(localStorage.getItem(KEY) || 'null');
    const messages = Array.isArray(saved?.messages)
      ? saved.messages.filter((m) => typeof m?.content === 'string' && ['user', 'assistant'].includes(m.role))
      : [];
    return { system: typeof saved?.system === 'string' ? saved.system : '', messages };
  } catch {
    return { system: '', messages: [] };
  }
}

export function saveConversation(system, messages) {
  try {
    localStorage.setItem(KEY, JSON.stringify({ system, messages }));
  } catch {
    // Storage full or disabled: the conversation still works, it just is not kept.
  }
}

/** The messages a chat turn sends: the system prompt (when set) first. */
export function withSystem(system, messages) {
  return system.trim() ? [{ role: 'system', content: system }, ...messages] : messages;
}
