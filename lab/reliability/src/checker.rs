//! The checker: a register history in, counts of what went wrong out. Pure code.
//!
//! Definitions (all times are the register's single clock):
//! - A section is *entered* when its `BEGIN` was accepted; it is *open* until its `END`
//!   (or its last event, if it never ended).
//! - **Overlapping section**: a section that was entered while another client's section
//!   was open. This is what the resource saw: two clients inside at once.
//! - **Double grant**: a section that was entered while another section's lease was still
//!   valid by that holder's own last check. A `CHECK` reporting `remaining_ms` right after
//!   the reply stamped `t` promises the lease until at least `t + remaining_ms`; the promise
//!   ends early at the holder's `END` (it releases after it). The holder's lease was
//!   therefore still valid when the next grant was made: the lock granted it twice. A
//!   holder that pauses *after* its check and writes late overlaps, but is no double grant.
//! - **Stale write**: a write that arrived after a section entered later than the writer's
//!   own had begun: the writer's grant had been superseded. Counted as accepted or refused.
//! - **Lost update**: an increment that is missing from the counter: accepted writes minus
//!   the counter's final value (every write stores what it read plus one).
//! - **Repeated token**: a section that began with a fencing token an earlier section had
//!   already begun with. Grants never share a token, so this is the lock going back in time
//!   (a server that rolled its fence counter back), whatever the register decided.
//! - **Late Lost signal**: a `LOST` that arrived after another section had been entered,
//!   or whose client-side margin to the earliest server expiry was negative.
//!
//! With a *limit* of N (a semaphore of N permits, issue #18; 1 for a lock or a leader)
//! "another" becomes "N others": a section *overlaps* when it was entered while N other
//! clients' sections were open, it is an **over-grant** (counted as a double grant) when
//! N other holders' leases were still valid by their own checks, and a section is
//! *displaced* (its later writes stale, its later `LOST` late) by a section entered while
//! it and N − 1 others were valid by their own checks. For N = 1 these are the lock's
//! definitions above.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::history::{Event, Op};
use crate::protocol::{Outcome, SectionId};

/// How many violations are described as evidence, at most.
const MAX_EXAMPLES: usize = 9;

/// What the checker found in one history.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// How many sections may be open at once: 1 for a lock or a leader, N for permits.
    pub limit: u32,
    /// Sections entered (`BEGIN` accepted).
    pub sections: u64,
    /// `BEGIN`s a fenced register refused.
    pub refused: u64,
    /// Sections that wrote every step.
    pub completed: u64,
    /// Writes accepted.
    pub writes_accepted: u64,
    /// Writes refused.
    pub writes_rejected: u64,
    /// Sections entered while `limit` other clients' sections were open.
    pub overlaps: u64,
    /// The most sections open at once (`BEGIN` to `END` at the register).
    pub max_inside: u64,
    /// Sections entered while `limit` other holders' leases were still valid by their own
    /// checks: double grants of a lock, over-grants of a semaphore.
    pub double_grants: u64,
    /// Stale writes the register accepted.
    pub stale_accepted: u64,
    /// Stale writes the register refused.
    pub stale_rejected: u64,
    /// Refused writes that were not stale (fencing cost liveness, not safety).
    pub fresh_rejected: u64,
    /// Increments missing from the counter.
    pub lost_updates: u64,
    /// Sections that began with a token an earlier section had already begun with.
    pub token_repeats: u64,
    /// The counter's final value.
    pub final_value: u64,
    /// `LOST` signals received.
    pub lost_signals: u64,
    /// `LOST` signals that fired too late (see the module docs).
    pub lost_late: u64,
    /// The smallest client-side margin of a `LOST` signal, in milliseconds.
    pub lost_min_margin_ms: Option<i64>,
    /// A few violations, described, as evidence.
    pub examples: Vec<String>,
}

#[derive(Debug, Default)]
struct Section {
    begin: Option<u64>,
    end: u64,
    ended: bool,
    promise: Option<u64>,
    /// When the guard first reported `Lost`, and why.
    lost: Option<(u64, String)>,
}

impl Section {
    /// Until when the holder was entitled to the lock by its own checks.
    fn promise_end(&self) -> Option<u64> {
        let promise = self.promise?;
        Some(if self.ended {
            promise.min(self.end)
        } else {
            promise
        })
    }
}

/// Counts the violations in `history` (in register order) of a lock: one holder at a time.
pub fn check(history: &[Event]) -> Counts {
    check_with(history, 1)
}

