//! The runner on a terminal, through a pseudo-terminal as a user types: `runner chat`'s line
//! editor, slash commands, Ctrl-C and the limit marker, and the prefill progress bar.

use crate::common;

use std::process::Command;
use std::time::Duration;

use rexpect::session::{spawn_with_options, Options, PtySession};

const RUNNER: &str = env!("CARGO_BIN_EXE_runner");
/// Loading and a few tokens on a CPU adapter, with other builds sharing the cores.
const PATIENCE_MS: u64 = 180_000;
const LEFT: &str = "\x1b[D";
const UP: &str = "\x1b[A";

fn on_terminal(args: &[&str]) -> PtySession {
    let mut command = Command::new(RUNNER);
    command
        .args(args)
        .env("XDG_RUNTIME_DIR", std::env::temp_dir())
        .env("TERM", "xterm");
    let options = Options::new()
        .timeout_ms(Some(PATIENCE_MS))
        .strip_ansi_escape_codes(true);
    spawn_with_options(command, options).expect("spawn on a pseudo-terminal")
}

/// Sends each key (or text) apart, as a person types: an escape sequence must not arrive glued
/// to the next key.
fn type_slowly(session: &mut PtySession, keys: &[&str]) {
    for key in keys {
        session.send(key).unwrap();
        session.flush().unwrap();
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// Sends a line and Enter in one write, as a paste arrives. rustyline's `signal-hook` reader
/// once hung on this after the first key (the rest sat in its buffer while it waited on the
/// terminal): on a loaded machine (CI, 2026-12-01 and 12-07) even typed keys can arrive so.
fn type_line(session: &mut PtySession, line: &str) {
    paste(session, &[line]);
}

/// Sends lines, each with its Enter, in one write: a paste of several lines.
fn paste(session: &mut PtySession, lines: &[&str]) {
    let text: String = lines.iter().map(|line| format!("{line}\r")).collect();
    session.send(&text).unwrap();
    session.flush().unwrap();
}

/// One terminal at a time: the tests drive their pseudo-terminals by timing (keys typed after
/// a prompt appears), which sessions competing for two cores make unreliable.
static ONE_TERMINAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_terminal() -> std::sync::MutexGuard<'static, ()> {
    ONE_TERMINAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn chat_session(tokens: &str) -> PtySession {
    let model = common::model_path(common::SMOLLM2).display().to_string();
    let mut chat = on_terminal(&["chat", "-m", &model, "-n", tokens, "--temp", "0", "--quiet"]);
    chat.exp_string("/help lists commands")
        .expect("the greeting");
    chat.exp_string("> ").expect("the prompt");
    // The prompt is drawn just before the editor reads keys; let it settle into raw mode.
    std::thread::sleep(Duration::from_millis(500));
    chat
}

/// Exit status 0 (rexpect hands back nix's `WaitStatus`, which it does not re-export).
fn assert_exited_cleanly(session: &PtySession) {
    let status = format!("{:?}", session.process().wait().unwrap());
    assert!(
        status.starts_with("Exited(") && status.ends_with(", 0)"),
        "{status}"
    );
}

fn quit(mut chat: PtySession) {
    type_line(&mut chat, "/exit");
    chat.exp_eof().expect("/exit ends the program");
    assert_exited_cleanly(&chat);
}

#[test]
fn chat_commands_editing_history_and_the_limit_marker() {
    let _terminal = one_terminal();
    let mut chat = chat_session("6");
    type_line(&mut chat, "/help");
    chat.exp_string("/system TEXT")
        .expect("/help lists the commands");
    chat.exp_string("> ").unwrap();
    type_line(&mut chat, "Tell me a story about a dragon.");
    let reply = chat
        .exp_string("[reply cut off at the limit of 6 tokens (-n)]")
        .expect("a reply cut at -n is marked");
    assert!(!reply.contains("load "), "no load time per turn: {reply}");
    chat.exp_string("> ").unwrap();
    // Arrow keys edit the line: "/cler", Left, "a" is "/clear".
    type_slowly(&mut chat, &["/cler", LEFT, "a", "\r"]);
    chat.exp_string("(conversation cleared)")
        .expect("/clear, edited with Left");
    chat.exp_string("> ").unwrap();
    // Up walks the history back to "/help" (three entries up).
    type_slowly(&mut chat, &[UP, UP, UP, "\r"]);
    chat.exp_string("/system TEXT")
        .expect("/help again from the history");
    chat.exp_string("> ").unwrap();
    // Two lines pasted at once: the second waits for the first, none is lost.
    paste(&mut chat, &["/system Answer in French.", "/nonsense"]);
    chat.exp_string("(system message set").unwrap();
    chat.exp_string("> ").unwrap();
    chat.exp_string("unknown command /nonsense")
        .expect("not sent to the model");
    chat.exp_string("> ").unwrap();
    quit(chat);
}

#[test]
fn ctrl_c_at_the_prompt_does_not_quit_and_ctrl_d_does() {
    let _terminal = one_terminal();
    let mut chat = chat_session("4");
    chat.send_control('c').unwrap();
    chat.exp_string("/exit quits")
        .expect("Ctrl-C at the prompt says how to quit");
    chat.exp_string("> ").expect("and the chat goes on");
    chat.send_control('d').unwrap();
    chat.exp_eof().expect("Ctrl-D ends the program");
    assert_exited_cleanly(&chat);
}

#[test]
fn ctrl_c_while_a_reply_streams_stops_the_reply_and_keeps_the_chat() {
    let _terminal = one_terminal();
    let mut chat = chat_session("200");
    type_line(&mut chat, "Tell me a long story about a dragon.");
    // Some of the reply, then Ctrl-C: the reply stops well before its 200 tokens.
    chat.exp_regex(r"\w+ \w+ \w+").expect("the reply streams");
    chat.send_control('c').unwrap();
    let (reply, _) = chat
        .exp_regex(r"\[stopped\]")
        .expect("Ctrl-C stops the reply");
    assert!(
        !reply.contains("cut off"),
        "stopped, not cut at -n: {reply}"
    );
    let (_, timings) = chat.exp_regex(r"decode \d+ tokens").unwrap();
    let decoded: u32 = timings[7..timings.len() - 7].parse().unwrap();
    assert!(decoded < 200, "{timings}");
    chat.exp_string("> ").expect("the chat goes on");
    type_line(&mut chat, "/help");
    chat.exp_string("/system TEXT").expect("and takes commands");
    chat.exp_string("> ").unwrap();
    quit(chat);
}

#[test]
fn prefill_shows_progress_on_a_terminal() {
    let _terminal = one_terminal();
    let model = common::model_path(common::SMOLLM2).display().to_string();
    let prompt = "the quick brown fox jumps over the lazy dog ".repeat(30);
    let mut run = on_terminal(&[
        "generate", "-m", &model, "-p", &prompt, "-n", "1", "--temp", "0",
    ]);
    let (_, total) = run
        .exp_regex(r"prompt .*\d+/(\d+) tokens")
        .expect("a prefill progress line");
    assert!(total.contains("tokens"), "{total}");
    run.exp_string("decode 1 tokens").expect("the timings");
    run.exp_eof().unwrap();
}
