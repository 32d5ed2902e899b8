//! `GCS_TOKEN_COMMAND`: a shell command that prints a bearer token, run again before the
//! token is due and after GCS refused it.
//!
//! The command runs as `sh -c COMMAND` (so `gcloud auth print-access-token` or a pipeline
//! works as typed), with stdin closed, in a process group of its own that is killed when
//! the run takes longer than the request timeout. Its stdout, trimmed, is the token, or
//! JSON `{"access_token": "…", "expires_in": SECONDS}`. A plain token is renewed every
//! [`PLAIN_TOKEN_LIFE`]. Errors never include stdout, and of stderr only its last line,
//! shortened, with anything shaped like a token replaced by `***`.

use std::process::Stdio;
use std::time::Duration;

use lockcore::{Error, ErrorKind, Result};
use serde_json::Value;

use crate::error::shorten;
use crate::token::Fresh;

/// How long a token printed as plain text is used before the command runs again.
pub const PLAIN_TOKEN_LIFE: Duration = Duration::from_secs(300);
/// The most stdout a command may print ([`crate::body::COMMAND_OUTPUT`]).
const MAX_OUTPUT: usize = crate::body::COMMAND_OUTPUT.bytes;
/// How much of the end of stderr is kept (its last line is quoted).
const STDERR_TAIL: usize = 4096;

/// Runs `command` once and reads the token it prints.
///
/// # Errors
/// [`Config`](ErrorKind::Config) when `sh` cannot be started or the output is not a token
/// (more than 64 KiB of it stops the command at once: it is killed, and no more is read);
/// [`Unavailable`](ErrorKind::Unavailable) when the command fails or takes longer than
/// `timeout` (it is killed).
pub(crate) async fn run(command: &str, timeout: Duration) -> Result<Fresh> {
    let mut child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(command)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| {
            Error::new(
                ErrorKind::Config,
                format!("cannot start GCS_TOKEN_COMMAND with sh: {e}"),
            )
        })?;
    let group = child.id();
    let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
    let work = async {
        let stdout = async {
            let out = read_at_most(stdout, MAX_OUTPUT + 1).await;
            if out.as_ref().is_ok_and(|out| out.len() > MAX_OUTPUT) {
                kill_group(group).await; // it has said too much: no need to wait
            }
            out
        };
        let (stdout, stderr) = tokio::join!(stdout, read_tail(stderr, STDERR_TAIL));
        let status = child.wait().await;
        (stdout, stderr, status)
    };
    let Ok((stdout, stderr, status)) = tokio::time::timeout(timeout, work).await else {
        kill_group(group).await;
        return Err(Error::unavailable(format!(
            "GCS_TOKEN_COMMAND took longer than {timeout:?} and was killed"
        )));
    };
    let unreadable = |e: std::io::Error| {
        Error::unavailable(format!("GCS_TOKEN_COMMAND's output could not be read: {e}"))
    };
    let stdout = stdout.map_err(unreadable)?;
    if stdout.len() > MAX_OUTPUT {
        return parse_output(&stdout); // refused for its size, before its exit status
    }
    let status = status.map_err(unreadable)?;
    if !status.success() {
        return Err(Error::unavailable(format!(
            "GCS_TOKEN_COMMAND failed ({status}){}",
            stderr_line(&stderr.map_err(unreadable)?)
        )));
    }
    parse_output(&stdout)
}

/// Up to `max` bytes of `pipe`, reading no more.
async fn read_at_most(
    pipe: Option<impl tokio::io::AsyncRead + Unpin>,
    max: usize,
) -> std::io::Result<Vec<u8>> {
    use tokio::io::AsyncReadExt;
    let mut out = Vec::new();
    if let Some(pipe) = pipe {
        pipe.take(max as u64).read_to_end(&mut out).await?;
    }
    Ok(out)
}