/// Counts the violations in `history` of a primitive that admits `limit` holders at once
/// (a semaphore of `limit` permits; 1 is [`check`]).
pub fn check_with(history: &[Event], limit: u32) -> Counts {
    let limit = limit.max(1);
    let sections = sections(history);
    let entered: Vec<Entered<'_>> = sections
        .iter()
        .filter_map(|(id, s)| s.begin.map(|b| (*id, s, b)))
        .collect();
    let mut counts = Counts {
        limit,
        sections: entered.len() as u64,
        ..Counts::default()
    };
    count_grants(&entered, &mut counts);
    count_repeats(history, &mut counts);
    for event in history {
        let begun = sections.get(&event.id).and_then(|s| s.begin).unwrap_or(0);
        let superseded = || displaced_by(&entered, limit, event.id, begun, event.at_us);
        match &event.op {
            Op::Begin {
                accepted: false, ..
            } => counts.refused += 1,
            Op::Write { accepted, new, .. } => {
                record_write(&mut counts, event, *accepted, superseded());
                if *accepted {
                    counts.final_value = *new;
                }
            }
            Op::End {
                outcome: Outcome::Done,
            } => counts.completed += 1,
            Op::Lost { margin_ms, reason } => {
                record_lost(&mut counts, event, *margin_ms, reason, superseded());
            }
            _ => {}
        }
    }
    counts.lost_updates = counts.writes_accepted.saturating_sub(counts.final_value);
    counts
}

/// An entered section: its id, its record, and when it was entered.
type Entered<'a> = (SectionId, &'a Section, u64);

/// Another section entered after `after` and before `before` that displaced `id`: with a
/// lock any such section, with `limit` permits one entered while `limit - 1` sections
/// other than `id` and itself were valid by their own checks.
fn displaced_by(
    entered: &[Entered<'_>],
    limit: u32,
    id: SectionId,
    after: u64,
    before: u64,
) -> Option<(SectionId, u64)> {
    entered
        .iter()
        .filter(|(other, _, b)| *other != id && after < *b && *b < before)
        .find(|(other, _, b)| {
            let valid = valid_at(entered, *b).filter(|(s, _, _)| *s != id && s != other);
            valid.count() + 1 >= limit as usize
        })
        .map(|(other, _, b)| (*other, *b))
}

/// The sections entered before `at` whose holders' checks promised validity past `at`.
fn valid_at<'a, 'b>(
    entered: &'a [Entered<'b>],
    at: u64,
) -> impl Iterator<Item = &'a Entered<'b>> + 'a {
    entered
        .iter()
        .filter(move |(_, s, b)| *b < at && s.promise_end().is_some_and(|p| at < p))
}

/// Per section: when it was entered, when it ended, and until when its checks promised.
fn sections(history: &[Event]) -> BTreeMap<SectionId, Section> {
    let mut sections: BTreeMap<SectionId, Section> = BTreeMap::new();
    let mut previous: BTreeMap<SectionId, u64> = BTreeMap::new();
    for event in history {
        let section = sections.entry(event.id).or_default();
        section.end = section.end.max(event.at_us);
        match &event.op {
            Op::Begin { accepted: true, .. } => section.begin = Some(event.at_us),
            Op::Check {
                held: true,
                remaining_ms,
            } if *remaining_ms > 0 => {
                // The check ran after the previous reply; that stamp is a safe anchor.
                let anchor = previous.get(&event.id).copied().unwrap_or(event.at_us);
                let until = anchor + remaining_ms * 1000;
                section.promise = Some(section.promise.map_or(until, |p| p.max(until)));
            }
            Op::End { .. } => section.ended = true,
            Op::Lost { reason, .. } if section.lost.is_none() => {
                section.lost = Some((event.at_us, reason.clone()));
            }
            _ => {}
        }
        previous.insert(event.id, event.at_us);
    }
    sections
}

