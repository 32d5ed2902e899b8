//! Tests of the URL forms [`RedisConfig`] and [`RedlockConfig`] read.

use std::time::Duration;

use lockcore::ErrorKind;

use crate::config::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_NODE_TIMEOUT, DEFAULT_PREFIX, DEFAULT_TIMEOUT,
};
#[cfg(feature = "tls")]
use crate::node_url::NodeUrl;
use crate::{RedisConfig, RedlockConfig};

/// A raw `?` or `#` in a password makes the rest of it look like a parameter or a
/// fragment; neither may be echoed.
#[test]
fn the_rest_of_a_password_with_a_raw_question_mark_or_hash_is_not_echoed() {
    for url in [
        "redis://app:1234?topsecretpw@127.0.0.1:6379",
        "rediss://app:1234#topsecretpw@127.0.0.1:6380",
        "redis://app:1234#topsecretpw@127.0.0.1:6379/0",
    ] {
        let err = RedisConfig::from_url(url).expect_err("not a usable URL");
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{url}");
        let shown = format!("{err} {err:?}");
        assert!(!shown.contains("topsecret"), "{url}: {shown}");
    }
}

#[test]
fn single_url_with_credentials_db_and_params() {
    let url = "redis://app:s3cr%2Fet@127.0.0.1:7000/3?prefix=jobs&timeout_ms=250";
    let config = RedisConfig::from_url(url).expect("valid");
    assert_eq!(config.prefix(), "jobs");
    assert_eq!(config.timeout(), Duration::from_millis(250));
    assert_eq!(config.connect_timeout(), DEFAULT_CONNECT_TIMEOUT);
    assert_eq!(config.redacted_url(), "redis://app:***@127.0.0.1:7000/3");
    for shown in [format!("{config}"), format!("{config:?}")] {
        assert!(!shown.contains("s3cr"), "{shown}");
        assert!(shown.contains("***"), "{shown}");
    }
    let again = RedisConfig::from_url(&config.to_string()).expect("Display parses back");
    assert_eq!(again.prefix(), "jobs");
    assert_eq!(again.timeout(), Duration::from_millis(250));
}

#[test]
fn a_plus_in_the_query_is_a_plus_as_in_every_backend() {
    let config = RedisConfig::from_url("redis://127.0.0.1:7000/?prefix=a+b%2Bc").expect("valid");
    assert_eq!(config.prefix(), "a+b+c");
    let err = RedisConfig::from_url("redis://127.0.0.1:7000/?prefix=50%zz").expect_err("bad %");
    assert_eq!(err.kind(), lockcore::ErrorKind::InvalidInput);
}

#[test]
fn defaults_apply() {
    let config = RedisConfig::from_url("redis://localhost").expect("valid");
    assert_eq!(config.prefix(), DEFAULT_PREFIX);
    assert_eq!(config.timeout(), DEFAULT_TIMEOUT);
    assert!(config.node().connector(DEFAULT_TIMEOUT).is_ok());
}

#[test]
fn protocol_passes_through_and_unknown_params_fail() {
    let config = RedisConfig::from_url("redis://h:1/0?protocol=resp3&prefix=p").expect("ok");
    assert_eq!(config.redacted_url(), "redis://h:1/0?protocol=resp3");
    let err = RedisConfig::from_url("redis://h:1/0?prefx=p").expect_err("typo");
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert!(err.to_string().contains("prefx"), "{err}");
}

#[test]
fn bad_urls_are_invalid_input_without_the_password() {
    for bad in [
        "http://u:hunter2@h:1",
        "redis://u:hunter2@h:1/notadb",
        "redis://u:hunter2@h:1/0?timeout_ms=0",
        "redis://u:hunter2@h:1/0?prefix=%7Bx%7D",
        "redis://u:hunter2@h:1/0?prefix=",
        "not a url hunter2",
        "redis://u:hunter2@/0",
    ] {
        let err = RedisConfig::from_url(bad).expect_err(bad);
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{bad}: {err}");
        assert!(!format!("{err} {err:?}").contains("hunter2"), "{err:?}");
    }
}

