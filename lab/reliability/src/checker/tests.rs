//! The checker must be able to fail: each test builds a history (through the real
//! [`Register`], so the fenced decisions are the register's own) that contains exactly the
//! violation it names, and a clean history that contains none.

use super::*;
use crate::protocol::Request;
use crate::register::{Mode, Register};

const MS: u64 = 1000;

/// A script of one client's requests, at register times in milliseconds.
struct Script {
    register: Register,
}

impl Script {
    fn new(mode: Mode) -> Self {
        Self {
            register: Register::new(mode),
        }
    }

    fn at(&mut self, ms: u64, request: Request) -> &mut Self {
        self.register.apply(request, ms * MS);
        self
    }

    fn begin(&mut self, ms: u64, c: u32, s: u64, token: u64) -> &mut Self {
        self.at(
            ms,
            Request::Begin {
                id: sid(c, s),
                token: Some(token),
            },
        )
    }

    fn read(&mut self, ms: u64, c: u32, s: u64, token: u64) -> &mut Self {
        self.at(
            ms,
            Request::Read {
                id: sid(c, s),
                token: Some(token),
            },
        )
    }

    fn check(&mut self, ms: u64, c: u32, s: u64, remaining_ms: u64) -> &mut Self {
        self.at(
            ms,
            Request::Check {
                id: sid(c, s),
                held: true,
                remaining_ms,
            },
        )
    }

    fn write(&mut self, ms: u64, c: u32, s: u64, token: u64, read: u64) -> &mut Self {
        self.at(
            ms,
            Request::Write {
                id: sid(c, s),
                token: Some(token),
                read,
                new: read + 1,
            },
        )
    }

    fn end(&mut self, ms: u64, c: u32, s: u64) -> &mut Self {
        self.at(
            ms,
            Request::End {
                id: sid(c, s),
                outcome: Outcome::Done,
            },
        )
    }

    fn lost(&mut self, ms: u64, c: u32, s: u64, margin_ms: i64) -> &mut Self {
        self.at(
            ms,
            Request::Lost {
                id: sid(c, s),
                margin_ms,
                reason: "too-many-failures".into(),
            },
        )
    }

    /// One clean read-modify-write section of client `c` starting at `ms`, reading `value`.
    fn cycle(&mut self, ms: u64, c: u32, s: u64, token: u64, value: u64) -> &mut Self {
        self.begin(ms, c, s, token)
            .read(ms + 1, c, s, token)
            .check(ms + 2, c, s, 1000)
            .write(ms + 300, c, s, token, value)
            .end(ms + 301, c, s)
    }

    fn counts(&self) -> Counts {
        check(self.register.history())
    }

    /// The counts for a semaphore of `limit` permits.
    fn permits(&self, limit: u32) -> Counts {
        check_with(self.register.history(), limit)
    }
}

fn sid(client: u32, section: u64) -> SectionId {
    SectionId { client, section }
}

/// Kleppmann's diagram: client 1 checks, pauses past its lease, and writes after client 2
/// took the lock and wrote.
fn paused_writer(mode: Mode) -> Counts {
    Script::new(mode)
        .begin(0, 1, 1, 33)
        .read(1, 1, 1, 33)
        .check(2, 1, 1, 1000)
        // paused here for 5 s; the lease expires at ~1 s and client 2 is granted at 2 s
        .cycle(2000, 2, 1, 34, 0)
        .write(5000, 1, 1, 33, 0)
        .end(5001, 1, 1)
        .counts()
}

#[test]
fn a_clean_history_has_no_violations() {
    let counts = Script::new(Mode::Fenced)
        .cycle(0, 1, 1, 1, 0)
        .cycle(400, 2, 1, 2, 1)
        .cycle(800, 3, 1, 3, 2)
        .cycle(1200, 1, 2, 4, 3)
        .counts();
    assert_eq!(counts.sections, 4);
    assert_eq!(counts.completed, 4);
    assert_eq!(counts.writes_accepted, 4);
    assert_eq!(counts.final_value, 4);
    let violations = [
        counts.overlaps,
        counts.double_grants,
        counts.stale_accepted,
        counts.stale_rejected,
        counts.fresh_rejected,
        counts.lost_updates,
        counts.lost_late,
        counts.refused,
        counts.token_repeats,
    ];
    assert_eq!(violations, [0; 9], "{counts:#?}");
    assert!(counts.examples.is_empty());
}

#[test]
fn an_unfenced_paused_writer_overlaps_writes_stale_and_loses_an_update() {
    let counts = paused_writer(Mode::Unfenced);
    assert_eq!(counts.overlaps, 1, "{counts:#?}");
    assert_eq!(counts.stale_accepted, 1);
    assert_eq!(
        counts.lost_updates, 1,
        "both wrote 1: one increment vanished"
    );
    assert_eq!(counts.final_value, 1);
    assert_eq!(
        counts.double_grants, 0,
        "client 2 was granted after client 1's checked validity ran out"
    );
    assert!(counts.examples[0].starts_with("stale write accepted: client 1 section 1"));
}

