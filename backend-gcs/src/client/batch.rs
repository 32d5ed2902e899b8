//! GCS's JSON-API batch endpoint (`POST /batch/storage/v1`, <https://cloud.google.com/storage/docs/batch>):
//! up to [`BATCH_LIMIT`] metadata PATCHes in one `multipart/mixed` request, each answered
//! by a part of the `multipart/mixed` reply. Each call is still one GCS operation (its
//! preconditions, its 412), only the HTTP request is shared.

use lockcore::Result;
use reqwest::StatusCode;
use serde_json::{Value, json};

use super::{GcsClient, Preconditions, segment};
use crate::error::{Call, Failure, map_error};
use crate::reply::{ReadStatus, Reply, parse_object, read_status};

/// The most calls one batch carries: Google's documented limit ("You should not include
/// more than 100 calls in a single batch request").
pub(crate) const BATCH_LIMIT: usize = 100;

/// The multipart boundary of our batch requests (never inside a part: the parts are
/// JSON and request lines of percent-encoded paths, which have no `=` after `--`).
const BOUNDARY: &str = "==anylock-gcs-batch==";

/// One metadata PATCH of a batch.
#[derive(Debug)]
pub(crate) struct PatchCall<'a> {
    pub(crate) object: &'a str,
    pub(crate) metadata: Value,
    pub(crate) preconditions: Preconditions,
}

/// A batch reply (or a part of one) that cannot be read: the calls may have applied, as
/// when a lone PATCH's reply is lost, so the outcome is unknown (temporary), never a
/// verdict on the lease.
fn unreadable(what: &str) -> lockcore::Error {
    lockcore::Error::new(
        lockcore::ErrorKind::OutcomeUnknown,
        format!("GCS's batch reply {what}"),
    )
}

/// One call's answer inside a batch reply.
#[derive(Debug)]
pub(crate) enum PartAnswer {
    /// A status the lock logic decides on (2xx, 404, 412; [`read_status`]), as
    /// [`GcsClient::patch`] would answer it.
    Reply(Reply),
    /// Any other status (401, 429, 5xx, …).
    Status(u16),
    /// The reply had no readable answer for this call.
    Unreadable(lockcore::Error),
}

impl GcsClient {
    /// Whether refreshes may be batched now (see [`Batching`](crate::batching::Batching)).
    pub(crate) fn batches(&self) -> bool {
        self.batching.allowed()
    }

    /// Whether this endpoint is ever batched (no path; see
    /// [`Batching`](crate::batching::Batching)).
    pub(crate) fn may_batch(&self) -> bool {
        self.batching.endpoint_allows()
    }

    /// Whether a refused token is renewed (then a call refused with 401 is worth sending
    /// once more).
    pub(crate) fn renews_tokens(&self) -> bool {
        self.auth.renews()
    }

