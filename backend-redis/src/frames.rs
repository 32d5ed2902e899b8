//! Where each RESP2/RESP3 reply begins and ends, found by reading its headers byte by byte
//! without keeping the bytes ([`Scanner`]), and the [`Limits`] a reply must keep. Pure code:
//! the stream adapter ([`Bounded`](crate::bounded::Bounded)) feeds it what it reads.
//!
//! The scanner reads the headers as the `redis` crate's parser does (a length is the line's
//! trimmed text as an `i64`; `$`, `*` and `~` with a negative length are nil; `>` with none
//! is an empty push), so every reply that parser accepts within the limits passes, and it
//! refuses a header the parser could only answer by allocating past them.

use crate::limits::{MAX_BATCH, MAX_ELEMENTS, MAX_LINE, MAX_REPLY, MAX_VALUE, MAX_VALUES, Refused};

/// The limits one direction of a connection keeps (`u64::MAX`: none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    value: u64,
    line: u64,
    elements: u64,
    values: u64,
    reply: u64,
    /// Bytes read between two [`Scanner::end_batch`] calls.
    batch: u64,
}

const fn wide(n: usize) -> u64 {
    n as u64
}

impl Limits {
    /// The replies on a command connection: every limit of [`crate::limits`].
    pub(crate) const REPLIES: Limits = Limits {
        value: wide(MAX_VALUE),
        line: wide(MAX_LINE),
        elements: wide(MAX_ELEMENTS),
        values: wide(MAX_VALUES),
        reply: wide(MAX_REPLY),
        batch: wide(MAX_BATCH),
    };
    /// The messages on a pub/sub connection: each is a reply, but they come unasked and
    /// are handed on one at a time, so no batch budget.
    pub(crate) const MESSAGES: Limits = Limits {
        batch: u64::MAX,
        ..Self::REPLIES
    };
    /// Our own commands (counted, never refused).
    pub(crate) const NONE: Limits = Limits {
        value: u64::MAX,
        line: u64::MAX,
        elements: u64::MAX,
        values: u64::MAX,
        reply: u64::MAX,
        batch: u64::MAX,
    };
}

/// The longest length header read (`$`, `*`, …): a 64-bit number with room for padding.
const HEADER: usize = 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Expecting the type byte of a value.
    Type,
    /// Reading the line after the type byte `kind`, `len` bytes so far; `cr` after a `\r`.
    Line { kind: u8, len: u64, cr: bool },
    /// Skipping the rest of a string value: `left` bytes, its CRLF included.
    Body { left: u64 },
}

/// Follows the RESP framing of one direction of a connection.
#[derive(Debug, Clone)]
pub(crate) struct Scanner {
    limits: Limits,
    state: State,
    /// A length header's bytes (they are short: see [`HEADER`]).
    header: [u8; HEADER],
    /// Values of the current reply not read yet (0 between replies).
    expected: u64,
    /// Values of the current reply read or announced.
    values: u64,
    /// Bytes of the current reply.
    bytes: u64,
    /// Bytes since the last [`end_batch`](Self::end_batch).
    batch: u64,
    /// Whether the current reply is a RESP3 push (not the answer to a command).
    push: bool,
}

impl Scanner {
    pub(crate) fn new(limits: Limits) -> Self {
        Self {
            limits,
            state: State::Type,
            header: [0; HEADER],
            expected: 0,
            values: 0,
            bytes: 0,
            batch: 0,
            push: false,
        }
    }

    /// Reads `bytes` up to the end of the first reply that ends in them. Returns how many
    /// bytes were read and, when a reply ended, whether it was a push (`Some(true)`) or an
    /// answer (`Some(false)`). Feed the rest again.
    ///
    /// # Errors
    /// The limit the reply broke; the scanner is then of no further use.
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> Result<(usize, Option<bool>), Refused> {
        let mut at = 0;
        while at < bytes.len() {
            let read = match self.state {
                State::Body { left } => self.body(left, bytes.len() - at),
                State::Type => self.start(bytes[at]).map(|()| 1),
                State::Line { kind, len, cr } => self.line((kind, len, cr), &bytes[at..]),
            }?;
            at += read;
            self.count(read as u64)?;
            if self.expected == 0 && self.state == State::Type {
                return Ok((at, Some(self.push)));
            }
        }
        Ok((at, None))
    }