#[test]
fn a_fenced_register_refuses_the_paused_writer() {
    let counts = paused_writer(Mode::Fenced);
    assert_eq!(counts.overlaps, 1, "the lock still let both in");
    assert_eq!(counts.stale_accepted, 0, "{counts:#?}");
    assert_eq!(counts.stale_rejected, 1);
    assert_eq!(counts.lost_updates, 0);
    assert_eq!(counts.final_value, 1);
}

#[test]
fn a_grant_inside_the_holders_checked_validity_is_a_double_grant() {
    let counts = Script::new(Mode::Unfenced)
        .begin(0, 1, 1, 7)
        .read(10, 1, 1, 7)
        .check(11, 1, 1, 1500) // valid until at least 1.51 s
        .cycle(1000, 2, 1, 8, 0) // granted at 1.0 s
        .write(1200, 1, 1, 7, 0)
        .end(1201, 1, 1)
        .counts();
    assert_eq!(counts.double_grants, 1, "{counts:#?}");
    assert!(counts.examples[0].contains("valid until 1.510 s"));
    assert_eq!(counts.overlaps, 1);
}

#[test]
fn a_grant_after_the_holder_gave_up_early_is_still_a_double_grant() {
    // The holder's guard turned Lost and the library released the lease while the holder's
    // write, started within the validity it had been told, was still on its way.
    let counts = Script::new(Mode::Unfenced)
        .begin(0, 1, 1, 7)
        .read(10, 1, 1, 7)
        .check(11, 1, 1, 1500)
        .lost(400, 1, 1, 1100)
        .cycle(402, 2, 1, 8, 0)
        .write(410, 1, 1, 7, 0)
        .end(411, 1, 1)
        .counts();
    assert_eq!(counts.double_grants, 1, "{counts:#?}");
    assert!(counts.examples[0].contains("reported Lost (too-many-failures) at 0.400 s"));
    assert_eq!(
        counts.lost_late, 0,
        "the signal itself came before the next grant"
    );
}

#[test]
fn a_release_ends_the_holders_promise() {
    let counts = Script::new(Mode::Unfenced)
        .begin(0, 1, 1, 7)
        .read(1, 1, 1, 7)
        .check(2, 1, 1, 1500)
        .write(300, 1, 1, 7, 0)
        .end(301, 1, 1) // released early, long before 1.5 s
        .cycle(310, 2, 1, 8, 1)
        .counts();
    assert_eq!(
        (counts.double_grants, counts.overlaps),
        (0, 0),
        "{counts:#?}"
    );
}

#[test]
fn an_interleaved_read_modify_write_is_a_lost_update() {
    // Both read 0 inside overlapping sections; the first write is stale only for client 1
    // (client 2 entered later), and one increment is lost either way.
    let counts = Script::new(Mode::Unfenced)
        .begin(0, 1, 1, 1)
        .read(1, 1, 1, 1)
        .begin(2, 2, 1, 2)
        .read(3, 2, 1, 2)
        .write(4, 2, 1, 2, 0)
        .write(5, 1, 1, 1, 0)
        .end(6, 1, 1)
        .end(7, 2, 1)
        .counts();
    assert_eq!(counts.lost_updates, 1, "{counts:#?}");
    assert_eq!(counts.stale_accepted, 1);
    assert_eq!(counts.overlaps, 1);
}

#[test]
fn lost_signals_after_a_new_grant_or_with_a_negative_margin_are_late() {
    let counts = Script::new(Mode::Unfenced)
        .begin(0, 1, 1, 1)
        .lost(100, 1, 1, 900) // timely
        .end(101, 1, 1)
        .begin(2000, 2, 1, 2)
        .lost(2100, 2, 1, -50) // fired after the server could have expired the lease
        .end(2101, 2, 1)
        .begin(3000, 3, 1, 3)
        .begin(6000, 1, 2, 4)
        .lost(6500, 3, 1, 10) // fired after client 1 was granted again
        .counts();
    assert_eq!(counts.lost_signals, 3);
    assert_eq!(counts.lost_late, 2, "{counts:#?}");
    assert_eq!(counts.lost_min_margin_ms, Some(-50));
}

#[test]
fn refusals_without_a_newer_grant_cost_liveness_not_safety() {
    // A server that forgot its fence counter hands out token 1 again.
    let counts = Script::new(Mode::Fenced)
        .cycle(0, 1, 1, 5, 0)
        .begin(400, 2, 1, 1) // refused: 1 < 5
        .counts();
    assert_eq!(counts.refused, 1);
    assert_eq!(counts.sections, 1);
    let counts = Script::new(Mode::Fenced)
        .begin(0, 1, 1, 5)
        .at(
            1,
            Request::Write {
                id: sid(2, 1),
                token: Some(4),
                read: 0,
                new: 1,
            },
        )
        .counts();
    assert_eq!((counts.fresh_rejected, counts.stale_rejected), (1, 0));
}

