//! Exit codes, and the one-line error report.

use std::error::Error as _;
use std::io;

use lockcore::{Error, ErrorKind};

/// `status`: the lock is free.
pub(crate) const FREE: u8 = 1;
/// Bad usage, URL, duration or configuration.
pub(crate) const USAGE: u8 = 2;
/// The lock was lost while the command ran; the command was stopped.
pub(crate) const LOST: u8 = 122;
/// The lock is held and `--no-wait` was given.
pub(crate) const HELD: u8 = 123;
/// Timed out waiting for the lock.
pub(crate) const TIMEOUT: u8 = 124;
/// anylock failed: backend unreachable, permission denied, protocol error.
pub(crate) const FAILED: u8 = 125;
/// The command is not executable.
pub(crate) const NOT_EXECUTABLE: u8 = 126;
/// The command was not found.
pub(crate) const NOT_FOUND: u8 = 127;

/// The exit code for an error of anylock's own.
pub(crate) fn code_for(err: &Error) -> u8 {
    match err.kind() {
        ErrorKind::Held => HELD,
        ErrorKind::Timeout => TIMEOUT,
        ErrorKind::Lost => LOST,
        ErrorKind::InvalidInput | ErrorKind::Config => USAGE,
        _ => FAILED,
    }
}

/// The exit code for a command that could not be started.
pub(crate) fn spawn_error_code(err: &io::Error) -> u8 {
    match err.kind() {
        io::ErrorKind::NotFound => NOT_FOUND,
        io::ErrorKind::PermissionDenied => NOT_EXECUTABLE,
        _ => FAILED,
    }
}

/// Prints `anylock: <error>: <cause>: <cause>` on one line to stderr, made safe for a
/// terminal (a cause may be a server's text).
pub(crate) fn report(err: &Error) {
    let mut line = format!("anylock: {err}");
    let mut source = err.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        source = cause.source();
    }
    note!("{line}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_distinct_and_documented() {
        let codes = [
            FREE,
            USAGE,
            LOST,
            HELD,
            TIMEOUT,
            FAILED,
            NOT_EXECUTABLE,
            NOT_FOUND,
        ];
        let mut sorted = codes.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), codes.len());
        assert_eq!(code_for(&Error::new(ErrorKind::Held, "x")), HELD);
        assert_eq!(code_for(&Error::new(ErrorKind::Timeout, "x")), TIMEOUT);
        assert_eq!(code_for(&Error::unavailable("x")), FAILED);
        assert_eq!(code_for(&Error::invalid_input("x")), USAGE);
    }
}
