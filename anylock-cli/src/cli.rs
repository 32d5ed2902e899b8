//! Command-line definitions.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Args, Parser, Subcommand, ValueEnum};

const EXAMPLES: &str = "\
Examples:
  anylock run publish-repo -- ./publish.sh            # embedded backend, wait forever
  anylock run nightly --no-wait -- make report         # skip if another run holds it
  anylock run nightly -n -E 0 -c 'make report'         # skip quietly (exit 0), shell line
  anylock run deploy --wait 5m --ttl 1m -- ./deploy    # give up after 5 minutes
  anylock run render --permits 3 -- ./render.sh        # at most 3 at once (a semaphore)
  anylock elect scheduler --note \"$HOSTNAME\" -- ./schedule  # run only while leader
  anylock leader scheduler --watch                      # who leads, at each change
  anylock run build --leftovers wait -- sh -c 'make &'  # hold until background work ends
  ANYLOCK_BACKEND=redis://redis:6379/0 anylock run publish-repo -- ./publish.sh
  anylock run nightly -n --hold-at-least 10m -- ./report # no second run for 10 minutes
  anylock acquire deploy --owner \"$RUN_ID\" --ttl 30m >> \"$GITHUB_ENV\"  # later steps:
  anylock verify deploy    # ANYLOCK_OWNER from $GITHUB_ENV; exit 0 held, 122 not
  anylock release deploy   # only if ANYLOCK_OWNER holds it; 122 (nothing done) if not
  anylock run deploy --note \"$CI_JOB_URL\" -- ./deploy  # shown by status and list
  anylock status publish-repo                           # exit 0 held, 1 free; --json
  anylock list deploy/                                  # held locks under a prefix; --json
  anylock break publish-repo --yes
  anylock guarantees
  anylock check postgres://locks@db/locks

Exit codes of `run`: the command's own code (128+N if a signal N killed it);
  122 the lock was lost while the command ran, or ran out while anylock was stopped
      (the command was stopped); `verify`, `release`: the owner does not hold the lock
      (expired, released, broken or taken over; nothing was changed)
  123 the lock is held and --no-wait was given (or --conflict-exit-code)
  124 timed out waiting for the lock (--wait) (or --conflict-exit-code)
  125 anylock failed (backend unreachable, permission denied), or --hold-at-least
      could not leave the lease held (the command had exited)
  126 the command is not executable; 127 the command was not found
  2   bad usage, URL, duration or configuration";

/// Run commands under a distributed lease lock, inspect and break locks, compare backends.
#[derive(Debug, Parser)]
#[command(name = "anylock", version, about, after_help = EXAMPLES)]
pub(crate) struct Cli {
    /// More log output (-v info, -vv debug, -vvv trace); ANYLOCK_LOG overrides.
    #[arg(short, long, action = ArgAction::Count, global = true, conflicts_with = "quiet")]
    pub(crate) verbose: u8,

    /// Errors only: no waiting line, no warnings.
    #[arg(short, long, global = true)]
    pub(crate) quiet: bool,

    /// Backend URL (else ANYLOCK_BACKEND, else the config file, else the embedded
    /// `local:` backend). A URL with a password or secret parameter is refused here
    /// (command lines are visible to every user of the machine): set it in ANYLOCK_BACKEND
    /// or the config file.
    #[arg(long, global = true, env = "ANYLOCK_BACKEND", hide_env_values = true)]
    pub(crate) backend: Option<String>,

    /// `--backend` was given as an argument (not through ANYLOCK_BACKEND).
    #[arg(skip)]
    pub(crate) backend_on_command_line: bool,