/// A server that rolled its fence counter back hands out a token again: the fenced
/// register refuses the lower repeat but accepts the one equal to its highest, so only
/// counting repeats shows the rollback (issue #14, `redis-snapshot-rollback`).
#[test]
fn repeated_tokens_after_a_rollback_are_counted() {
    let counts = Script::new(Mode::Fenced)
        .cycle(0, 1, 1, 10, 0)
        .cycle(400, 2, 1, 11, 1)
        .cycle(800, 3, 1, 12, 2)
        // rolled back to the counter after token 10
        .cycle(1200, 1, 2, 11, 3)
        .cycle(1600, 2, 2, 12, 3)
        .counts();
    assert_eq!(counts.token_repeats, 2, "{counts:?}");
    assert!(counts.examples.iter().any(|e| e.contains("repeated token")));
    let clean = Script::new(Mode::Fenced)
        .cycle(0, 1, 1, 10, 0)
        .cycle(400, 2, 1, 13, 1)
        .counts();
    assert_eq!(clean.token_repeats, 0, "{clean:?}");
}

/// Issue #18: three holders of a semaphore of two permits, each inside the validity its own
/// check reported: an over-grant, which the lock's definitions would count twice.
#[test]
fn three_valid_permits_of_two_are_an_over_grant() {
    let mut script = Script::new(Mode::Unfenced);
    script
        .begin(0, 1, 1, 10)
        .check(1, 1, 1, 1500)
        .begin(100, 2, 1, 11)
        .check(101, 2, 1, 1500)
        .begin(200, 3, 1, 12) // both others valid until ~1.5 s: one too many
        .check(201, 3, 1, 1500)
        .end(400, 1, 1)
        .end(401, 2, 1)
        .end(402, 3, 1);
    let counts = script.permits(2);
    assert_eq!(counts.limit, 2);
    assert_eq!(counts.double_grants, 1, "{counts:#?}");
    assert_eq!(counts.overlaps, 1, "one section entered with two open");
    assert_eq!(counts.max_inside, 3);
    assert!(
        counts.examples[0].starts_with("over-grant: client 3 section 1 entered at 0.200 s while 2"),
        "{counts:#?}"
    );
    assert!(counts.examples[0].contains("client 1 section 1 (valid until 1.500 s)"));
    let as_a_lock = script.counts();
    assert_eq!(
        (as_a_lock.double_grants, as_a_lock.overlaps),
        (2, 2),
        "for a lock both later grants are double"
    );
}

#[test]
fn two_valid_permits_of_two_are_no_over_grant() {
    let counts = Script::new(Mode::Unfenced)
        .begin(0, 1, 1, 10)
        .check(1, 1, 1, 1500)
        .begin(100, 2, 1, 11)
        .check(101, 2, 1, 1500)
        .end(400, 1, 1)
        .begin(410, 3, 1, 12) // client 1 released: room for one
        .check(411, 3, 1, 1500)
        .lost(420, 2, 1, 900) // client 3's entry displaced nobody
        .end(421, 2, 1)
        .end(500, 3, 1)
        .permits(2);
    let violations = [counts.double_grants, counts.overlaps, counts.lost_late];
    assert_eq!(violations, [0; 3], "{counts:#?}");
    assert_eq!(counts.max_inside, 2, "the limit was reached");
}

/// A permit holder paused past its lease: a third section enters once the paused holder's
/// checked validity ran out. Three were inside at once (shown, not an over-grant), and the
/// paused holder's late write and `LOST` come after it was displaced.
#[test]
fn a_paused_permit_holder_is_displaced_not_over_granted() {
    let counts = Script::new(Mode::Unfenced)
        .begin(0, 1, 1, 10)
        .read(1, 1, 1, 10)
        .check(2, 1, 1, 1000) // valid until ~1.0 s, then paused
        .begin(100, 2, 1, 11)
        .check(101, 2, 1, 5000)
        .begin(2000, 3, 1, 12) // client 1's lease is gone; client 2 still valid
        .check(2001, 3, 1, 1500)
        .write(5000, 1, 1, 10, 0) // the paused write lands
        .lost(5001, 1, 1, -4000)
        .end(5002, 1, 1)
        .end(5003, 2, 1)
        .end(5004, 3, 1)
        .permits(2);
    assert_eq!(counts.double_grants, 0, "{counts:#?}");
    assert_eq!(counts.overlaps, 1);
    assert_eq!(counts.max_inside, 3);
    assert_eq!(counts.stale_accepted, 1, "{counts:#?}");
    assert_eq!(counts.lost_late, 1);
}