/// The last `keep` bytes of `pipe`, read to its end.
async fn read_tail(
    pipe: Option<impl tokio::io::AsyncRead + Unpin>,
    keep: usize,
) -> std::io::Result<Vec<u8>> {
    use tokio::io::AsyncReadExt;
    let Some(mut pipe) = pipe else {
        return Ok(Vec::new());
    };
    let (mut tail, mut buf) = (Vec::with_capacity(2 * keep), vec![0u8; keep]);
    loop {
        let n = pipe.read(&mut buf).await?;
        if n == 0 {
            return Ok(tail);
        }
        tail.extend_from_slice(&buf[..n]);
        if tail.len() > keep {
            tail.drain(..tail.len() - keep);
        }
    }
}

/// Kills what the command left running (the child itself is killed on drop).
async fn kill_group(group: Option<u32>) {
    let Some(group) = group else { return };
    let _ = tokio::process::Command::new("kill")
        .args(["-KILL", "--", &format!("-{group}")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await;
}

/// The token and its life from stdout: a token alone, or OAuth2-shaped JSON.
fn parse_output(stdout: &[u8]) -> Result<Fresh> {
    let bad = |why: &str| {
        Error::new(
            ErrorKind::Config,
            format!(
                "GCS_TOKEN_COMMAND {why} (expected a token, or JSON {{\"access_token\", \"expires_in\"}}, on stdout)"
            ),
        )
    };
    if stdout.len() > MAX_OUTPUT {
        return Err(bad("printed more than 64 KiB"));
    }
    let text = std::str::from_utf8(stdout)
        .map_err(|_| bad("printed bytes that are not UTF-8"))?
        .trim();
    let (token, life) = if text.starts_with('{') {
        let value: Value =
            serde_json::from_str(text).map_err(|_| bad("printed JSON that does not parse"))?;
        let token = value.get("access_token").and_then(Value::as_str);
        let token = token.ok_or_else(|| bad("printed JSON without a string access_token"))?;
        let life = match value.get("expires_in") {
            None => PLAIN_TOKEN_LIFE,
            Some(v) => Duration::from_secs(
                v.as_u64()
                    .ok_or_else(|| bad("printed an expires_in that is not a whole number"))?,
            ),
        };
        (token.to_owned(), life)
    } else {
        (text.to_owned(), PLAIN_TOKEN_LIFE)
    };
    if token.is_empty() {
        return Err(bad("printed no token"));
    }
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(bad("printed more than one word"));
    }
    Ok(Fresh { token, life })
}

/// `: <last stderr line>`, shortened, long token-like words replaced by `***`; or nothing.
fn stderr_line(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let Some(line) = text.lines().rev().map(str::trim).find(|l| !l.is_empty()) else {
        return String::new();
    };
    let token_like = |w: &str| {
        w.len() >= 20
            && w.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-~+/=".contains(&b))
    };
    let redacted: Vec<&str> = line
        .split_whitespace()
        .map(|w| if token_like(w) { "***" } else { w })
        .collect();
    format!(": {}", shorten(&redacted.join(" "), 160))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_plain_token_or_json() {
        let plain = parse_output(b"  ya29.abc\n").expect("plain");
        assert_eq!(
            (plain.token.as_str(), plain.life),
            ("ya29.abc", PLAIN_TOKEN_LIFE)
        );
        let json = parse_output(br#"{"access_token":"t1","expires_in":42}"#).expect("json");
        assert_eq!(
            (json.token.as_str(), json.life),
            ("t1", Duration::from_secs(42))
        );
    }

    #[test]
    fn refuses_output_that_is_not_a_token_without_echoing_it() {
        for out in [
            &b""[..],
            b"two s3cretwords",
            b"{\"token\":\"s3cret\"}",
            b"{\"access_token\":\"s3cret\",\"expires_in\":\"soon\"}",
            b"{s3cret",
            b"\xff\xfe",
        ] {
            let err = parse_output(out).err().expect("refused");
            assert_eq!(err.kind(), ErrorKind::Config);
            assert!(!err.to_string().contains("s3cret"), "{err}");
        }
    }

    #[test]
    fn the_stderr_line_hides_token_like_words() {
        let line = stderr_line(b"first\nerror: token ya29.a0AfH6SMBx3secretsecret rejected\n\n");
        assert_eq!(line, ": error: token *** rejected");
        assert_eq!(stderr_line(b""), "");
    }
}
