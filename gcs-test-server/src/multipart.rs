//! Splits a multipart body into its parts: a `multipart/related` upload's metadata and
//! media, or a `multipart/mixed` batch's calls.

use bytes::Bytes;

use crate::error::ApiError;

/// One part: its `Content-Type` and `Content-ID` (if given) and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Part {
    pub(crate) content_type: Option<String>,
    pub(crate) content_id: Option<String>,
    pub(crate) body: Bytes,
}

/// The `boundary` parameter of a content type that must be `kind` (`multipart/related`
/// for an upload, `multipart/mixed` for a batch); `what` names the call in the error.
pub(crate) fn boundary(content_type: &str, kind: &str, what: &str) -> Result<String, ApiError> {
    let mut params = content_type.split(';').map(str::trim);
    let given = params.next().unwrap_or_default();
    if !given.eq_ignore_ascii_case(kind) {
        return Err(ApiError::bad_request(format!(
            "{what} needs Content-Type {kind}, got {content_type:?}"
        )));
    }
    params
        .filter_map(|p| p.split_once('='))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("boundary"))
        .map(|(_, v)| v.trim().trim_matches('"').to_owned())
        .filter(|b| !b.is_empty())
        .ok_or_else(|| ApiError::bad_request(format!("{kind} without a boundary")))
}

/// The parts between `--boundary` delimiters, up to the closing `--boundary--`.
pub(crate) fn parts(body: &Bytes, boundary: &str) -> Result<Vec<Part>, ApiError> {
    let delimiter = format!("--{boundary}");
    let mut parts = Vec::new();
    let mut rest = find(body, delimiter.as_bytes(), 0)
        .ok_or_else(|| ApiError::bad_request("multipart body has no boundary"))?
        + delimiter.len();
    loop {
        if body[rest..].starts_with(b"--") {
            return Ok(parts);
        }
        let end = find(body, delimiter.as_bytes(), rest)
            .ok_or_else(|| ApiError::bad_request("multipart body is not closed"))?;
        parts.push(part(body.slice(rest..end))?);
        rest = end + delimiter.len();
    }
}

/// One part between delimiters: headers, a blank line, the body (the
/// CRLF before the next delimiter belongs to the delimiter).
fn part(raw: Bytes) -> Result<Part, ApiError> {
    let raw = raw.slice(skip_line_end(&raw, 0)..);
    // No headers: the blank line comes first.
    let (headers_end, body_start) = match skip_line_end(&raw, 0) {
        0 => match find(&raw, b"\r\n\r\n", 0) {
            Some(at) => (at, at + 4),
            None => find(&raw, b"\n\n", 0)
                .map(|at| (at, at + 2))
                .ok_or_else(|| ApiError::bad_request("multipart part has no header end"))?,
        },
        after_blank => (0, after_blank),
    };
    let headers = String::from_utf8_lossy(&raw[..headers_end]).into_owned();
    let mut body_end = raw.len();
    if raw[..body_end].ends_with(b"\n") {
        body_end -= 1;
        if raw[..body_end].ends_with(b"\r") {
            body_end -= 1;
        }
    }
    Ok(Part {
        content_type: header(&headers, "content-type"),
        content_id: header(&headers, "content-id"),
        body: raw.slice(body_start.min(body_end)..body_end),
    })
}

/// The value of the first header line called `name` (any case) in `headers`.
pub(crate) fn header(headers: &str, name: &str) -> Option<String> {
    headers.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.trim()
            .eq_ignore_ascii_case(name)
            .then(|| value.trim().to_owned())
    })
}

fn skip_line_end(raw: &[u8], at: usize) -> usize {
    match &raw[at..] {
        [b'\r', b'\n', ..] => at + 2,
        [b'\n', ..] => at + 1,
        _ => at,
    }
}

pub(crate) fn find(haystack: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    haystack
        .get(from..)?
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|at| at + from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_metadata_and_media() {
        let body = Bytes::from_static(
            b"--xyz\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n{\"name\":\"a\"}\r\n\
              --xyz\r\nContent-Type: text/plain\r\n\r\nhello\r\n--xyz--\r\n",
        );
        let b = boundary(
            "multipart/related; boundary=\"xyz\"",
            "multipart/related",
            "t",
        )
        .unwrap();
        let parts = parts(&body, &b).unwrap();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].body, Bytes::from_static(b"{\"name\":\"a\"}"));
        assert_eq!(parts[1].content_type.as_deref(), Some("text/plain"));
        assert_eq!(parts[1].body, Bytes::from_static(b"hello"));
    }

    #[test]
    fn empty_media_part() {
        let body = Bytes::from_static(b"--q\r\n\r\n{}\r\n--q\r\n\r\n\r\n--q--");
        let parts = parts(&body, "q").unwrap();
        assert_eq!(parts[1].body, Bytes::new());
    }

    #[test]
    fn rejects_other_content_types() {
        assert!(boundary("application/json", "multipart/related", "t").is_err());
        assert!(boundary("multipart/related; boundary=a", "multipart/mixed", "t").is_err());
    }
}
