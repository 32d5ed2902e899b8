//! Everything `anylock` writes to stderr goes through here, made safe for a terminal.
//!
//! Text that came from a server or another holder (an error reply, the owner that took a
//! lock over, a lost reason, a note) may hold terminal escapes: `\x1b]0;…\x07` retitles
//! the window, `\x1b[2J` clears the screen, a `\r` overwrites what the line said. So every
//! line is cleaned on its way out, in one place rather than message by message: `note!`
//! lines and the error report ([`line`]), tracing's log lines at every verbosity
//! ([`LogWriter`]), the `break` prompt ([`prompt`]) and the live waiting line
//! ([`rewrite_line`]). The rule is lockcore's [`is_unsafe_to_show`] (control, invisible and
//! direction-changing characters), with one change: a tab, newline or carriage return
//! becomes a space, so a message stays on its one line and a server cannot forge another.
//!
//! anylock's own terminal control (clearing the waiting line) is written here too, apart
//! from the text it surrounds. tracing-subscriber 0.3.23 escapes ESC, BEL, BS, FF, DEL and
//! C1 controls in an event's `message` and in `dyn Error` values, but not in fields
//! recorded with `%` (a lost reason, an error) nor a `\r`; cleaning its finished lines here
//! covers them all, at the cost of its colours, which it would write as escapes too.

use std::borrow::Cow;
use std::fmt;
use std::io::{self, Write as _};

use lockcore::is_unsafe_to_show;

/// `text` with every character [unsafe to show](is_unsafe_to_show) replaced: a tab,
/// newline or carriage return by a space, anything else by U+FFFD. Borrows when nothing
/// needs replacing.
pub(crate) fn clean(text: &str) -> Cow<'_, str> {
    if !text.chars().any(is_unsafe_to_show) {
        return Cow::Borrowed(text);
    }
    Cow::Owned(
        text.chars()
            .map(|c| match c {
                '\t' | '\n' | '\r' => ' ',
                c if is_unsafe_to_show(c) => '\u{fffd}',
                c => c,
            })
            .collect(),
    )
}

/// `value` as one line of JSON that is safe on a terminal and means the same: serde
/// escapes C0 controls, and every other character [unsafe to show](is_unsafe_to_show)
/// (DEL, C1 controls such as U+009B, a CSI; invisible and direction-changing characters)
/// is written as a `\uXXXX` escape, which a JSON reader decodes back to it.
pub(crate) fn json(value: &serde_json::Value) -> String {
    let text = value.to_string();
    if !text.chars().any(is_unsafe_to_show) {
        return text;
    }
    let mut safe = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if is_unsafe_to_show(c) {
            // Every such character is in the Basic Multilingual Plane: one escape.
            let _ = fmt::Write::write_fmt(&mut safe, format_args!("\\u{:04x}", u32::from(c)));
        } else {
            safe.push(c);
        }
    }
    safe
}

/// Writes `args` as one clean line on stderr (`note!`). A failed write (stderr's reader
/// has gone) is ignored: the exit code is still `anylock`'s own.
pub(crate) fn line(args: fmt::Arguments<'_>) {
    let text = args.to_string();
    let mut out = clean(&text).into_owned();
    out.push('\n');
    let _ = io::stderr().write_all(out.as_bytes());
}

/// Writes `text`, each of its lines cleaned, and no newline after the last: a question
/// whose answer is read on the same line.
pub(crate) fn prompt(text: &str) {
    let lines: Vec<Cow<'_, str>> = text.split('\n').map(clean).collect();
    let mut err = io::stderr().lock();
    let _ = err.write_all(lines.join("\n").as_bytes());
    let _ = err.flush();
}

/// Clears the terminal's current line: the live waiting line is gone.
pub(crate) fn clear_line() {
    let _ = io::stderr().write_all(CLEAR_LINE.as_bytes());
}

/// Replaces the terminal's current line with `text`, cleaned (the live waiting line).
pub(crate) fn rewrite_line(text: &str) {
    let out = format!("{CLEAR_LINE}{}", clean(text));
    let _ = io::stderr().write_all(out.as_bytes());
}

/// Back to the start of the line, then erase it (ECMA-48 EL 2): anylock's own control.
const CLEAR_LINE: &str = "\r\x1b[2K";

/// tracing-subscriber's writer: each write is one finished event (the fmt layer formats
/// an event in a buffer, then writes it with one `write_all`), cleaned but for its final
/// newline.
pub(crate) struct LogWriter;

impl io::Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        io::stderr().write_all(log_line(buf).as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        io::stderr().flush()
    }
}

/// One event's text, cleaned but for its final newline.
fn log_line(buf: &[u8]) -> String {
    let text = String::from_utf8_lossy(buf);
    let (body, end) = match text.strip_suffix('\n') {
        Some(body) => (body, "\n"),
        None => (&*text, ""),
    };
    format!("{}{end}", clean(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_and_line_breaks_never_survive() {
        let planted = "evil\x1b]0;pwned\x07\x1b[2J\r\nanylock: fake\t\u{9b}31m\u{202e}x";
        let shown = clean(planted);
        assert_eq!(
            shown,
            "evil\u{fffd}]0;pwned\u{fffd}\u{fffd}[2J  anylock: fake \u{fffd}31m\u{fffd}x"
        );
        assert!(matches!(clean("host/42 ✓ ok"), Cow::Borrowed(_)));
    }

    /// JSON output keeps every character of the data, but none that a terminal acts on.
    #[test]
    fn json_escapes_what_a_terminal_would_act_on_and_reads_back_the_same() {
        let planted = "evil\x1b]0;pwned\x07\u{7f}\u{9b}2J\u{202e}x\u{feff} ✓";
        let value = serde_json::json!({ "owner": planted, "n": 1 });
        let shown = json(&value);
        assert!(!shown.chars().any(is_unsafe_to_show), "{shown}");
        assert!(shown.contains("\\u009b") && shown.contains("\\u202e") && shown.contains('✓'));
        let read: serde_json::Value = serde_json::from_str(&shown).expect("valid JSON");
        assert_eq!(read, value);
    }

    /// A log line arrives as one write with its newline; only that newline is kept.
    #[test]
    fn a_log_line_keeps_only_its_final_newline() {
        let text = b"WARN lease lost reason=taken over by \x1b[2J\nforged\n";
        assert_eq!(
            log_line(text),
            "WARN lease lost reason=taken over by \u{fffd}[2J forged\n"
        );
        assert_eq!(log_line(b"no newline\x07"), "no newline\u{fffd}");
    }
}
