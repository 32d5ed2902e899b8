//! How late the timers that stop a command fire, with the CPU busy: the measurement behind
//! lockcore's default margin (`DEFAULT_MARGIN`, docs/lockcore.md "The margin").
//!
//! `anylock run` kills its command at the lease's local validity deadline from two
//! places: the watchdog thread (a `CLOCK_BOOTTIME` timerfd, `src/watchdog.rs`) and, as the
//! backstop, the supervision loop on the async runtime (lockcore's `Clock::sleep_until`).
//! This arms each at random deadlines 5 to 50 ms ahead while `--hog N` processes spin, and
//! prints how late each woke.
//!
//! ```sh
//! cargo run --release -p anylock-cli --example kill_lateness -- --hog 4 --samples 400
//! ```

use std::process::{Child, Command};
use std::time::Duration;

use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};

fn main() {
    let mut args = std::env::args().skip(1);
    let (mut hog, mut samples) = (4_usize, 400_usize);
    while let Some(arg) = args.next() {
        let value = args.next().and_then(|v| v.parse().ok());
        match (arg.as_str(), value) {
            ("--hog", Some(n)) => hog = n,
            ("--samples", Some(n)) => samples = n,
            _ => {
                eprintln!("usage: kill_lateness [--hog N] [--samples N]");
                std::process::exit(2);
            }
        }
    }
    let mut hogs: Vec<Child> = (0..hog).map(|_| spin()).collect();
    std::thread::sleep(Duration::from_millis(500));
    report(
        "watchdog thread (timerfd, CLOCK_BOOTTIME)",
        &thread_lateness(samples),
    );
    report(
        "runtime (lockcore Clock::sleep_until, 2 workers)",
        &runtime_lateness(samples),
    );
    for child in &mut hogs {
        let _ = child.kill();
        let _ = child.wait();
    }
    println!("hog: {hog} spinning processes on {} cores", cores());
}

fn spin() -> Child {
    Command::new("sh")
        .args(["-c", "while :; do :; done"])
        .spawn()
        .expect("spawn a spinning shell")
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

fn pause() -> Duration {
    Duration::from_micros(rand::random_range(5_000..50_000))
}

fn thread_lateness(samples: usize) -> Vec<Duration> {
    let timer = TimerFd::new(ClockId::CLOCK_BOOTTIME, TimerFlags::TFD_CLOEXEC).expect("timerfd");
    (0..samples)
        .map(|_| {
            let at = boot() + pause();
            let spec = TimeSpec::from_duration(at);
            timer
                .set(
                    Expiration::OneShot(spec),
                    TimerSetTimeFlags::TFD_TIMER_ABSTIME,
                )
                .expect("arm");
            timer.wait().expect("wait");
            boot().saturating_sub(at)
        })
        .collect()
}

fn runtime_lateness(samples: usize) -> Vec<Duration> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let clock = lockcore::Clock::system();
        let mut late = Vec::with_capacity(samples);
        for _ in 0..samples {
            let at = clock.now() + pause();
            // Spawned, as the keeper's timer runs in a task of its own.
            let waiter = clock.clone();
            let woke = tokio::spawn(async move {
                waiter.sleep_until(at).await;
                waiter.now()
            });
            let woke = woke.await.expect("the timer task");
            late.push(woke.saturating_duration_since(at));
        }
        late
    })
}

fn boot() -> Duration {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME).expect("boot clock");
    Duration::new(t.tv_sec() as u64, t.tv_nsec() as u32)
}

fn report(what: &str, late: &[Duration]) {
    let mut late = late.to_vec();
    late.sort();
    let at = |q: f64| late[((late.len() - 1) as f64 * q).round() as usize];
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "{what}: {} samples, late by p50 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms, max {:.2} ms",
        late.len(),
        ms(at(0.5)),
        ms(at(0.99)),
        ms(at(0.999)),
        ms(at(1.0))
    );
}
