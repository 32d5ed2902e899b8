//! The guarantees comparison table, generated from the descriptors.

use lockcore::{Durability, ExpiryClock, Fairness, Fencing, Guarantees, Semaphores, Waiting};

/// A Markdown table with one row per `(backend, guarantees)`.
pub fn guarantees_markdown(rows: &[(&str, Guarantees)]) -> String {
    let mut out = String::from(
        "| backend | mutual exclusion | fencing tokens | expiry decided by | waiters | fairness | same-owner retake | server restart | `list` | semaphores | leader election |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for (name, g) in rows {
        let cells = [
            format!("`{name}`"),
            g.exclusion.to_string(),
            match g.fencing {
                Fencing::Monotonic => "monotonic".to_owned(),
                Fencing::None => "none".to_owned(),
            },
            match g.expiry_clock {
                ExpiryClock::Server => "server clock".to_owned(),
                ExpiryClock::Client => "client clocks".to_owned(),
            },
            match g.waiting {
                Waiting::Notified => "notified".to_owned(),
                Waiting::Polled => "poll".to_owned(),
            },
            match g.fairness {
                Fairness::Fifo => "FIFO".to_owned(),
                Fairness::None => "none".to_owned(),
            },
            if g.same_owner_retake { "yes" } else { "no" }.to_owned(),
            match g.durability {
                Durability::SurvivesRestart => "locks survive".to_owned(),
                Durability::LostOnRestart => "locks lost".to_owned(),
            },
            if g.listing { "yes" } else { "no" }.to_owned(),
            match g.semaphores {
                Semaphores::Supported => "yes".to_owned(),
                Semaphores::Unsupported(_) => "no".to_owned(),
            },
            // Built on the lock, so every backend; terms are its fencing tokens.
            match g.fencing {
                Fencing::Monotonic => "yes, rising terms".to_owned(),
                Fencing::None => "yes, no terms".to_owned(),
            },
        ];
        out.push_str(&format!("| {} |\n", cells.join(" | ")));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockcore::{Exclusion, LockBackend, MemoryBackend};

    #[test]
    fn renders_one_row_per_backend() {
        let quorum = Guarantees::new(
            Exclusion::TimingDependentQuorum,
            Fencing::None,
            ExpiryClock::Server,
        );
        let rows = [
            ("memory", MemoryBackend::new().guarantees()),
            ("redlock", quorum),
        ];
        let table = guarantees_markdown(&rows);
        assert_eq!(table.lines().count(), 4);
        assert!(table.contains("| `memory` | in-process | monotonic | server clock | notified | none | yes | locks lost | yes | yes | yes, rising terms |"), "{table}");
        assert!(
            table.contains("| `redlock` | timing-dependent quorum | none |"),
            "{table}"
        );
    }
}
