//! What the report's sections say about one cell: claims, verdicts, labels, Lost totals.

use crate::checker::Counts;
use crate::expect::Claim;
use crate::primitive::Primitive;
use crate::run::CellResult;

/// A claim in words.
pub(super) fn claim(c: Claim) -> &'static str {
    match c {
        Claim::Claimed => "claimed",
        Claim::Documented => "documented",
        Claim::NotClaimed => "not claimed",
    }
}

/// Whether the cell agrees with its claims, in words.
pub(super) fn verdict(r: &CellResult) -> String {
    if !r.problems.is_empty() {
        return "**did not run**".into();
    }
    match r
        .disagreements
        .iter()
        .map(|d| d.claim)
        .min_by_key(|c| *c as u8)
    {
        None => "yes".into(),
        Some(Claim::Claimed) => "**NO**".into(),
        Some(_) => "**no** (docs)".into(),
    }
}

/// Both groups' counts of a cell.
pub(super) fn groups(r: &CellResult) -> impl Iterator<Item = &Counts> {
    [Some(&r.unfenced), r.fenced.as_ref()].into_iter().flatten()
}

/// `(fired, late)` Lost signals over `results`.
pub(super) fn lost_totals<'a>(results: impl Iterator<Item = &'a CellResult>) -> (u64, u64) {
    results
        .flat_map(groups)
        .fold((0, 0), |a, c| (a.0 + c.lost_signals, a.1 + c.lost_late))
}

/// The primitive as the report's rows name it.
pub(super) fn primitive(r: &CellResult) -> &'static str {
    match r.primitive {
        Primitive::Lock => "lock",
        Primitive::Permits => "permit",
        Primitive::Leader => "leader",
    }
}