    /// Config file (TOML: backend, ttl, wait); default ~/.config/anylock/config.toml.
    #[arg(long, global = true, env = "ANYLOCK_CONFIG")]
    pub(crate) config: Option<PathBuf>,

    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Acquire NAME, run the command while refreshing the lease, release at the end.
    Run(RunArgs),
    /// Acquire NAME for the owner ID and exit, leaving the lease to last its TTL with no
    /// process keeping it alive: one lock across several CI steps. Prints
    /// ANYLOCK_NAME, ANYLOCK_OWNER, ANYLOCK_FENCE_TOKEN and ANYLOCK_EXPIRES_AT lines for
    /// `>> "$GITHUB_ENV"`. Run it again with the same owner to renew (new TTL, new token).
    Acquire(AcquireArgs),
    /// Exit 0 if the owner ID holds NAME (prints the time left and the fence token), 122
    /// if it does not (expired, released, broken or taken over). Changes nothing.
    Verify {
        #[command(flatten)]
        held: OwnerArgs,
        /// One JSON object on stdout: name, owner, held, expires_in_ms, fence_token.
        #[arg(long)]
        json: bool,
    },
    /// Release NAME if the owner ID holds it; exit 122, changing nothing, if it does not.
    Release(OwnerArgs),
    /// Campaign to lead the election NAME and run the command only while leader: `run`
    /// under another name (the same options and exit codes; --note is the value `leader`
    /// shows). Leadership lost stops the command (exit 122).
    Elect(RunArgs),
    /// Show who leads the election NAME: owner, term (fence token), since when, value.
    /// Exit 0 when someone leads, 1 when nobody does.
    Leader {
        /// The election (lock) name.
        name: String,
        /// One JSON object on stdout: name, leader, owner, term, since (RFC 3339),
        /// expires_in_ms, value (each absent when unknown).
        #[arg(long)]
        json: bool,
        /// Keep watching: print the leader again at each change (a new term, or nobody
        /// leading) until interrupted. Terms shorter than half a second may be skipped.
        #[arg(long)]
        watch: bool,
    },
    /// Show who holds NAME: identity, since when, expiry, fence token and note. Exit 0
    /// when it is held, 1 when it is free.
    Status {
        /// The lock name.
        name: String,
        /// One JSON object on stdout: name, held, owner, acquired_at (RFC 3339),
        /// expires_in_ms, fence_token, note (each absent when unknown). With --permits:
        /// name, held, and permits (an array of those objects).
        #[arg(long)]
        json: bool,
        /// Show the permits of the semaphore NAME (`run --permits`) instead of the lock
        /// NAME; exit 0 when at least one is held.
        #[arg(long)]
        permits: bool,
    },
    /// List the locks held now whose names start with PREFIX (every lock without one),
    /// sorted by name: holder, expiry, fence token and note. Exit 0 even when none is
    /// held; 125 on a backend that cannot list (see `anylock guarantees`).
    List {
        /// Only names that start with this text, byte for byte (no patterns).
        #[arg(default_value = "")]
        prefix: String,
        /// One JSON array on stdout, an object per lock with the fields of `status --json`.
        #[arg(long)]
        json: bool,
    },
    /// Forcibly release NAME (an operator's override); its holder will see the lock lost.
    Break {
        /// The lock name.
        name: String,
        /// Do not ask for confirmation.
        #[arg(short, long)]
        yes: bool,
    },
    /// Print what every backend in this build guarantees.
    Guarantees {
        /// One JSON array on stdout, an object per backend.
        #[arg(long)]
        json: bool,
    },
    /// Check a backend: reachability, permissions (a probe lock), round-trip time.
    Check {
        /// Backend URL to check (default: the selected backend). One with a password or
        /// secret parameter is refused here: check it through ANYLOCK_BACKEND.
        url: Option<String>,
        /// One JSON object on stdout: backend (redacted), connect_ms, security (one object
        /// per connection), round_trip_ms, probe_lock_ms, clock_skew_ms.
        #[arg(long)]
        json: bool,
    },
    /// Print shell completions.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

/// A lock and the owner chosen for it.
#[derive(Debug, Args)]
pub(crate) struct OwnerArgs {
    /// The lock name.
    pub(crate) name: String,

