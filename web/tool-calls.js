// A generated answer read back as a tool call, whole or while it streams: the page's copy of
// native-runner/src/api/tool_calls.rs (same rules, same bytes). It stays in JS because the
// text reaches the page token by token through the worker's messages; reading it there
// needs no state kept across the wasm boundary.
//
// Under a tool constraint (options.tool_call, ConstraintSpec::hermes_tool_call) the output is
// free text that does not start with `<` (nor `{`), or exactly
// `<tool_call>\n{"name": "N", "arguments": {...}}\n</tool_call>`. So the first character
// decides which, the name is known once its header is complete, and the arguments are the
// JSON object after it, up to its matching brace.

const CALL_OPENING = '<tool_call>\n{"name": "';
const NAME_TO_ARGUMENTS = '", "arguments": ';

/** Where a JSON value's text ends: brace and bracket depth outside strings. */
class JsonScanner {
  constructor() {
    this.depth = 0;
    this.inString = false;
    this.escaped = false;
  }

  /** `[taken, closed]`: how many characters of `text` belong to the value, and whether it closed. */
  feed(text) {
    for (let at = 0; at < text.length; at++) {
      const ch = text[at];
      if (this.inString) {
        if (this.escaped) this.escaped = false;
        else if (ch === '\\') this.escaped = true;
        else if (ch === '"') this.inString = false;
        continue;
      }
      if (ch === '"') this.inString = true;
      else if (ch === '{' || ch === '[') this.depth += 1;
      else if (ch === '}' || ch === ']') {
        this.depth = Math.max(0, this.depth - 1);
        if (this.depth === 0) return [at + 1, true];
      }
    }
    return [text.length, false];
  }
}

/** Reads streamed text into pieces: `{ content }`, `{ name }` (the call starts) or `{ arguments }`. */
export class CallReader {
  constructor() {
    this.text = '';
    this.state = 'undecided';
    this.name = '';
    this.start = 0;
    this.sent = 0;
  }

  push(piece) {
    if (this.state === 'content') return [{ content: piece }];
    this.text += piece;
    const out = [];
    if (this.state === 'undecided') {
      if (!this.text) return out;
      if (this.text[0] !== '<') {
        this.state = 'content';
        return [{ content: this.text }];
      }
      this.state = 'header';
    }
    if (this.state === 'header') {
      if (!this.readHeader()) return out;
      out.push({ name: this.name });
    }
    if (this.state === 'arguments') {
      const fresh = this.text.slice(this.sent);
      const [taken, closed] = this.scanner.feed(fresh);
      if (taken > 0) out.push({ arguments: fresh.slice(0, taken) });
      this.sent += taken;
      if (closed) this.state = 'closed';
    }
    return out;
  }

  /** True once the header is all there: the name is known and the arguments begin. */
  readHeader() {
    if (!this.text.startsWith(CALL_OPENING)) return false;
    const rest = this.text.slice(CALL_OPENING.length);
    const nameEnd = rest.indexOf('"');
    if (nameEnd < 0 || !rest.slice(nameEnd).startsWith(NAME_TO_ARGUMENTS)) return false;
    this.name = rest.slice(0, nameEnd);
    this.start = CALL_OPENING.length + nameEnd + NAME_TO_ARGUMENTS.length;
    this.sent = this.start;
    this.scanner = new JsonScanner();
    this.state = 'arguments';
    return true;
  }

  /** `{ name, arguments }` when the text was a call whose arguments closed and parse. */
  call() {
    if (this.state !== 'closed') return null;
    const args = this.text.slice(this.start, this.sent);
    try {
      JSON.parse(args);
    } catch {
      return null;
    }
    return { name: this.name, arguments: args };
  }
}

/** The call in a whole answer, or null. */
export function readCall(text) {
  const reader = new CallReader();
  reader.push(text);
  return reader.call();
}