    /// Starts a new batch budget (the replies to the last batch of commands are all in).
    pub(crate) fn end_batch(&mut self) {
        // Between replies, `bytes` still holds the last one's size.
        self.batch = if self.expected == 0 { 0 } else { self.bytes };
    }

    fn count(&mut self, read: u64) -> Result<(), Refused> {
        self.bytes += read;
        self.batch += read;
        if self.bytes > self.limits.reply {
            return Err(Refused::Reply);
        }
        if self.batch > self.limits.batch {
            return Err(Refused::Batch);
        }
        Ok(())
    }

    fn body(&mut self, left: u64, available: usize) -> Result<usize, Refused> {
        let take = left.min(available as u64);
        self.state = match left - take {
            0 => State::Type,
            left => State::Body { left },
        };
        if left == take {
            self.expected -= 1;
        }
        Ok(take as usize)
    }

    /// The type byte of a value (the first of a reply when none is under way).
    fn start(&mut self, kind: u8) -> Result<(), Refused> {
        if self.expected == 0 {
            (self.expected, self.values, self.bytes) = (1, 1, 0);
            self.push = kind == b'>';
        }
        if !matches!(
            kind,
            b'+' | b'-' | b':' | b'_' | b',' | b'#' | b'(' | b'$' | b'=' | b'!'
        ) && !is_aggregate(kind)
        {
            return Err(Refused::NotResp);
        }
        self.state = State::Line {
            kind,
            len: 0,
            cr: false,
        };
        Ok(())
    }

    /// Reads the line of a value of type `kind` (`len` bytes read so far, the last one a
    /// `\r` when `cr`) from `rest`, up to its CRLF or the end of `rest`.
    fn line(&mut self, (kind, len, cr): (u8, u64, bool), rest: &[u8]) -> Result<usize, Refused> {
        let end = line_end(rest, cr);
        let take = end.map_or(rest.len(), |i| i + 1);
        let total = len + take as u64;
        if has_length(kind) {
            // The header, its CRLF included, is kept to read the length.
            let slot = self.header.get_mut(len as usize..total as usize);
            slot.ok_or(Refused::NotResp)?.copy_from_slice(&rest[..take]);
        } else {
            // Its content: without the CRLF, or without a last `\r` that may start it.
            let open_cr = u64::from(rest[take - 1] == b'\r');
            let content = end.map_or(total - open_cr, |_| total - 2);
            if content > self.limits.line {
                return Err(Refused::Line);
            }
        }
        match end {
            Some(_) => self.header_done(kind, total - 2)?,
            None => {
                let cr = rest[take - 1] == b'\r';
                self.state = State::Line {
                    kind,
                    len: total,
                    cr,
                };
            }
        }
        Ok(take)
    }

    fn header_done(&mut self, kind: u8, len: u64) -> Result<(), Refused> {
        self.state = State::Type;
        if !has_length(kind) {
            self.expected -= 1;
            return Ok(());
        }
        let text = std::str::from_utf8(&self.header[..len as usize]);
        let n: i64 = match text.map(|t| t.trim().parse()) {
            Ok(Ok(n)) => n,
            _ => return Err(Refused::NotResp),
        };
        match kind {
            b'$' | b'=' | b'!' => self.string(kind, n),
            _ => self.aggregate(kind, n),
        }
    }

    fn string(&mut self, kind: u8, n: i64) -> Result<(), Refused> {
        let (limit, refused) = match kind {
            b'!' => (self.limits.line, Refused::Line),
            _ => (self.limits.value, Refused::Value),
        };
        if kind == b'$' && n < 0 {
            self.expected -= 1;
            return Ok(());
        }
        // A negative `!` or `=` length is read as a huge one by the parser.
        let n = u64::try_from(n).map_err(|_| refused)?;
        if n > limit {
            return Err(refused);
        }
        self.state = State::Body { left: n + 2 };
        Ok(())
    }

