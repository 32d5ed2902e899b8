//! The fenced register's wire protocol: one text line per request, one per reply.
//!
//! ```text
//! BEGIN <client> <section> <token|->                   -> OK | REJECT <highest>
//! READ  <client> <section> <token|->                   -> VALUE <n> | REJECT <highest>
//! CHECK <client> <section> <held 0|1> <remaining ms>   -> OK
//! WRITE <client> <section> <token|-> <read> <new>      -> OK | REJECT <highest>
//! END   <client> <section> <outcome>                   -> OK
//! LOST  <client> <section> <margin ms> <reason>        -> OK
//! ```
//!
//! `-` is "no fencing token" (Redlock). A section is one lock -> read-modify-write ->
//! unlock cycle of one client; `(client, section)` names it in the history.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// How a client's critical section ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// Every step was written.
    Done,
    /// A check found the lease lost or too short for the next step.
    Invalid,
    /// The register rejected an operation (a lower fencing token than one it had seen).
    Rejected,
    /// The register or the client failed.
    Error,
    /// The client was told to stop in the middle of the section.
    Stopped,
}

impl Outcome {
    const ALL: [Outcome; 5] = [
        Outcome::Done,
        Outcome::Invalid,
        Outcome::Rejected,
        Outcome::Error,
        Outcome::Stopped,
    ];

    /// The word used on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Done => "done",
            Outcome::Invalid => "invalid",
            Outcome::Rejected => "rejected",
            Outcome::Error => "error",
            Outcome::Stopped => "stopped",
        }
    }
}

impl FromStr for Outcome {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Outcome::ALL
            .into_iter()
            .find(|o| o.as_str() == s)
            .ok_or_else(|| format!("unknown outcome {s:?}"))
    }
}

/// Which section a request belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SectionId {
    /// The client process (1-based).
    pub client: u32,
    /// The client's cycle number (1-based).
    pub section: u64,
}

/// One request from a client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// The client holds the lock and enters its critical section.
    Begin {
        /// Whose section.
        id: SectionId,
        /// The grant's fencing token.
        token: Option<u64>,
    },
    /// Read the counter.
    Read {
        /// Whose section.
        id: SectionId,
        /// The grant's fencing token.
        token: Option<u64>,
    },
    /// The client checked its lease just after the previous reply: held or not, and the
    /// validity it had left.
    Check {
        /// Whose section.
        id: SectionId,
        /// `LockGuard::is_held()`.
        held: bool,
        /// `LockGuard::remaining_validity()` in milliseconds.
        remaining_ms: u64,
    },
    /// Write the counter: `new` computed from `read`.
    Write {
        /// Whose section.
        id: SectionId,
        /// The grant's fencing token.
        token: Option<u64>,
        /// The value this client read.
        read: u64,
        /// The value it writes.
        new: u64,
    },
    /// The section is over (the client releases the lock after this reply).
    End {
        /// Whose section.
        id: SectionId,
        /// How it ended.
        outcome: Outcome,
    },
    /// The guard reported `Lost`.
    Lost {
        /// Whose section.
        id: SectionId,
        /// How long before the server could expire the lease the signal fired, by the
        /// client's clock (negative: after).
        margin_ms: i64,
        /// The `LostReason`, as one word.
        reason: String,
    },
}

/// The register's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// Accepted.
    Ok,
    /// The counter's value (for `READ`).
    Value(u64),
    /// Refused: the token is lower than `highest`, one the register already accepted.
    Reject {
        /// The highest token accepted so far.
        highest: u64,
    },
}

impl Request {
    /// The section the request is about.
    pub fn id(&self) -> SectionId {
        match self {
            Request::Begin { id, .. }
            | Request::Read { id, .. }
            | Request::Check { id, .. }
            | Request::Write { id, .. }
            | Request::End { id, .. }
            | Request::Lost { id, .. } => *id,
        }
    }
}

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let id = self.id();
        let (c, s) = (id.client, id.section);
        match self {
            Request::Begin { token, .. } => write!(f, "BEGIN {c} {s} {}", Token(*token)),
            Request::Read { token, .. } => write!(f, "READ {c} {s} {}", Token(*token)),
            Request::Check {
                held, remaining_ms, ..
            } => write!(f, "CHECK {c} {s} {} {remaining_ms}", u8::from(*held)),
            Request::Write {
                token, read, new, ..
            } => write!(f, "WRITE {c} {s} {} {read} {new}", Token(*token)),
            Request::End { outcome, .. } => write!(f, "END {c} {s} {}", outcome.as_str()),
            Request::Lost {
                margin_ms, reason, ..
            } => write!(f, "LOST {c} {s} {margin_ms} {reason}"),
        }
    }
}

