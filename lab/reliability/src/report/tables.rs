//! The report's three tables: the lock, permits of a semaphore, leadership of an election.

use std::fmt::Write as _;

use super::cells::{claim, verdict};
use crate::checker::Counts;
use crate::primitive::{PERMIT_CLIENTS, PERMITS, Primitive};
use crate::run::CellResult;

/// The lock's table.
pub(super) fn locks(out: &mut String, results: &[CellResult]) {
    if !results.iter().any(|r| r.primitive == Primitive::Lock) {
        return;
    }
    out.push_str(
        "## Locks\n\n\
         Pairs are *unfenced / fenced* runs (the same fault, two groups of three client \
         processes side by side, one writing to a register that ignores fencing tokens and \
         one to a register that refuses stale ones). `—`: the backend issues no tokens, so \
         there is no fenced run. \"Exclusion\" and \"fencing\" say what the backend's \
         `Guarantees` descriptor claims under this fault (*documented*: only the backend's \
         documentation does): where exclusion is claimed there must be zero double grants, \
         and where fencing is claimed the fenced register must accept zero stale writes and \
         lose zero updates.\n\n",
    );
    paired(out, results, Primitive::Lock);
}

/// The leader table: the lock's columns, for `Election::campaign` .. `resign`.
pub(super) fn leaders(out: &mut String, results: &[CellResult]) {
    if !results.iter().any(|r| r.primitive == Primitive::Leader) {
        return;
    }
    out.push_str(
        "## Leader election\n\n\
         Three candidates per group campaign (`Locker::election(name)`, `campaign()`), run \
         one section while leading (`is_leader()` at every check, the term as the fencing \
         token) and `resign()`. Leadership is the lock, so the claims and columns are the \
         lock's: one leader at a time where exclusion is claimed, and the fenced register \
         refuses a write of an older term. Leader cells run the baseline, a paused leader \
         and the backend's own server fault.\n\n",
    );
    paired(out, results, Primitive::Leader);
}

fn paired(out: &mut String, results: &[CellResult], primitive: Primitive) {
    out.push_str(
        "| backend | fault | exclusion | fencing | sections | overlapping sections | double grants | \
         stale writes accepted, unfenced | stale writes accepted / refused, fenced | \
         lost updates | Lost signals: fired / late | agrees |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in results.iter().filter(|r| r.primitive == primitive) {
        out.push_str(&row(r));
    }
    out.push('\n');
}

/// One row of the lock or leader table.
fn row(r: &CellResult) -> String {
    let f = r.fenced.as_ref();
    let u = &r.unfenced;
    let pair = |get: fn(&Counts) -> u64| match f {
        Some(f) => format!("{} / {}", get(u), get(f)),
        None => format!("{} / —", get(u)),
    };
    let fenced_stale = f.map_or("—".to_owned(), |f| {
        format!("{} / {}", f.stale_accepted, f.stale_rejected + f.refused)
    });
    let (fired, late) = [Some(u), f]
        .into_iter()
        .flatten()
        .fold((0, 0), |a, c| (a.0 + c.lost_signals, a.1 + c.lost_late));
    format!(
        "| `{}` | {} | {} | {} | {} | {} | {} | {} | {} | {} | {fired} / {late} | {} |\n",
        r.kind,
        r.fault,
        claim(r.expectation.exclusion),
        claim(r.expectation.fenced),
        pair(|c| c.sections),
        pair(|c| c.overlaps),
        pair(|c| c.double_grants),
        u.stale_accepted,
        fenced_stale,
        pair(|c| c.lost_updates),
        verdict(r)
    )
}

/// The permit table.
pub(super) fn permits(out: &mut String, results: &[CellResult]) {
    let rows: Vec<&CellResult> = (results.iter())
        .filter(|r| r.primitive == Primitive::Permits)
        .collect();
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "## Permits (N = {PERMITS})\n\n\
         Each cell runs {PERMIT_CLIENTS} client processes that take one permit each of a \
         semaphore of {PERMITS} (`Locker::acquire_permit`), in one group writing to a \
         register that does not fence: with N > 1 a resource cannot refuse \"any token below the highest\", and \
         fencing by slot ownership needs to know which permit a grant replaced, which no \
         token tells (docs/reliability.md). Redlock grants no permits. \"Exclusion\" is the \
         lock's claim under the fault (`Semaphores::Supported`: permits have the lock's \
         exclusion and fencing): where it is claimed there must be zero over-grants, a \
         permit granted while {PERMITS} other holders' permits were valid by their own \
         checks. Where fencing is claimed no token may repeat. \"Most inside\" is the most \
         sections open at once at the register: {PERMITS} shows the limit was reached, more \
         that sections overlapped (a paused holder's section stays open past its lease). \
         Lost updates are not counted: {PERMITS} legitimate holders race on the counter.\n\n\
         | backend | fault | exclusion | fencing | sections | most inside at once | \
         sections entered with {PERMITS} open | over-grants | repeated tokens | \
         stale writes (after the holder was displaced) | Lost signals: fired / late | agrees |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for r in rows {
        let c = &r.unfenced;
        let _ = writeln!(
            out,
            "| `{}` | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} / {} | {} |",
            r.kind,
            r.fault,
            claim(r.expectation.exclusion),
            claim(r.expectation.fenced),
            c.sections,
            c.max_inside,
            c.overlaps,
            c.double_grants,
            c.token_repeats,
            c.stale_accepted,
            c.lost_signals,
            c.lost_late,
            verdict(r)
        );
    }
    out.push('\n');
}