#[test]
fn redlock_host_list_form() {
    let url = "redlock://:pw@h1:1,h2:2,h3:3/1?prefix=x&timeout_ms=20";
    let config = RedlockConfig::from_url(url).expect("valid");
    assert_eq!(config.nodes(), 3);
    assert_eq!(config.quorum(), 2);
    assert_eq!(config.prefix(), "x");
    assert_eq!(config.node_timeout(), Duration::from_millis(20));
    assert_eq!(
        config.redacted_urls(),
        [
            "redis://:***@h1:1/1",
            "redis://:***@h2:2/1",
            "redis://:***@h3:3/1"
        ]
    );
    assert!(!format!("{config} {config:?}").contains("pw"));
    let again = RedlockConfig::from_url(&config.to_string()).expect("Display parses back");
    assert_eq!(again.nodes(), 3);
    assert_eq!(again.node_timeout(), Duration::from_millis(20));
}

#[test]
fn redlock_node_list_form_and_its_checks() {
    let list = "redis://a:1,redis://b:2,redis://c:3,redis://d:4,redis://e:5";
    let config = RedlockConfig::from_url(list).expect("valid");
    assert_eq!((config.nodes(), config.quorum()), (5, 3));
    assert_eq!(config.node_timeout(), DEFAULT_NODE_TIMEOUT);
    let twice = RedlockConfig::from_url("redis://a:1,redis://a:1/2").expect_err("dup");
    assert!(twice.to_string().contains("twice"), "{twice}");
    let disagree = RedlockConfig::from_url("redis://a:1?prefix=x,redis://b:1?prefix=y");
    assert_eq!(
        disagree.expect_err("disagree").kind(),
        ErrorKind::InvalidInput
    );
    assert!(RedlockConfig::from_url("redlock://h1:1,,h3:3").is_err());
    assert!(RedlockConfig::from_node_urls(Vec::<String>::new()).is_err());
}

/// One server listed twice under two spellings would count twice towards the quorum
/// (issue #14): `localhost`, `127.0.0.1` and `[::1]` on one port are one server.
#[test]
fn the_same_node_under_another_spelling_is_listed_twice() {
    for list in [
        "redlock://localhost:7000,127.0.0.1:7000,b:1",
        "redlock://127.0.0.1,[::1]:6379,b:1",
        "redis://LOCALHOST.:1,redis://127.0.0.1:1/3",
        "redlock://[::ffff:127.0.0.1]:5,localhost:5,b:1",
        "redlock://Host.Example:1,host.example.:1,b:1",
        "redlock://[0:0:0:0:0:0:0:1]:2,127.0.0.1:2,b:1",
    ] {
        let err = RedlockConfig::from_url(list).expect_err(list);
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{list}");
        assert!(err.to_string().contains("listed twice"), "{list}: {err}");
    }
    let distinct = RedlockConfig::from_url("redlock://localhost:1,127.0.0.1:2,[::1]:3");
    assert_eq!(distinct.expect("distinct ports").nodes(), 3);
}

#[test]
fn even_node_counts_need_a_strict_majority() {
    let config = RedlockConfig::from_url("redlock://a:1,b:1,c:1,d:1").expect("valid");
    assert_eq!(config.quorum(), 3);
}

#[cfg(not(feature = "tls"))]
#[test]
fn tls_urls_need_the_tls_feature() {
    let err = RedisConfig::from_url("rediss://h:6380/0").expect_err("no TLS built in");
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    let err = RedlockConfig::from_url("redlocks://h1:1,h2:2,h3:3").expect_err("no TLS");
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
}

/// A self-signed certificate and key (PEM) in a fresh directory, made by `openssl`.
#[cfg(feature = "tls")]
fn pem_files() -> (std::path::PathBuf, String, String) {
    let dir = std::env::temp_dir().join(format!("anylock-redis-pem-{:x}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let status = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
        ])
        .args(["-nodes", "-days", "1", "-subj", "/CN=localhost"])
        .args(["-keyout", "key.pem", "-out", "cert.pem"])
        .current_dir(&dir)
        .stderr(std::process::Stdio::null())
        .status()
        .expect("openssl must be installed");
    assert!(status.success());
    let cert = dir.join("cert.pem").display().to_string();
    let key = dir.join("key.pem").display().to_string();
    (dir, cert, key)
}

