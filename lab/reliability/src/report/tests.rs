//! The report marks broken claims and fails the run on them.

use super::*;
use crate::backends::Kind;
use crate::checker::Counts;
use crate::expect::{Disagreement, Expectation};
use crate::primitive::Primitive;

fn cell(fault: Fault, disagreements: Vec<Disagreement>) -> CellResult {
    CellResult {
        kind: Kind::Etcd,
        fault,
        primitive: Primitive::Lock,
        expectation: Expectation {
            fenced: Claim::Claimed,
            exclusion: Claim::Claimed,
            timely_lost: Claim::Claimed,
            why: "test",
        },
        unfenced: Counts {
            sections: 4,
            double_grants: u64::from(!disagreements.is_empty()),
            examples: vec!["double grant: evidence".into()],
            ..Counts::default()
        },
        fenced: Some(Counts::default()),
        disagreements,
        notes: vec!["did it".into()],
        problems: Vec::new(),
        seconds: 1.0,
    }
}

fn meta() -> Meta {
    Meta {
        command: "scripts/reliability".into(),
        date: "today".into(),
        seconds: 2.0,
        jobs: 1,
        results: "target/reliability/full".into(),
        short: false,
    }
}

#[test]
fn a_broken_claim_is_marked_and_fails_the_run() {
    let broken = Disagreement {
        claim: Claim::Claimed,
        what: "1 double grant(s)".into(),
    };
    let results = [
        cell(Fault::None, Vec::new()),
        cell(Fault::Pause, vec![broken]),
    ];
    let text = render(&results, &meta());
    assert!(
        text.contains("| `etcd` | none | claimed | claimed | 4 / 0 |"),
        "{text}"
    );
    assert!(text.contains("| 0 / 0 | **NO** |"), "{text}");
    assert!(text.contains("evidence (unfenced run): double grant: evidence"));
    assert!(text.contains("1 cell(s) disagree with the Guarantees table"));
    assert!(text.contains("0 of 0 fired before the server"), "{text}");
    assert!(failed(&results));
    assert!(!failed(&results[..1]));
}

#[test]
fn a_broken_documented_claim_is_reported_but_does_not_fail() {
    let docs = Disagreement {
        claim: Claim::Documented,
        what: "docs".into(),
    };
    let results = [cell(Fault::Pause, vec![docs])];
    assert!(render(&results, &meta()).contains("**no** (docs)"));
    assert!(!failed(&results));
}

#[test]
fn permit_and_leader_cells_get_tables_of_their_own() {
    let over = Disagreement {
        claim: Claim::Claimed,
        what: "1 over-grant(s)".into(),
    };
    let mut permits = cell(Fault::Pause, vec![over]);
    permits.primitive = Primitive::Permits;
    permits.fenced = None;
    permits.unfenced.limit = 2;
    permits.unfenced.max_inside = 3;
    permits.unfenced.overlaps = 2;
    let mut leader = cell(Fault::None, Vec::new());
    leader.primitive = Primitive::Leader;
    let results = [cell(Fault::None, Vec::new()), permits, leader];
    let text = render(&results, &meta());
    let permit_table = &text[text.find("## Permits (N = 2)").expect("permit table")..];
    assert!(
        permit_table.contains(
            "| `etcd` | pause | claimed | claimed | 4 | 3 | 2 | 1 | 0 | 0 | 0 / 0 | **NO** |"
        ),
        "{text}"
    );
    let leaders = &text[text.find("## Leader election").expect("leader table")..];
    assert!(
        leaders.contains("| `etcd` | none | claimed | claimed | 4 / 0 |"),
        "{text}"
    );
    assert!(text.contains("### `etcd` under pause (permit)"), "{text}");
    assert!(failed(&results));
}
