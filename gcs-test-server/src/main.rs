//! `gcs-test-server [--host 127.0.0.1] [--port 0] [--bucket NAME]...`:
//! runs the in-memory GCS JSON-API test server until killed and prints its
//! base URL (one line on stdout) once it accepts connections.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use gcs_test_server::GcsTestServer;

const USAGE: &str = "usage: gcs-test-server [--host ADDR] [--port PORT] [--bucket NAME]...";

#[derive(Debug)]
struct Args {
    host: IpAddr,
    port: u16,
    buckets: Vec<String>,
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut parsed = Args {
        host: IpAddr::V4(Ipv4Addr::LOCALHOST),
        port: 0,
        buckets: Vec::new(),
    };
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--host" => parsed.host = value()?.parse().map_err(|e| format!("--host: {e}"))?,
            "--port" => parsed.port = value()?.parse().map_err(|e| format!("--port: {e}"))?,
            "--bucket" => parsed.buckets.push(value()?),
            "-h" | "--help" => return Err(USAGE.to_owned()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    Ok(parsed)
}

#[tokio::main]
async fn main() {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            std::process::exit(2);
        }
    };
    let server = match GcsTestServer::bind(SocketAddr::new(args.host, args.port)).await {
        Ok(server) => server,
        Err(e) => {
            eprintln!(
                "gcs-test-server: cannot bind {}:{}: {e}",
                args.host, args.port
            );
            std::process::exit(1);
        }
    };
    for bucket in &args.buckets {
        server.create_bucket(bucket);
    }
    println!("{}", server.url());
    let _ = std::io::stdout().flush();
    std::future::pending::<()>().await;
}
