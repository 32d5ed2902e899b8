//! Google credentials through the `anylock` binary, end to end against the GCS test server
//! with auth required: a service-account key named by `GOOGLE_APPLICATION_CREDENTIALS`,
//! the `gcloud` CLI (a stand-in script on `PATH`), and no credentials at all. Each child
//! gets an empty `HOME` and a `PATH` of its own, so the machine's own credentials never
//! leak in. The metadata-server route is not covered: gcp_auth asks the fixed host
//! `metadata.google.internal`, which a test cannot point at loopback.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use gcs_test_server::GcsTestServer;

const BIN: &str = env!("CARGO_BIN_EXE_anylock");

/// A test server requiring auth, on its own runtime, with a bucket and a scratch home.
struct Scene {
    runtime: tokio::runtime::Runtime,
    server: GcsTestServer,
    home: PathBuf,
}

impl Scene {
    fn new() -> Self {
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        let server = runtime.block_on(GcsTestServer::start());
        assert!(server.create_bucket("cli-locks"));
        server.require_auth();
        let home =
            std::env::temp_dir().join(format!("anylock-gcs-cli-{:016x}", rand::random::<u64>()));
        std::fs::create_dir_all(home.join("bin")).expect("scratch home");
        Self {
            runtime,
            server,
            home,
        }
    }

    fn url(&self) -> String {
        format!(
            "gs://cli-locks/ci/?endpoint={}&auth=google",
            self.server.url()
        )
    }

    /// `anylock run job -- true` with only `env` beyond a clean slate.
    fn run(&self, env: &[(&str, &str)]) -> Output {
        let path = format!("{}/bin", self.home.display());
        let mut command = Command::new(BIN);
        command
            .args(["run", "job", "--", "/bin/true"])
            .env_clear()
            .env("HOME", &self.home)
            .env("PATH", path)
            .env("ANYLOCK_BACKEND", self.url())
            .env("XDG_CONFIG_HOME", &self.home)
            .stdin(Stdio::null());
        for (key, value) in env {
            command.env(key, value);
        }
        command.output().expect("run anylock")
    }
}

impl Drop for Scene {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.home);
        let _guard = self.runtime.enter();
    }
}

fn key_file(scene: &Scene) -> PathBuf {
    let path = scene.home.join("key.json");
    std::fs::write(&path, scene.server.service_account_key_json()).expect("write key");
    path
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Issue 7: `GOOGLE_APPLICATION_CREDENTIALS` names a service-account key; the CLI signs a
/// JWT, gets a token from the key's `token_uri`, and runs the command under the lock.
#[test]
fn google_application_credentials_authenticate_the_cli() {
    let scene = Scene::new();
    let key = key_file(&scene);
    let out = scene.run(&[(
        "GOOGLE_APPLICATION_CREDENTIALS",
        key.to_str().expect("utf-8"),
    )]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(scene.server.tokens_granted(), 1);
    // One lock cycle, every call authorised. A slow acquire (over 300 ms on a loaded
    // machine) also GETs the lock to show who holds it; that read is not part of the cycle.
    let requests = scene.server.requests();
    let writes: Vec<&str> = requests
        .iter()
        .filter(|r| r.method != "GET")
        .map(|r| r.method.as_str())
        .collect();
    assert_eq!(writes, ["POST", "DELETE"], "{requests:?}");
    assert!(requests.iter().all(|r| r.status != 401), "{requests:?}");
}

/// Without a key file or application-default credentials, the token comes from
/// `gcloud auth print-access-token`.
#[test]
fn the_gcloud_cli_supplies_the_token() {
    let scene = Scene::new();
    scene.server.allow_token("ya29.from-gcloud");
    let script = scene.home.join("bin/gcloud");
    std::fs::write(
        &script,
        "#!/bin/sh\ncase \"$1 $2\" in\n  'auth print-access-token') echo ya29.from-gcloud ;;\n  'config get-value') echo anylock-test ;;\n  *) exit 1 ;;\nesac\n",
    )
    .expect("write gcloud");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let out = scene.run(&[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(scene.server.tokens_granted(), 0, "no JWT flow");
    // Every call authorised (the CLI may also GET the lock to show who holds it: a 404).
    let requests = scene.server.requests();
    assert!(
        requests
            .iter()
            .any(|r| r.method == "DELETE" && r.status == 204),
        "{requests:?}"
    );
    assert!(requests.iter().all(|r| r.status != 401), "{requests:?}");
}

/// With no credentials anywhere, one line tells the user every way to provide them (exit
/// code 2: a configuration problem, not a backend failure), and nothing reaches the server.
#[test]
fn no_credentials_anywhere_is_one_actionable_line() {
    let scene = Scene::new();
    let out = scene.run(&[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let text = stderr(&out);
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(text.contains("no Google credentials found"), "{text}");
    assert!(text.contains("GOOGLE_APPLICATION_CREDENTIALS"), "{text}");
    assert!(scene.server.requests().is_empty());
}

/// Issue #17 item 8: `GOOGLE_APPLICATION_CREDENTIALS` names an `external_account` file (as
/// `google-github-actions/auth` writes it): the CLI reads the subject token file, exchanges
/// it at the STS endpoint, and runs the command under the lock. No key, no gcloud.
#[test]
fn workload_identity_federation_authenticates_the_cli() {
    let scene = Scene::new();
    let audience =
        "//iam.googleapis.com/projects/1/locations/global/workloadIdentityPools/ci/providers/gh";
    scene
        .server
        .trust_workload_identity(audience, "subject-from-ci");
    let token = scene.home.join("oidc-token");
    std::fs::write(&token, "subject-from-ci").expect("write token");
    let file = scene
        .server
        .external_account_json(serde_json::json!({ "file": token }));
    let path = scene.home.join("wif.json");
    std::fs::write(&path, file.to_string()).expect("write credentials");
    let out = scene.run(&[(
        "GOOGLE_APPLICATION_CREDENTIALS",
        path.to_str().expect("utf-8"),
    )]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(scene.server.token_exchanges(), 1);
    assert_eq!(
        scene.server.tokens_granted(),
        0,
        "no service-account JWT flow"
    );
    let requests = scene.server.requests();
    assert!(
        requests
            .iter()
            .any(|r| r.method == "DELETE" && r.status == 204),
        "{requests:?}"
    );
    assert!(requests.iter().all(|r| r.status != 401), "{requests:?}");
}
