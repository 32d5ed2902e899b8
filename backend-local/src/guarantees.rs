//! What the embedded backend promises, without opening a database.

use lockcore::{
    Durability, Exclusion, ExpiryClock, Fairness, Fencing, Guarantees, Semaphores, Waiting,
};

/// What the embedded backend promises (the same for every instance).
pub fn guarantees() -> Guarantees {
    Guarantees::new(
        Exclusion::SingleStore,
        Fencing::Monotonic,
        ExpiryClock::Server,
    )
    .with_waiting(if cfg!(target_os = "linux") {
        Waiting::Notified
    } else {
        Waiting::Polled
    })
    .with_fairness(Fairness::None)
    .with_same_owner_retake(true)
    .with_durability(Durability::SurvivesRestart)
    .with_listing(true)
    .with_semaphores(Semaphores::Supported)
    .with_notes(
        "One machine only (a SQLite file on a local filesystem; a store on a network \
             or shared filesystem is refused unless opened with ?shared_fs=allow, and \
             then exclusion rests on that filesystem's byte-range locks), and one that another \
             user could change is refused unless it is a group store (?shared_group=). \
             Expiry uses the \
             machine's monotonic clock, shared by every process and stopped during \
             suspend (off Linux: the wall clock, which NTP can step); the guard's clock \
             counts a suspend, so after a resume the holder gives up first. \
             A holder whose kernel lock \
             (flock) is gone, with every process that inherited it, is taken over at once, \
             in any PID namespace; nothing else ends a lease early. A lease written under \
             another boot (before a reboot, or by another host or sandbox sharing the \
             file) lasts until its TTL ends on the wall clock and is never judged dead \
             early; fence counters survive reboots. Waiters are woken on release and break by \
             inotify on Linux, and poll elsewhere. Semaphore permits have the same \
             liveness, expiry and durability, and a fence counter per semaphore name.",
    )
}
