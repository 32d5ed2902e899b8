//! `anylock`: run a command under a distributed lease lock.
//!
//! See `anylock --help` and the workspace README.

/// `eprintln!` that never panics, and whose line is made safe for a terminal
/// ([`terminal::line`]): when stderr's reader has gone (a dead log collector,
/// `2>&1 | head`), a message is lost but the exit code is still `anylock`'s own.
macro_rules! note {
    ($($arg:tt)*) => {
        $crate::terminal::line(format_args!($($arg)*))
    };
}

/// `println!` that never panics: `anylock guarantees | head -1` closes stdout early.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

mod admin;
mod child;
mod cli;
mod elect;
mod exit;
mod group;
#[cfg(test)]
mod prop_tests;
mod run;
mod secrets;
mod select;
mod signals;
mod steps;
mod supervisor;
mod terminal;
mod watch;
mod watchdog;

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};
use tracing_subscriber::EnvFilter;

use crate::cli::{Cli, Command};

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    if args.next().is_some_and(|arg| arg == supervisor::ARG) {
        return supervisor::main(args);
    }
    // The supervisor above holds no secret; this process has ANYLOCK_BACKEND's password.
    secrets::hide_this_process();
    let cli = match parse() {
        Ok(cli) => cli,
        Err(err) if !err.use_stderr() => {
            let _ = err.print();
            return ExitCode::SUCCESS;
        }
        Err(err) => {
            // clap's whole message: its first line says what is wrong, the rest names the
            // missing argument and the `-- CMD` form.
            let text = err.render().to_string();
            note!("anylock: {}", text.trim_end().trim_start_matches("error: "));
            return ExitCode::from(exit::USAGE);
        }
    };
    init_logging(cli.verbose, cli.quiet);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            note!("anylock: cannot start the async runtime: {err}");
            return ExitCode::from(exit::FAILED);
        }
    };
    ExitCode::from(runtime.block_on(dispatch(cli)))
}

/// The command line, with `--version` naming the backends this build has.
fn parse() -> Result<Cli, clap::Error> {
    let backends: Vec<&str> = anylock::compiled_guarantees()
        .into_iter()
        .map(|(name, _)| name)
        // In-process only: `anylock` refuses it.
        .filter(|name| *name != "memory")
        .collect();
    // Built once per process; clap keeps `'static` strings.
    let version: &'static str = Box::leak(
        format!(
            "{} (backends: {})",
            env!("CARGO_PKG_VERSION"),
            backends.join(", ")
        )
        .into_boxed_str(),
    );
    let matches = Cli::command().version(version).try_get_matches()?;
    let mut cli = Cli::from_arg_matches(&matches)?;
    cli.backend_on_command_line =
        matches.value_source("backend") == Some(clap::parser::ValueSource::CommandLine);
    Ok(cli)
}

fn init_logging(verbose: u8, quiet: bool) {
    let level = match verbose {
        _ if quiet => "error",
        // lockcore's own "lease lost" warning would repeat the CLI's message, and
        // gcp_auth warns on each internal retry while it probes for credentials; the
        // CLI's one-line error says what failed.
        0 => "warn,lockcore=error,gcp_auth=error",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_env("ANYLOCK_LOG").unwrap_or_else(|_| EnvFilter::new(level));
    // Each line is cleaned on its way out (`terminal`), which would garble colours.
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| terminal::LogWriter)
        .with_target(false)
        .with_ansi(false)
        .init();
}

async fn dispatch(cli: Cli) -> u8 {
    let config = match select::config(&cli) {
        Ok(config) => config,
        Err(err) => {
            exit::report(&err);
            return exit::code_for(&err);
        }
    };
    let result = match cli.command {
        Command::Run(args) => return run::run(args, &config, cli.quiet).await,
        Command::Acquire(args) => return steps::acquire(args, &config, cli.quiet).await,
        Command::Verify { held, json } => steps::verify(&held, json, &config).await,
        Command::Release(held) => steps::release(&held, &config).await,
        Command::Elect(args) if args.permits.is_some() => {
            let err = lockcore::Error::invalid_input(
                "elect takes no --permits: an election has one leader",
            );
            exit::report(&err);
            return exit::code_for(&err);
        }
        Command::Elect(args) => return run::run(args, &config, cli.quiet).await,
        Command::Leader { name, json, watch } => {
            return match elect::leader(&name, json, watch, &config).await {
                Ok(true) => 0,
                Ok(false) => exit::FREE,
                Err(err) => {
                    let err = admin::explain(err);
                    exit::report(&err);
                    exit::code_for(&err)
                }
            };
        }
        Command::Status {
            name,
            json,
            permits,
        } => {
            let status = match permits {
                true => admin::permits_status(&name, json, &config).await,
                false => admin::status(&name, json, &config).await,
            };
            return match status {
                Ok(true) => 0,
                Ok(false) => exit::FREE,
                Err(err) => {
                    // The hints of `explain` are about locks.
                    let err = if permits { err } else { admin::explain(err) };
                    exit::report(&err);
                    exit::code_for(&err)
                }
            };
        }
        Command::List { prefix, json } => admin::list(&prefix, json, &config).await,
        Command::Break { name, yes } => admin::break_lock(&name, yes, &config).await,
        Command::Guarantees { json } => {
            admin::guarantees(json);
            Ok(())
        }
        Command::Check { url, json } => admin::check(url, json, &config).await,
        Command::Completions { shell } => {
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "anylock",
                &mut std::io::stdout(),
            );
            Ok(())
        }
    };
    match result.map_err(admin::explain) {
        Ok(()) => 0,
        Err(err) => {
            exit::report(&err);
            exit::code_for(&err)
        }
    }
}