    /// Sends `calls` (at most [`BATCH_LIMIT`]) in one batch request: one answer per call,
    /// in order, or `None` when the batch itself was refused before any call ran (no batch
    /// endpoint, or a 4xx other than 401, 403, 408 and 429; remembered for a while, see
    /// [`Batching`](crate::batching::Batching)). A failure of the whole request is the error
    /// a lone PATCH would get from it. When a call was refused with 401 and the token is
    /// renewable, the token is dropped so the next call fetches a new one.
    pub(crate) async fn patch_batch(
        &self,
        calls: &[PatchCall<'_>],
    ) -> Result<Option<Vec<PartAnswer>>> {
        let url = format!("{}/batch/storage/v1", self.config.endpoint());
        let request = self
            .http
            .post(url)
            .header(
                "Content-Type",
                format!("multipart/mixed; boundary=\"{BOUNDARY}\""),
            )
            .body(self.batch_body(calls));
        let (response, token) = self.exchange_keeping_token(request, Call::Write).await?;
        match response.status() {
            s if s.is_success() => {}
            // What a lone PATCH would get as well (a passing outage or overload, refused
            // credentials; a renewable token's 401 was already resent once): the same error.
            s if s != StatusCode::NOT_IMPLEMENTED
                && (s.is_server_error() || matches!(s.as_u16(), 401 | 403 | 408 | 429)) =>
            {
                return Err(map_error(Failure::Status(s.as_u16()), Call::Write));
            }
            // Anything else refuses the batch itself before any call ran: no batch
            // endpoint (404, 405, 501), a batch the server or a proxy will not take (400,
            // 413, a redirect, …). That is no verdict on any lease: they go alone.
            _ => {
                self.batching.refused();
                return Ok(None);
            }
        }
        let content_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let body = super::read_body(response, crate::body::BATCH, Call::Write).await?;
        let answers = parse_reply(&content_type, &body, calls.len())?;
        let refused = answers.iter().any(|a| matches!(a, PartAnswer::Status(401)));
        if let (true, Some(token)) = (refused && self.auth.renews(), token) {
            self.auth.forget(&token).await;
        }
        Ok(Some(answers))
    }

    /// The `multipart/mixed` body: one `application/http` part per call, `Content-ID:
    /// <anylock+I>` for call `I`, each a PATCH with a path-only target.
    fn batch_body(&self, calls: &[PatchCall<'_>]) -> String {
        let bucket = segment(self.config.bucket());
        let mut body = String::new();
        for (i, call) in calls.iter().enumerate() {
            let json = json!({ "metadata": call.metadata }).to_string();
            body.push_str(&format!(
                "--{BOUNDARY}\r\nContent-Type: application/http\r\n\
                 Content-Transfer-Encoding: binary\r\nContent-ID: <anylock+{i}>\r\n\r\n\
                 PATCH /storage/v1/b/{bucket}/o/{}?{} HTTP/1.1\r\n\
                 Content-Type: application/json; charset=UTF-8\r\n\
                 Content-Length: {}\r\n\r\n{json}\r\n",
                segment(call.object),
                call.preconditions.query(),
                json.len(),
            ));
        }
        body.push_str(&format!("--{BOUNDARY}--\r\n"));
        body
    }
}

/// The answers of a batch reply, in the order of its `count` calls, matched by
/// `Content-ID` (`response-anylock+I`). A call the reply does not answer (or answers
/// twice) gets [`PartAnswer::Unreadable`]; a reply that is no `multipart/mixed` at all,
/// or ends before its close delimiter, fails as a whole. Both are `OutcomeUnknown`.
pub(crate) fn parse_reply(
    content_type: &str,
    body: &[u8],
    count: usize,
) -> Result<Vec<PartAnswer>> {
    let boundary =
        mixed_boundary(content_type).ok_or_else(|| unreadable("is not multipart/mixed"))?;
    let delimiter = format!("--{boundary}");
    let mut found: Vec<Option<PartAnswer>> = (0..count).map(|_| None).collect();
    let mut twice = vec![false; count];
    let mut pieces = split(body, delimiter.as_bytes());
    pieces.next(); // the preamble
    let mut closed = false;
    for piece in pieces {
        if piece.starts_with(b"--") {
            closed = true; // the close delimiter
            break;
        }
        let Some((index, answer)) = part(piece) else {
            continue;
        };
        match found.get_mut(index) {
            Some(slot @ None) => *slot = Some(answer),
            Some(Some(_)) => twice[index] = true,
            None => {}
        }
    }
    if !closed {
        // Cut short: the last part may be a truncated answer that still reads as one.
        return Err(unreadable("ends before its close delimiter"));
    }
    Ok(found
        .into_iter()
        .zip(twice)
        .map(|(answer, twice)| match answer {
            Some(answer) if !twice => answer,
            Some(_) => PartAnswer::Unreadable(unreadable("answers this call twice")),
            None => PartAnswer::Unreadable(unreadable("has no answer for this call")),
        })
        .collect())
}

/// The `boundary` of a `multipart/mixed` content type.
fn mixed_boundary(content_type: &str) -> Option<String> {
    let mut params = content_type.split(';').map(str::trim);
    if !params.next()?.eq_ignore_ascii_case("multipart/mixed") {
        return None;
    }
    params
        .filter_map(|p| p.split_once('='))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("boundary"))
        .map(|(_, v)| v.trim().trim_matches('"').to_owned())
        .filter(|b| !b.is_empty())
}

/// `body` cut at every `delimiter`.
fn split<'a>(body: &'a [u8], delimiter: &'a [u8]) -> impl Iterator<Item = &'a [u8]> {
    let finder = memchr::memmem::Finder::new(delimiter);
    let mut rest = Some(body);
    std::iter::from_fn(move || {
        let now = rest?;
        match finder.find(now) {
            Some(at) => {
                rest = Some(&now[at + delimiter.len()..]);
                Some(&now[..at])
            }
            None => {
                rest = None;
                Some(now)
            }
        }
    })
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    memchr::memmem::find(haystack, needle)
}

/// The call index and answer of one part: its headers (with `Content-ID:
/// <response-anylock+I>`), a blank line, then a whole HTTP response. `None` for a part
/// that names none of our calls.
fn part(piece: &[u8]) -> Option<(usize, PartAnswer)> {
    let (headers, response) = head_and_rest(trim_line_end(piece))?;
    let id = header(headers, "content-id")?;
    let index = id
        .trim()
        .trim_start_matches('<')
        .trim_end_matches('>')
        .strip_prefix("response-anylock+")?
        .parse()
        .ok()?;
    Some((index, answer(response)))
}

/// One part's HTTP response as the answer a lone PATCH would give.
fn answer(response: &[u8]) -> PartAnswer {
    let unreadable = || PartAnswer::Unreadable(unreadable("holds an unreadable answer"));
    let Some((head, rest)) = head_and_rest(response) else {
        return unreadable();
    };
    let Some(status) = head
        .lines()
        .next()
        .and_then(|line| line.split(' ').nth(1))
        .and_then(|code| code.parse::<u16>().ok())
    else {
        return unreadable();
    };
    let body = match header(head, "content-length").and_then(|n| n.parse::<usize>().ok()) {
        Some(len) if len <= rest.len() => &rest[..len],
        Some(_) => return unreadable(),
        None => trim_trailing_line_end(rest),
    };
    match read_status(status) {
        ReadStatus::Decided(reply) => PartAnswer::Reply(reply),
        ReadStatus::Object => match parse_object(body) {
            Ok(object) => PartAnswer::Reply(Reply::Ok(object)),
            Err(e) => PartAnswer::Unreadable(e),
        },
        ReadStatus::Failed(code) => PartAnswer::Status(code),
    }
}

/// Headers (as text) and what follows the blank line after them.
fn head_and_rest(raw: &[u8]) -> Option<(&str, &[u8])> {
    let (end, start) = match find(raw, b"\r\n\r\n") {
        Some(at) => (at, at + 4),
        None => find(raw, b"\n\n").map(|at| (at, at + 2))?,
    };
    Some((std::str::from_utf8(&raw[..end]).ok()?, &raw[start..]))
}

fn header<'a>(headers: &'a str, name: &str) -> Option<&'a str> {
    headers.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.trim().eq_ignore_ascii_case(name).then(|| value.trim())
    })
}

