//! `anylock-reliability`: the reliability harness (see the library docs).
//!
//! - `run [--short] [--backends ..] [--faults ..] [--out RELIABILITY.md]`: run the plan,
//!   write the report, exit 1 when a claimed guarantee was violated or a cell could not run.
//! - `client ...`: one client process (started by `run`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anylock_reliability::backends::{Kind, Workload};
use anylock_reliability::client::{self, ClientConfig};
use anylock_reliability::fault::Fault;
use anylock_reliability::primitive::Primitive;
use anylock_reliability::report::{self, Meta};
use anylock_reliability::suite::{self, Plan, Suite};
use clap::{Args, Parser, Subcommand};
use tokio::time::Instant;

#[derive(Debug, Parser)]
#[command(
    name = "anylock-reliability",
    about = "Replay Kleppmann's failure scenarios against every anylock backend"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the backend x fault table and write the report.
    Run(RunArgs),
    /// One client process (the orchestrator starts these).
    Client(ClientArgs),
}

#[derive(Debug, Args)]
struct RunArgs {
    /// The CI version: fewer cells, shorter runs.
    #[arg(long)]
    short: bool,
    /// Only these backends (comma-separated: local,redis,redlock,postgres,etcd,gcs).
    #[arg(long, value_delimiter = ',')]
    backends: Option<Vec<Kind>>,
    /// Only these faults (comma-separated slugs, e.g. pause,leader-kill).
    #[arg(long, value_delimiter = ',')]
    faults: Option<Vec<Fault>>,
    /// Only these primitives (comma-separated: lock,permits,leader).
    #[arg(long, value_delimiter = ',')]
    primitives: Option<Vec<Primitive>>,
    /// A deliberately broken run, to see the checks fail: permit clients ask for this N
    /// while the checker holds them to 2. Never use it for the report.
    #[arg(long, hide = true)]
    client_permits: Option<u32>,
    /// Write the report here.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Histories and client logs go here.
    #[arg(long, default_value = "target/reliability")]
    results: PathBuf,
    /// Backends run side by side.
    #[arg(long, default_value_t = 3)]
    jobs: usize,
    /// The command line recorded in the report.
    #[arg(long)]
    command: Option<String>,
}

#[derive(Debug, Args)]
struct ClientArgs {
    #[arg(long)]
    url: String,
    #[arg(long)]
    register: std::net::SocketAddr,
    #[arg(long)]
    client: u32,
    #[arg(long)]
    lock: String,
    #[arg(long, default_value = "lock")]
    primitive: Primitive,
    #[arg(long, default_value_t = 1)]
    permits: u32,
    #[arg(long)]
    ttl_ms: u64,
    #[arg(long)]
    steps: u32,
    #[arg(long)]
    step_ms: u64,
    #[arg(long, default_value_t = 50)]
    margin_ms: u64,
    /// The attempt timeout (default: lockcore's, the TTL).
    #[arg(long)]
    attempt_timeout_ms: Option<u64>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("anylock-reliability: {e}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(async {
        match cli.command {
            Command::Run(args) => run(args).await,
            Command::Client(args) => client::run(client_config(args)).await.map(|()| true),
        }
    });
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("anylock-reliability: {e}");
            ExitCode::FAILURE
        }
    }
}

fn client_config(a: ClientArgs) -> ClientConfig {
    ClientConfig {
        url: a.url,
        register: a.register,
        client: a.client,
        lock: a.lock,
        primitive: a.primitive,
        permits: a.permits,
        workload: Workload {
            ttl: Duration::from_millis(a.ttl_ms),
            steps: a.steps,
            step: Duration::from_millis(a.step_ms),
            margin: Duration::from_millis(a.margin_ms),
        },
        attempt_timeout: a.attempt_timeout_ms.map(Duration::from_millis),
    }
}

async fn run(args: RunArgs) -> Result<bool, String> {
    let started = Instant::now();
    let plan = if args.short {
        Plan::short()
    } else {
        Plan::full()
    };
    let mut plan = plan.only(
        args.backends.as_deref(),
        args.faults.as_deref(),
        args.primitives.as_deref(),
    );
    if plan.cells.is_empty() {
        return Err("no cell matches --backends, --faults and --primitives".into());
    }
    if let Some(n) = args.client_permits {
        eprintln!(
            "reliability: BROKEN ON PURPOSE: permit clients ask for {n} permits, the checker \
             allows {}",
            anylock_reliability::primitive::PERMITS
        );
        if args.out.is_some() {
            return Err("--client-permits breaks the run on purpose: no --out".into());
        }
        plan.client_permits = Some(n);
    }
    let mode = if args.short { "short" } else { "full" };
    let out_dir = args.results.join(mode);
    let _ = std::fs::remove_dir_all(&out_dir);
    let exe = std::env::current_exe().map_err(|e| format!("own path: {e}"))?;
    let suite = Suite {
        plan,
        exe,
        out_dir: out_dir.clone(),
        jobs: args.jobs,
    };
    let results = suite::run(&suite).await?;
    let meta = Meta {
        command: args
            .command
            .unwrap_or_else(|| std::env::args().collect::<Vec<_>>().join(" ")),
        date: utc_now(),
        seconds: started.elapsed().as_secs_f64(),
        jobs: args.jobs,
        results: out_dir.display().to_string(),
        short: args.short,
    };
    let text = report::render(&results, &meta);
    let summary = serde_json::to_string_pretty(&results).map_err(|e| e.to_string())?;
    std::fs::create_dir_all(&out_dir).map_err(|e| format!("{}: {e}", out_dir.display()))?;
    std::fs::write(out_dir.join("results.json"), summary).map_err(|e| e.to_string())?;
    std::fs::write(out_dir.join("report.md"), &text).map_err(|e| e.to_string())?;
    if let Some(out) = &args.out {
        std::fs::write(out, &text).map_err(|e| format!("{}: {e}", out.display()))?;
        eprintln!("reliability: wrote {}", out.display());
    }
    let failed = report::failed(&results);
    eprintln!(
        "reliability: {} cells in {:.0} s: {}",
        results.len(),
        meta.seconds,
        if failed {
            "FAILED (a claimed guarantee was violated or a run could not complete)"
        } else {
            "every claim held"
        }
    );
    Ok(!failed)
}

fn utc_now() -> String {
    std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}