    /// The owner: an id of your choosing (1 to 128 bytes, no whitespace), the same in
    /// every step and on every runner, unique to one pipeline run (a CI run id).
    #[arg(long, env = "ANYLOCK_OWNER", value_name = "ID")]
    pub(crate) owner: String,
}

/// How `run` and `acquire` wait for a held lock.
#[derive(Debug, Args)]
pub(crate) struct WaitArgs {
    /// Give up waiting for the lock after this long (default: wait forever).
    #[arg(short, long, env = "ANYLOCK_WAIT", value_parser = parse_duration)]
    pub(crate) wait: Option<Duration>,

    /// Do not wait: exit with code 123 (or --conflict-exit-code) if the lock is held.
    /// Wins over --wait and ANYLOCK_WAIT, so a job-wide ANYLOCK_WAIT leaves `-n` usable.
    #[arg(short, long)]
    pub(crate) no_wait: bool,

    /// The exit code when the lock is held (--no-wait) or the wait timed out (--wait),
    /// instead of 123 and 124; `-E 0` makes a skipped run a success, as flock's -E does.
    #[arg(short = 'E', long, value_name = "CODE", value_parser = parse_conflict_code)]
    pub(crate) conflict_exit_code: Option<u8>,
}

/// `--note`: text stored with the lease for people.
#[derive(Debug, Args)]
pub(crate) struct NoteArgs {
    /// Text stored with the lease and shown by `status` and `list`, such as the CI run's
    /// URL (at most 512 bytes, one line; empty means none, so `--note "$CI_JOB_URL"`
    /// works where the variable is unset). Anyone who can read the lock can read it: no
    /// secrets.
    #[arg(long, env = "ANYLOCK_NOTE", value_name = "TEXT", value_parser = parse_note)]
    pub(crate) note: Option<NoteText>,
}

/// A parsed `--note`: `None` when the text was empty. (A newtype: clap reads a bare
/// `Option<Option<_>>` as a flag whose value is optional.)
#[derive(Debug, Clone)]
pub(crate) struct NoteText(Option<lockcore::Note>);

impl NoteArgs {
    /// The note to store, if one was given and is not empty.
    pub(crate) fn get(&self) -> Option<&lockcore::Note> {
        self.note.as_ref().and_then(|text| text.0.as_ref())
    }
}

/// A note as lockcore checks it; empty (or only spaces) is no note.
fn parse_note(text: &str) -> Result<NoteText, String> {
    if text.trim().is_empty() {
        return Ok(NoteText(None));
    }
    lockcore::Note::new(text)
        .map(|note| NoteText(Some(note)))
        .map_err(|e| e.message().to_owned())
}

#[derive(Debug, Args)]
pub(crate) struct AcquireArgs {
    #[command(flatten)]
    pub(crate) held: OwnerArgs,

    /// How long the lease lasts: nothing refreshes it, so choose more than the steps take
    /// [default: 30m]. Not read from ANYLOCK_TTL or the config (those are for `run`).
    #[arg(long, value_parser = parse_duration)]
    pub(crate) ttl: Option<Duration>,

    #[command(flatten)]
    pub(crate) waiting: WaitArgs,

    #[command(flatten)]
    pub(crate) note: NoteArgs,

    /// One JSON object on stdout instead of the ANYLOCK_* lines: name, owner, fence_token
    /// (absent when the backend has none), ttl_ms, expires_at (RFC 3339).
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// The lock name.
    pub(crate) name: String,

    /// Lease TTL; the lease is refreshed every TTL/8 while the command runs [default: 30s].
    /// Durations are `90s`, `5m`, `1h30m`, or bare seconds (`90`).
    #[arg(long, env = "ANYLOCK_TTL", value_parser = parse_duration)]
    pub(crate) ttl: Option<Duration>,

    #[command(flatten)]
    pub(crate) waiting: WaitArgs,

    #[command(flatten)]
    pub(crate) note: NoteArgs,

    /// Take one of N permits of the semaphore NAME instead of the lock NAME: at most N
    /// commands run at once (consul lock's `-n`; here `-n` is --no-wait, as flock's).
    /// Every run of NAME must pass the same N; semaphore names are apart from lock names.
    #[arg(long, visible_alias = "limit", value_name = "N", value_parser = parse_permits)]
    pub(crate) permits: Option<u32>,