/// `raw` without the line end that follows a delimiter.
fn trim_line_end(raw: &[u8]) -> &[u8] {
    raw.strip_prefix(b"\r\n")
        .or_else(|| raw.strip_prefix(b"\n"))
        .unwrap_or(raw)
}

/// `raw` without the line end that belongs to the next delimiter.
fn trim_trailing_line_end(raw: &[u8]) -> &[u8] {
    let raw = raw.strip_suffix(b"\n").unwrap_or(raw);
    raw.strip_suffix(b"\r").unwrap_or(raw)
}

#[cfg(test)]
mod tests {
    use super::*;

    const OBJECT: &str = r#"{"generation":"7","metageneration":"3","updated":"2026-11-24T10:00:00.000Z","metadata":{"identity":"me","ttl_ms":"30000"}}"#;

    fn reply(parts: &[(&str, &str)]) -> Vec<u8> {
        let mut out = String::from("preamble\r\n");
        for (id, response) in parts {
            out.push_str(&format!(
                "--b\r\nContent-Type: application/http\r\nContent-ID: <{id}>\r\n\r\n{response}\r\n"
            ));
        }
        out.push_str("--b--\r\n");
        out.into_bytes()
    }

    #[test]
    fn answers_are_matched_by_content_id_not_order() {
        let ok = format!("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{OBJECT}\n");
        let body = reply(&[
            (
                "response-anylock+1",
                "HTTP/1.1 412 Precondition Failed\r\n\r\n{}",
            ),
            ("response-anylock+0", &ok),
            (
                "response-anylock+2",
                "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 2\r\n\r\n{}",
            ),
        ]);
        let answers = parse_reply("multipart/mixed; boundary=\"b\"", &body, 4).unwrap();
        assert!(
            matches!(&answers[0], PartAnswer::Reply(Reply::Ok(Some(o))) if o.metageneration == 3)
        );
        assert!(matches!(
            answers[1],
            PartAnswer::Reply(Reply::PreconditionFailed)
        ));
        assert!(matches!(answers[2], PartAnswer::Status(503)));
        assert!(
            matches!(answers[3], PartAnswer::Unreadable(_)),
            "no answer for call 3"
        );
    }

