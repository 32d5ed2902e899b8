//! Emulating a machine suspend for a process under test: its monotonic clock skips the
//! time it was stopped, its boot clock and wall clock do not.
//!
//! A real suspend stops every process and `CLOCK_MONOTONIC` with it, while
//! `CLOCK_BOOTTIME`, the wall clock and every lock server's clock run on. A test gets the
//! same picture with [`MonotonicSkip`]: the process runs with `c/monotonic_skip.c`
//! preloaded (built here with the C compiler the workspace already needs), the test stops
//! it (SIGSTOP, or [`Freezer`] for no signal at all), and before continuing it adds the
//! stopped time to the skip, which the process's monotonic clock then lags behind by.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const SOURCE: &str = include_str!("../c/monotonic_skip.c");

/// The preload library and the file that holds the skip, in a directory of the test's.
#[derive(Debug)]
pub struct MonotonicSkip {
    library: PathBuf,
    file: PathBuf,
}

impl MonotonicSkip {
    /// Builds the library into `dir` with `cc` (once per directory) and starts with no
    /// skip.
    ///
    /// # Panics
    /// When the library cannot be built (no C compiler) or the file written: the test
    /// cannot emulate a suspend and must fail, not pass.
    pub fn new(dir: &Path) -> Self {
        let library = dir.join("monotonic_skip.so");
        if !library.exists() {
            build(dir, &library);
        }
        Self::with_file(library, dir.join("monotonic_skip"))
    }

    /// Another process's skip, in `file`, with the same library.
    pub fn another(&self, file: PathBuf) -> Self {
        Self::with_file(self.library.clone(), file)
    }

    fn with_file(library: PathBuf, file: PathBuf) -> Self {
        std::fs::write(&file, 0_i64.to_ne_bytes()).expect("write the skip file");
        Self { library, file }
    }

    /// The environment a process needs to run with the skip: `LD_PRELOAD` and the file.
    pub fn env(&self) -> [(&'static str, PathBuf); 2] {
        [
            ("LD_PRELOAD", self.library.clone()),
            ("ANYLOCK_TEST_MONOTONIC_SKIP_FILE", self.file.clone()),
        ]
    }

    /// Makes the process's monotonic clock skip `by` more (a suspend of that long): the
    /// skips add up, as suspends do.
    pub fn add(&self, by: Duration) {
        let mut total = [0; 8];
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&self.file)
            .expect("open the skip file");
        file.read_exact_at(&mut total, 0).expect("read the skip");
        let by = i64::try_from(by.as_nanos()).expect("a skip under 292 years");
        let total = i64::from_ne_bytes(total)
            .checked_add(by)
            .expect("a skip under 292 years");
        file.write_all_at(&total.to_ne_bytes(), 0)
            .expect("write the skip");
    }
}

/// Builds `c/monotonic_skip.c` into `library`, through a source file in `dir`.
fn build(dir: &Path, library: &Path) {
    let source = dir.join("monotonic_skip.c");
    std::fs::write(&source, SOURCE).expect("write the preload library's source");
    // Built beside and renamed: a process preloading it never sees half a library.
    let partial = dir.join(format!("monotonic_skip.{:016x}.so", rand::random::<u64>()));
    let built = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&partial)
        .arg(&source)
        .arg("-ldl")
        .output()
        .expect("run cc (the workspace needs a C compiler)");
    assert!(
        built.status.success(),
        "cc failed: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    std::fs::rename(&partial, library).expect("move the preload library in place");
}

/// A cgroup freezer: stops processes as a suspend does, without a signal (a process
/// stopped by SIGSTOP gets SIGCONT when continued, and may act on it; a frozen one learns
/// nothing). The cgroup v1 `freezer` hierarchy, or cgroup v2's `cgroup.freeze`.
#[derive(Debug)]
pub struct Freezer {
    dir: PathBuf,
    v2: bool,
}

impl Freezer {
    /// A new, empty cgroup named after `name`.
    ///
    /// # Panics
    /// When no freezer hierarchy is mounted or the cgroup cannot be made (not root): the
    /// test cannot emulate a suspend and must fail.
    pub fn new(name: &str) -> Self {
        let unique = format!("anylock-test-{name}-{:016x}", rand::random::<u64>());
        let (root, v2) = if Path::new("/sys/fs/cgroup/freezer").is_dir() {
            (PathBuf::from("/sys/fs/cgroup/freezer"), false)
        } else if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
            (PathBuf::from("/sys/fs/cgroup"), true)
        } else if Path::new("/sys/fs/cgroup/unified/cgroup.controllers").exists() {
            (PathBuf::from("/sys/fs/cgroup/unified"), true)
        } else {
            panic!("no cgroup freezer is mounted: a suspend cannot be emulated");
        };
        let dir = root.join(unique);
        std::fs::create_dir(&dir)
            .unwrap_or_else(|e| panic!("cannot make the cgroup {}: {e}", dir.display()));
        Self { dir, v2 }
    }

    /// Moves process `pid` into the cgroup (its later children are born there).
    pub fn add(&self, pid: u32) {
        // A process that has just exited cannot move: that is fine.
        let _ = std::fs::write(self.dir.join("cgroup.procs"), pid.to_string());
    }

    /// Freezes every process in the cgroup; returns once they are frozen.
    pub fn freeze(&self) {
        self.set(true);
    }

    /// Thaws every process in the cgroup at once.
    pub fn thaw(&self) {
        self.set(false);
    }

    fn set(&self, frozen: bool) {
        let (file, value, done) = match (self.v2, frozen) {
            (false, true) => ("freezer.state", "FROZEN", "FROZEN"),
            (false, false) => ("freezer.state", "THAWED", "THAWED"),
            (true, true) => ("cgroup.freeze", "1", "frozen 1"),
            (true, false) => ("cgroup.freeze", "0", "frozen 0"),
        };
        std::fs::write(self.dir.join(file), value).expect("write the freezer state");
        let state = if self.v2 {
            "cgroup.events"
        } else {
            "freezer.state"
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !std::fs::read_to_string(self.dir.join(state))
            .unwrap_or_default()
            .contains(done)
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the freezer did not settle"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

impl Drop for Freezer {
    /// Thaws and moves the processes left back to the root cgroup, then removes it.
    fn drop(&mut self) {
        let _ = std::fs::write(
            self.dir.join(if self.v2 {
                "cgroup.freeze"
            } else {
                "freezer.state"
            }),
            if self.v2 { "0" } else { "THAWED" },
        );
        let parent = self.dir.parent().map(|p| p.join("cgroup.procs"));
        if let (Ok(procs), Some(parent)) = (
            std::fs::read_to_string(self.dir.join("cgroup.procs")),
            parent,
        ) {
            for pid in procs.lines() {
                let _ = std::fs::write(&parent, pid);
            }
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}