    fn aggregate(&mut self, kind: u8, n: i64) -> Result<(), Refused> {
        self.expected -= 1;
        let nil = n < 0 && matches!(kind, b'*' | b'~') || n <= 0 && kind == b'>';
        if nil {
            return Ok(());
        }
        let n = u64::try_from(n).map_err(|_| Refused::Elements)?;
        let elements = match kind {
            b'%' => n.saturating_mul(2),
            b'|' => n.saturating_mul(2).saturating_add(1),
            _ => n,
        };
        if elements > self.limits.elements {
            return Err(Refused::Elements);
        }
        self.values = self.values.saturating_add(elements);
        if self.values > self.limits.values {
            return Err(Refused::Values);
        }
        self.expected += elements;
        Ok(())
    }
}

/// Whether values of type `kind` hold other values.
fn is_aggregate(kind: u8) -> bool {
    matches!(kind, b'*' | b'%' | b'|' | b'~' | b'>')
}

/// Whether the line of type `kind` is a length (of a string or an aggregate).
fn has_length(kind: u8) -> bool {
    matches!(kind, b'$' | b'=' | b'!') || is_aggregate(kind)
}

/// Where the line in `rest` ends: the index of the `\n` right after a `\r` (`cr`: the
/// byte before `rest` was a `\r`).
fn line_end(rest: &[u8], cr: bool) -> Option<usize> {
    let mut from = 0;
    while let Some(i) = rest[from..].iter().position(|&b| b == b'\n') {
        let at = from + i;
        let after_cr = match at {
            0 => cr,
            _ => rest[at - 1] == b'\r',
        };
        if after_cr {
            return Some(at);
        }
        from = at + 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `wire` in pieces of `chunk` bytes; the replies that ended (push or not), or
    /// the refusal.
    fn scan(limits: Limits, wire: &[u8], chunk: usize) -> Result<Vec<bool>, Refused> {
        let mut scanner = Scanner::new(limits);
        let mut ended = Vec::new();
        for piece in wire.chunks(chunk) {
            let mut rest = piece;
            while !rest.is_empty() {
                let (read, done) = scanner.feed(rest)?;
                ended.extend(done);
                rest = &rest[read..];
            }
        }
        Ok(ended)
    }

    #[test]
    fn replies_end_where_the_parser_ends_them() {
        let wire = b"+OK\r\n:42\r\n$5\r\nhe\r\no\r\n$-1\r\n*2\r\n$1\r\na\r\n*-1\r\n\
            %1\r\n+k\r\n:1\r\n>2\r\n+message\r\n$0\r\n\r\n_\r\n,1.5\r\n#t\r\n(12\r\n\
            !3\r\nERR\r\n=7\r\ntxt:abc\r\n~0\r\n|1\r\n+a\r\n+b\r\n:1\r\n-ERR x\r\n*0\r\n";
        let mut expected = vec![false; 17];
        expected[6] = true;
        for chunk in [1, 2, 3, 7, wire.len()] {
            assert_eq!(
                scan(Limits::REPLIES, wire, chunk),
                Ok(expected.clone()),
                "{chunk}"
            );
        }
        // Padded lengths, as the parser trims them.
        assert_eq!(scan(Limits::REPLIES, b"$ 2 \r\nab\r\n", 1), Ok(vec![false]));
    }

    #[test]
    fn huge_headers_are_refused_before_their_payload() {
        let refused = |wire: &[u8]| scan(Limits::REPLIES, wire, 4).expect_err("refused");
        assert_eq!(refused(b"$8589934592\r\n"), Refused::Value);
        assert_eq!(refused(b"$1048577\r\n"), Refused::Value);
        assert_eq!(refused(b"=-2\r\n"), Refused::Value);
        assert_eq!(refused(b"!-1\r\n"), Refused::Line);
        assert_eq!(refused(b"!65537\r\n"), Refused::Line);
        assert_eq!(refused(b"*2000000000\r\n"), Refused::Elements);
        assert_eq!(refused(b"%50001\r\n"), Refused::Elements);
        assert_eq!(refused(b"%-1\r\n"), Refused::Elements);
        assert_eq!(refused(b"@\r\n"), Refused::NotResp);
        assert_eq!(refused(b"$abc\r\n"), Refused::NotResp);
        assert_eq!(
            refused(b"$99999999999999999999999999999999999\r\n"),
            Refused::NotResp
        );
        let long_line = [b"-".as_slice(), &[b'E'; MAX_LINE + 1]].concat();
        assert_eq!(refused(&long_line), Refused::Line);
        let nested = b"*100000\r\n*100000\r\n*100000\r\n";
        assert_eq!(refused(nested), Refused::Values);
        // 1,000 values of 1 MiB in one array: cut at 64 MiB.
        let mut scanner = Scanner::new(Limits::REPLIES);
        assert_eq!(scanner.feed(b"*1000\r\n"), Ok((7, None)));
        let value = [
            format!("${MAX_VALUE}\r\n").as_bytes(),
            &[b'x'; MAX_VALUE],
            b"\r\n",
        ]
        .concat();
        let fed = (0..1000)
            .take_while(|_| scanner.feed(&value).is_ok())
            .count();
        assert_eq!(fed, MAX_REPLY / value.len());
        assert_eq!(
            scanner.feed(&value),
            Err(Refused::Reply),
            "and stays refused"
        );
    }

    #[test]
    fn the_largest_lines_and_values_pass() {
        let line = [b"+".as_slice(), &[b'x'; MAX_LINE], b"\r\n"].concat();
        assert_eq!(scan(Limits::REPLIES, &line, 1000), Ok(vec![false]));
        let value = [
            format!("${MAX_VALUE}\r\n").as_bytes(),
            &[b'\n'; MAX_VALUE],
            b"\r\n",
        ]
        .concat();
        assert_eq!(scan(Limits::REPLIES, &value, 4096), Ok(vec![false]));
        let wide = format!("*{MAX_ELEMENTS}\r\n{}", ":1\r\n".repeat(MAX_ELEMENTS));
        assert_eq!(scan(Limits::REPLIES, wide.as_bytes(), 512), Ok(vec![false]));
    }

    #[test]
    fn a_batch_shares_one_budget_until_it_ends() {
        let mut scanner = Scanner::new(Limits::REPLIES);
        let reply = [
            format!("${MAX_VALUE}\r\n").as_bytes(),
            &[b'x'; MAX_VALUE],
            b"\r\n",
        ]
        .concat();
        let mut fed = 0;
        let refused = loop {
            match scanner.feed(&reply) {
                Ok((read, done)) => {
                    assert_eq!((read, done), (reply.len(), Some(false)));
                    fed += 1;
                }
                Err(refused) => break refused,
            }
        };
        assert_eq!((refused, fed), (Refused::Batch, MAX_BATCH / reply.len()));
        let mut scanner = Scanner::new(Limits::REPLIES);
        for _ in 0..2 * MAX_BATCH / reply.len() {
            assert_eq!(scanner.feed(&reply), Ok((reply.len(), Some(false))));
            scanner.end_batch();
        }
        let mut messages = Scanner::new(Limits::MESSAGES);
        for _ in 0..2 * MAX_BATCH / reply.len() {
            assert_eq!(messages.feed(&reply), Ok((reply.len(), Some(false))));
        }
    }

    #[test]
    fn commands_are_counted_without_limits() {
        let mut scanner = Scanner::new(Limits::NONE);
        let big = [
            b"*2\r\n$4\r\nECHO\r\n$2000000\r\n".as_slice(),
            &[b'x'; 2_000_000],
            b"\r\n",
        ]
        .concat();
        assert_eq!(scanner.feed(&big), Ok((big.len(), Some(false))));
    }
}