    #[test]
    fn a_call_answered_twice_or_garbled_is_unreadable() {
        let body = reply(&[
            ("response-anylock+0", "HTTP/1.1 404 Not Found\r\n\r\n{}"),
            ("response-anylock+0", "HTTP/1.1 404 Not Found\r\n\r\n{}"),
            ("response-anylock+1", "garbage"),
            ("response-anylock+9", "HTTP/1.1 404 Not Found\r\n\r\n{}"),
            ("response-other+0", "HTTP/1.1 404 Not Found\r\n\r\n{}"),
        ]);
        let answers = parse_reply("multipart/mixed; boundary=b", &body, 2).unwrap();
        assert!(
            answers
                .iter()
                .all(|a| matches!(a, PartAnswer::Unreadable(_)))
        );
        let short = reply(&[(
            "response-anylock+0",
            "HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n{}",
        )]);
        let answers = parse_reply("multipart/mixed; boundary=b", &short, 1).unwrap();
        assert!(matches!(answers[0], PartAnswer::Unreadable(_)));
    }

    /// fake-gcs-server's framing (seen with `curl` against it): `Content-Id`, no
    /// `Content-Length`, the body ends with a newline before the delimiter's CRLF.
    #[test]
    fn fake_gcs_server_framing_is_read() {
        let body = format!(
            "--bd0e\r\nContent-Id: <response-anylock+0>\r\nContent-Type: application/http\r\n\r\n\
             HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Type: application/json\r\n\r\n\
             {OBJECT}\n\r\n--bd0e\r\nContent-Id: <response-anylock+1>\r\n\
             Content-Type: application/http\r\n\r\nHTTP/1.1 404 Not Found\r\n\
             Connection: close\r\nContent-Type: application/json\r\n\r\n\
             {{\"error\":{{\"code\":404}}}}\n\r\n--bd0e--"
        );
        let answers = parse_reply("multipart/mixed; boundary=bd0e", body.as_bytes(), 2).unwrap();
        assert!(matches!(&answers[0], PartAnswer::Reply(Reply::Ok(Some(o))) if o.generation == 7));
        assert!(matches!(answers[1], PartAnswer::Reply(Reply::NotFound)));
    }

    #[test]
    fn a_reply_that_is_not_multipart_mixed_fails_whole() {
        let err = parse_reply("application/json", b"{}", 1).unwrap_err();
        assert_eq!(err.kind(), lockcore::ErrorKind::OutcomeUnknown);
    }

    /// A reply cut short after an answer's headers would read as a 200 without a body
    /// (no `Content-Length` in fake-gcs-server's framing): the whole reply is unknown.
    #[test]
    fn a_truncated_reply_fails_whole_as_unknown() {
        let whole = reply(&[("response-anylock+0", "HTTP/1.1 200 OK\r\n\r\n{}")]);
        let cut = b"--b\r\nContent-Type: application/http\r\nContent-ID: <response-anylock+0>\r\n\r\nHTTP/1.1 200 OK\r\n\r\n";
        assert!(parse_reply("multipart/mixed; boundary=b", &whole, 1).is_ok());
        let err = parse_reply("multipart/mixed; boundary=b", cut, 1).unwrap_err();
        assert_eq!(err.kind(), lockcore::ErrorKind::OutcomeUnknown);
    }
}