    /// After SIGTERM on a lost lock, wait this long before SIGKILL [default: 10s]. Must be
    /// shorter than the TTL; cut to what the lease has left when the loss is detected, and
    /// skipped when the lease is already gone (taken over, broken, expired).
    #[arg(long, env = "ANYLOCK_GRACE", value_parser = parse_duration)]
    pub(crate) grace: Option<Duration>,

    /// Stop the command this much sooner than the server can expire the lease, on top of
    /// 1 % of the TTL [default: 30ms, at most a quarter of the TTL]: raise it where timers
    /// fire late (a loaded machine). It may only be raised, and must leave more than half
    /// the TTL.
    #[arg(long, env = "ANYLOCK_MARGIN", value_parser = parse_duration)]
    pub(crate) margin: Option<Duration>,

    /// Hold the lock at least this long after it was acquired (ShedLock's lockAtLeastFor):
    /// if the command finishes sooner, the lease is left to expire then instead of being
    /// released, so a late run elsewhere does not repeat the job. At most the TTL.
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub(crate) hold_at_least: Option<Duration>,

    /// What to do with processes the command leaves in its group when it exits: `kill`
    /// them (SIGTERM, SIGKILL after the grace) or `wait` for them, holding the lock either
    /// way until the group is empty.
    #[arg(long, value_enum, default_value_t = Leftovers::Kill)]
    pub(crate) leftovers: Leftovers,

    /// Run this shell command line with `/bin/sh -c` instead of CMD (as flock's -c).
    #[arg(
        short = 'c',
        long = "command",
        value_name = "SHELL",
        conflicts_with = "command"
    )]
    pub(crate) shell: Option<String>,

    /// The command and its arguments.
    #[arg(required_unless_present = "shell", last = true, value_name = "CMD")]
    pub(crate) command: Vec<OsString>,
}

impl RunArgs {
    /// `-c` turned into `/bin/sh -c SHELL`, so the rest of `run` sees one command.
    pub(crate) fn resolve_shell(&mut self) {
        if let Some(line) = self.shell.take() {
            self.command = vec!["/bin/sh".into(), "-c".into(), line.into()];
        }
    }
}

/// A number of permits as lockcore checks it (1 to 10,000).
fn parse_permits(text: &str) -> Result<u32, String> {
    let n: u32 = (text.trim().parse()).map_err(|_| {
        format!(
            "{text:?} is not a number of permits (1 to {})",
            lockcore::MAX_PERMITS
        )
    })?;
    lockcore::Permits::new(n)
        .map(lockcore::Permits::get)
        .map_err(|e| e.message().to_owned())
}

/// An exit code for a skipped run that cannot be mistaken for one of anylock's own.
pub(crate) fn parse_conflict_code(text: &str) -> Result<u8, String> {
    let code: u8 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not an exit code (0-255)"))?;
    if code == 2 || (122..=127).contains(&code) {
        return Err(format!(
            "{code} is one of anylock's own exit codes (2, 122-127), so a pipeline could not \
             tell a skipped run from a failure; pick 0, 1 or 3-121"
        ));
    }
    Ok(code)
}

/// A duration as [`lockcore::parse_duration`] reads it (`90s`, `5m`, `1h 30m`, or bare
/// seconds `90`), the one parser the config file uses too.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    lockcore::parse_duration(text).map_err(|e| e.message().to_owned())
}

/// What happens to processes left in the command's group after the command exits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Leftovers {
    /// SIGTERM, then SIGKILL after the grace; the lock is released once they are gone.
    Kill,
    /// Keep holding (and refreshing) the lock until they exit by themselves.
    Wait,
}

impl Leftovers {
    /// The name on the command line.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Kill => "kill",
            Self::Wait => "wait",
        }
    }

    /// Parses [`as_str`](Leftovers::as_str)'s output.
    pub(crate) fn from_str(text: &str) -> Option<Self> {
        [Self::Kill, Self::Wait]
            .into_iter()
            .find(|l| l.as_str() == text)
    }
}