/// `ca`, `cert` and `key` are read at parse time, shown (paths, not contents) by Display
/// and Debug, and parse back; Redlock gives every node the same files.
#[cfg(feature = "tls")]
#[test]
fn tls_files_are_loaded_and_shown_as_paths() {
    let (dir, cert, key) = pem_files();
    let url = format!("rediss://u:hunter2@h:1/0?ca={cert}&cert={cert}&key={key}");
    let config = RedisConfig::from_url(&url).expect("valid");
    let material = config.node().tls_material().expect("loaded");
    assert!(material.ca().is_some() && material.client().is_some());
    let shown = format!("{config} {config:?}");
    assert!(shown.contains(&format!("ca={cert}")), "{shown}");
    assert!(
        !shown.contains("hunter2") && !shown.contains("PRIVATE KEY"),
        "{shown}"
    );
    let again = RedisConfig::from_url(&config.to_string()).expect("Display parses back");
    assert_eq!(again.to_string(), config.to_string());
    let redlock = format!("redlocks://:pw@h1:1,h2:2,h3:3/0?ca={cert}");
    let config = RedlockConfig::from_url(&redlock).expect("valid");
    assert!(
        config
            .node_urls()
            .iter()
            .all(|n| n.tls_material().is_some_and(|m| m.ca().is_some()))
    );
    let again = RedlockConfig::from_url(&config.to_string()).expect("Display parses back");
    assert_eq!(again.to_string(), config.to_string());
    // Node lists: the files must agree, like every other parameter.
    let list = format!("rediss://a:1?ca={cert},rediss://b:2,rediss://c:3?ca={cert}");
    let err = RedlockConfig::from_url(&list).expect_err("disagree");
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    assert!(err.to_string().contains("ca, cert or key"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

/// TLS parameters on a plaintext scheme are refused (Config), naming the TLS scheme the
/// user should write; files are checked before any connection.
#[test]
fn tls_parameters_need_a_tls_scheme_and_usable_files() {
    let cases = [
        ("redis://u:hunter2@h:1/0?ca=/etc/ca.pem", "`rediss://`"),
        (
            "redlock://:hunter2@h1:1,h2:2?cert=/c.pem&key=/k.pem",
            "`redlocks://`",
        ),
        ("redis://a:1?ca=/x.pem,redis://b:2", "`rediss://`"),
    ];
    for (url, fix) in cases {
        let err = match url.starts_with("redis://") && !url.contains(',') {
            true => RedisConfig::from_url(url).map(|_| ()),
            false => RedlockConfig::from_url(url).map(|_| ()),
        }
        .expect_err(url);
        assert_eq!(err.kind(), ErrorKind::Config, "{url}: {err}");
        assert!(err.to_string().contains(fix), "{url}: {err}");
        assert!(!format!("{err} {err:?}").contains("hunter2"), "{err:?}");
    }
    if cfg!(feature = "tls") {
        let err = RedisConfig::from_url("rediss://h:1/0?ca=/no/such/ca.pem").expect_err("x");
        assert_eq!(err.kind(), ErrorKind::Config, "{err}");
        assert!(err.to_string().contains("`ca` (/no/such/ca.pem)"), "{err}");
        let err = RedisConfig::from_url("rediss://h:1/0?cert=/c.pem").expect_err("no key");
        assert_eq!(err.kind(), ErrorKind::Config, "{err}");
        let err = RedisConfig::from_url("rediss://h:1/0?ca=").expect_err("empty");
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    }
}

#[cfg(feature = "tls")]
#[test]
fn tls_urls_are_accepted() {
    let single = RedisConfig::from_url("rediss://h:6380/0#insecure").expect("valid");
    assert!(single.node().is_tls());
    let redlock = RedlockConfig::from_url("redlocks://h1:1,h2:2,h3:3").expect("valid");
    assert!(redlock.node_urls().iter().all(NodeUrl::is_tls));
}

/// A TLS file path with characters a query or a node list reads as syntax is written
/// percent-encoded by `Display`, so it parses back to the same file.
#[cfg(feature = "tls")]
#[test]
fn tls_file_paths_with_query_syntax_round_trip() {
    let (dir, cert, _key) = pem_files();
    let odd = dir.join("a b,c+d&e=f#g");
    std::fs::create_dir_all(&odd).expect("odd dir");
    let ca = odd.join("ca.pem");
    std::fs::copy(&cert, &ca).expect("copy");
    let encoded = lockcore::url::percent_encode(&ca.display().to_string(), " ,+&=#");
    let config = RedisConfig::from_url(&format!("rediss://h:1/0?ca={encoded}")).expect("valid");
    let shown = config.to_string();
    assert!(!shown.contains("a b,c+d"), "{shown}");
    let again = RedisConfig::from_url(&shown).expect("Display parses back");
    assert_eq!(again.to_string(), shown);
    let list = RedlockConfig::from_url(&format!("redlocks://h1:1,h2:2,h3:3/0?ca={encoded}"))
        .expect("valid");
    let again = RedlockConfig::from_url(&list.to_string()).expect("Display parses back");
    assert_eq!(again.nodes(), 3);
    let _ = std::fs::remove_dir_all(dir);
}

/// A node list mixing TLS and plaintext nodes would send the password unencrypted to the
/// plaintext ones (a quorum of them here) while the TLS node suggests an encrypted
/// deployment: refused, unless every node says `allow_mixed_tls=true` (found by review).
#[cfg(feature = "tls")]
#[test]
fn a_node_list_mixing_tls_and_plaintext_is_refused_unless_allowed() {
    let mixed = "rediss://:s3cret@h1:1,redis://:s3cret@h2:2,redis://:s3cret@h3:3";
    let err = RedlockConfig::from_url(mixed).expect_err("mixed");
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    let text = err.to_string();
    assert!(text.contains("1 TLS (rediss://) and 2 plaintext"), "{text}");
    assert!(text.contains("allow_mixed_tls=true"), "{text}");
    assert!(!text.contains("s3cret"), "{text}");
    let only_one = "rediss://h1:1?allow_mixed_tls=true,redis://h2:2,redis://h3:3";
    RedlockConfig::from_url(only_one).expect_err("every node must say so");
    let allowed = "rediss://h1:1?allow_mixed_tls=true,redis://h2:2?allow_mixed_tls=true,\
                   redis://h3:3?allow_mixed_tls=true";
    let config = RedlockConfig::from_url(allowed).expect("allowed");
    assert_eq!(config.nodes(), 3);
    let again = RedlockConfig::from_url(&config.to_string()).expect("Display parses back");
    assert_eq!(again.to_string(), config.to_string());
    let (dir, cert, _key) = pem_files();
    let with_ca = format!(
        "rediss://h1:1?ca={cert}&allow_mixed_tls=true,redis://h2:2?allow_mixed_tls=true,\
         rediss://h3:3?allow_mixed_tls=true&ca={cert}"
    );
    RedlockConfig::from_url(&with_ca).expect("the TLS nodes agree on their CA");
    let _ = std::fs::remove_dir_all(dir);
    RedlockConfig::from_url("rediss://h1:1,rediss://h2:2,rediss://h3:3").expect("all TLS");
    RedlockConfig::from_url("redis://h1:1,redis://h2:2,redis://h3:3").expect("all plaintext");
    let err = RedisConfig::from_url("redis://h:1/0?allow_mixed_tls=true").expect_err("single");
    assert!(err.to_string().contains("Redlock parameter"), "{err}");
}

/// `#insecure` on a plaintext URL was silently ignored (there is no certificate to skip):
/// refused like the other TLS parameters on a plaintext scheme.
#[test]
fn insecure_on_a_plaintext_url_is_refused() {
    let single = RedisConfig::from_url("redis://h:1/0#insecure").expect_err("plaintext");
    assert_eq!(single.kind(), ErrorKind::Config, "{single}");
    assert!(single.to_string().contains("use `rediss://`"), "{single}");
    let hosts = RedlockConfig::from_url("redlock://h1:1,h2:2,h3:3#insecure").expect_err("list");
    assert!(hosts.to_string().contains("use `redlocks://`"), "{hosts}");
    let nodes = "redis://a:1#insecure,redis://b:2#insecure,redis://c:3#insecure";
    let err = RedlockConfig::from_url(nodes).expect_err("node list");
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
}