impl FromStr for Request {
    type Err = String;

    fn from_str(line: &str) -> Result<Self, String> {
        let words: Vec<&str> = line.split_whitespace().collect();
        let (verb, rest) = words.split_first().ok_or("empty request")?;
        let arity = match *verb {
            "BEGIN" | "READ" | "END" => 3,
            "CHECK" | "LOST" => 4,
            "WRITE" => 5,
            other => return Err(format!("unknown request {other:?}")),
        };
        if rest.len() != arity {
            return Err(format!("{verb} takes {arity} fields, got {}", rest.len()));
        }
        let id = SectionId {
            client: number(rest[0])?,
            section: number(rest[1])?,
        };
        Ok(match *verb {
            "BEGIN" => Request::Begin {
                id,
                token: token(rest[2])?,
            },
            "READ" => Request::Read {
                id,
                token: token(rest[2])?,
            },
            "CHECK" => Request::Check {
                id,
                held: flag(rest[2])?,
                remaining_ms: number(rest[3])?,
            },
            "WRITE" => Request::Write {
                id,
                token: token(rest[2])?,
                read: number(rest[3])?,
                new: number(rest[4])?,
            },
            "END" => Request::End {
                id,
                outcome: rest[2].parse()?,
            },
            _ => Request::Lost {
                id,
                margin_ms: number(rest[2])?,
                reason: rest[3].to_owned(),
            },
        })
    }
}

impl fmt::Display for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reply::Ok => f.write_str("OK"),
            Reply::Value(v) => write!(f, "VALUE {v}"),
            Reply::Reject { highest } => write!(f, "REJECT {highest}"),
        }
    }
}

impl FromStr for Reply {
    type Err = String;

    fn from_str(line: &str) -> Result<Self, String> {
        match line.split_whitespace().collect::<Vec<_>>().as_slice() {
            ["OK"] => Ok(Reply::Ok),
            ["VALUE", v] => Ok(Reply::Value(number(v)?)),
            ["REJECT", h] => Ok(Reply::Reject {
                highest: number(h)?,
            }),
            _ => Err(format!("malformed reply {line:?}")),
        }
    }
}

/// A token on the wire: the number or `-`.
struct Token(Option<u64>);

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(t) => write!(f, "{t}"),
            None => f.write_str("-"),
        }
    }
}

fn number<T: FromStr>(word: &str) -> Result<T, String> {
    word.parse().map_err(|_| format!("not a number: {word:?}"))
}

fn token(word: &str) -> Result<Option<u64>, String> {
    match word {
        "-" => Ok(None),
        _ => number(word).map(Some),
    }
}

fn flag(word: &str) -> Result<bool, String> {
    match word {
        "0" => Ok(false),
        "1" => Ok(true),
        _ => Err(format!("not a flag: {word:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: SectionId = SectionId {
        client: 2,
        section: 7,
    };

    #[test]
    fn every_request_round_trips() {
        let requests = [
            Request::Begin {
                id: ID,
                token: Some(41),
            },
            Request::Read {
                id: ID,
                token: None,
            },
            Request::Check {
                id: ID,
                held: true,
                remaining_ms: 1500,
            },
            Request::Write {
                id: ID,
                token: Some(41),
                read: 9,
                new: 10,
            },
            Request::End {
                id: ID,
                outcome: Outcome::Rejected,
            },
            Request::Lost {
                id: ID,
                margin_ms: -20,
                reason: "validity-expired".into(),
            },
        ];
        for request in requests {
            let line = request.to_string();
            assert_eq!(line.parse::<Request>(), Ok(request), "{line}");
        }
    }

    #[test]
    fn replies_round_trip() {
        for reply in [Reply::Ok, Reply::Value(3), Reply::Reject { highest: 12 }] {
            assert_eq!(reply.to_string().parse::<Reply>(), Ok(reply));
        }
    }

    #[test]
    fn malformed_lines_are_refused() {
        for line in [
            "",
            "BEGIN 1 2",
            "BEGIN 1 2 x",
            "CHECK 1 2 2 10",
            "END 1 2 maybe",
            "FOO 1 2 3",
        ] {
            assert!(line.parse::<Request>().is_err(), "{line:?} parsed");
        }
        assert!("VALUE".parse::<Reply>().is_err());
    }
}