fn count_grants(entered: &[Entered<'_>], counts: &mut Counts) {
    let limit = counts.limit as usize;
    for (id, _, begin) in entered {
        let others: Vec<&Entered<'_>> = (entered.iter())
            .filter(|(other, _, b)| other.client != id.client && b < begin)
            .collect();
        let open = others.iter().filter(|(_, s, _)| *begin < s.end).count();
        counts.overlaps += u64::from(open >= limit);
        counts.max_inside = counts.max_inside.max(open as u64 + 1);
        let valid: Vec<(SectionId, &Section)> = (others.iter())
            .filter(|(_, s, _)| s.promise_end().is_some_and(|p| *begin < p))
            .map(|(other, s, _)| (*other, *s))
            .collect();
        if valid.len() < limit {
            continue;
        }
        counts.double_grants += 1;
        let text = match (limit, valid.first()) {
            (1, Some((other, section))) => double_grant(*id, *begin, *other, section),
            _ => over_grant(*id, *begin, &valid),
        };
        example(counts, text);
    }
}

fn double_grant(id: SectionId, begin: u64, other: SectionId, section: &Section) -> String {
    let lost = match &section.lost {
        Some((at, reason)) if *at <= begin => format!(
            "; its guard had reported Lost ({reason}) at {}, so its lease was given up \
             before the validity it had reported ran out",
            secs(*at)
        ),
        _ => String::new(),
    };
    format!(
        "double grant: {} entered at {} while {} held a lease valid until {} by its own check{lost}",
        name(id),
        secs(begin),
        name(other),
        secs(section.promise.unwrap_or(0))
    )
}

fn over_grant(id: SectionId, begin: u64, valid: &[(SectionId, &Section)]) -> String {
    let holders: Vec<String> = (valid.iter())
        .map(|(other, s)| {
            let lost = s.lost.as_ref().filter(|(at, _)| *at <= begin);
            let lost = lost.map_or(String::new(), |(at, reason)| {
                format!(", Lost ({reason}) at {}", secs(*at))
            });
            let until = secs(s.promise.unwrap_or(0));
            format!("{} (valid until {until}{lost})", name(*other))
        })
        .collect();
    format!(
        "over-grant: {} entered at {} while {} other holders' permits were valid by their \
         own checks: {}",
        name(id),
        secs(begin),
        valid.len(),
        holders.join(", ")
    )
}

fn count_repeats(history: &[Event], counts: &mut Counts) {
    let mut first: BTreeMap<u64, SectionId> = BTreeMap::new();
    for event in history {
        let Op::Begin {
            token: Some(token), ..
        } = event.op
        else {
            continue;
        };
        match first.get(&token) {
            None => {
                first.insert(token, event.id);
            }
            Some(earlier) if *earlier != event.id => {
                counts.token_repeats += 1;
                let text = format!(
                    "repeated token: {} began at {} with token {token}, which {} had begun with",
                    name(event.id),
                    secs(event.at_us),
                    name(*earlier)
                );
                example(counts, text);
            }
            Some(_) => {}
        }
    }
}

fn record_write(
    counts: &mut Counts,
    event: &Event,
    accepted: bool,
    stale: Option<(SectionId, u64)>,
) {
    match accepted {
        true => counts.writes_accepted += 1,
        false => counts.writes_rejected += 1,
    }
    let Some((newer, at)) = stale else {
        counts.fresh_rejected += u64::from(!accepted);
        return;
    };
    if !accepted {
        counts.stale_rejected += 1;
        return;
    }
    counts.stale_accepted += 1;
    example(
        counts,
        format!(
            "stale write accepted: {} wrote at {} after {} had entered at {}",
            name(event.id),
            secs(event.at_us),
            name(newer),
            secs(at)
        ),
    );
}

fn record_lost(
    counts: &mut Counts,
    event: &Event,
    margin_ms: i64,
    reason: &str,
    superseded: Option<(SectionId, u64)>,
) {
    counts.lost_signals += 1;
    counts.lost_min_margin_ms = Some(
        counts
            .lost_min_margin_ms
            .map_or(margin_ms, |m| m.min(margin_ms)),
    );
    if superseded.is_none() && margin_ms >= 0 {
        return;
    }
    counts.lost_late += 1;
    let after = superseded.map_or(String::new(), |(other, at)| {
        format!(", after {} had entered at {}", name(other), secs(at))
    });
    example(
        counts,
        format!(
            "late Lost signal: {} ({reason}) at {}, margin {margin_ms} ms{after}",
            name(event.id),
            secs(event.at_us)
        ),
    );
}

fn example(counts: &mut Counts, text: String) {
    if counts.examples.len() < MAX_EXAMPLES {
        counts.examples.push(text);
    }
}

fn name(id: SectionId) -> String {
    format!("client {} section {}", id.client, id.section)
}

fn secs(us: u64) -> String {
    format!("{:.3} s", us as f64 / 1e6)
}

#[cfg(test)]
mod tests;
