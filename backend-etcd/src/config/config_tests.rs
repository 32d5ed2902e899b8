//! Tests of the config: URL parsing, TLS parameters, display and redaction.

use super::*;
use lockcore::ErrorKind;

#[test]
fn parses_endpoints_prefix_and_defaults() {
    let c = EtcdConfig::from_url("etcd://h1:2379,h2,[::1]:2380").expect("ok");
    assert_eq!(
        c.endpoints(),
        ["http://h1:2379", "http://h2:2379", "http://[::1]:2380"]
    );
    assert_eq!(c.prefix(), "");
    assert!(!c.tls());
    assert_eq!(c.request_timeout(), Duration::from_secs(5));
    assert_eq!(c.credentials(), None);
    assert_eq!(EtcdConfig::from_url("etcd://h/").expect("ok").prefix(), "");
    assert_eq!(
        EtcdConfig::from_url("etcd://h/a/b").expect("ok").prefix(),
        "a/b/"
    );
    assert_eq!(
        EtcdConfig::from_url("etcd://h/a/").expect("ok").prefix(),
        "a/"
    );
    assert_eq!(
        EtcdConfig::from_url("etcd://h/a%20b").expect("ok").prefix(),
        "a b/"
    );
}

#[test]
fn parses_tls_auth_and_options() {
    let c = EtcdConfig::from_url(
        "etcds://u%40corp:p%3Ass@h:1/x?timeout=250ms&connect_timeout=2&ca=/etc/ca.pem",
    )
    .expect("ok");
    assert!(c.tls());
    assert_eq!(c.endpoints(), ["https://h:1"]);
    assert_eq!(c.credentials(), Some(("u@corp", "p:ss")));
    assert_eq!(c.request_timeout(), Duration::from_millis(250));
    assert_eq!(c.connect_timeout(), Duration::from_secs(2));
    assert_eq!(c.ca(), Some(std::path::Path::new("/etc/ca.pem")));
    let c = EtcdConfig::from_url("etcd://h?tls=true&cert=/c&key=/k").expect("ok");
    assert!(c.tls());
    assert!(c.client_cert().is_some());
    let c = EtcdConfig::new(["https://h:9"]).expect("ok");
    assert!(c.tls());
}

#[test]
fn tls_parameters_on_a_plaintext_url_are_refused() {
    for url in [
        "etcd://u:hunter2@h?ca=/etc/ca.pem",
        "etcd://u:hunter2@h?cert=/c.pem&key=/k.pem",
        "etcd://u:hunter2@h?key=/k.pem",
        "etcd://u:hunter2@h?ca=/etc/ca.pem&tls=false",
        "etcds://u:hunter2@h?ca=/etc/ca.pem&tls=false",
        "etcds://u:hunter2@h?tls=false",
    ] {
        let err = EtcdConfig::from_url(url).expect_err(url);
        assert_eq!(err.kind(), ErrorKind::Config, "{url}: {err}");
        assert!(err.message().contains("etcd"), "{url}: {err}");
        assert!(!err.to_string().contains("hunter2"), "{err}");
    }
    let err = EtcdConfig::from_url("etcd://h?ca=/etc/ca.pem").expect_err("plaintext");
    assert!(err.message().contains("`etcds://`"), "{err}");
    assert!(err.message().contains("ca"), "{err}");
    // An explicit `tls=true` asks for TLS: the files are used, nothing is downgraded.
    let c = EtcdConfig::from_url("etcd://h?ca=/etc/ca.pem&tls=true").expect("explicit tls");
    assert!(c.tls());
    assert_eq!(c.endpoints(), ["https://h:2379"]);
    assert_eq!(c.to_string(), "etcds://h:2379/?ca=/etc/ca.pem");
    // Built by hand: files imply TLS, and turning TLS off again is refused at load.
    let c = EtcdConfig::new(["h"])
        .expect("ok")
        .with_ca("/x")
        .with_tls(false);
    assert_eq!(
        c.load_tls().expect_err("plaintext").kind(),
        ErrorKind::Config
    );
}

#[test]
fn tls_files_are_loaded_before_connecting_and_named_when_bad() {
    let dir = std::env::temp_dir().join(format!("anylock-etcd-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp");
    let missing = dir.join("missing.pem");
    let junk = dir.join("junk.pem");
    std::fs::write(&junk, "not a certificate").expect("write");
    for (url, param, path) in [
        (
            format!("etcds://h?ca={}", missing.display()),
            "`ca`",
            &missing,
        ),
        (format!("etcds://h?ca={}", junk.display()), "`ca`", &junk),
        (
            format!("etcds://h?cert={}&key={}", junk.display(), junk.display()),
            "`cert`",
            &junk,
        ),
    ] {
        let config = EtcdConfig::from_url(&url).expect("parses");
        let err = config.load_tls().expect_err(&url);
        assert_eq!(err.kind(), ErrorKind::Config, "{url}: {err}");
        assert!(err.message().contains(param), "{url}: {err}");
        let shown = path.display().to_string();
        assert!(err.message().contains(&shown), "{url}: {err}");
    }
    let half = EtcdConfig::from_url(&format!("etcds://h?cert={}", junk.display()));
    let err = half
        .expect("parses")
        .load_tls()
        .expect_err("cert without key");
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn rejects_bad_urls_with_typed_errors() {
    for bad in [
        "redis://h",
        "etcd://",
        "etcd://h:99999",
        "etcd://h:port",
        "etcd://h1,,h2",
        "etcd://h?tls=maybe",
        "etcd://h?timeout=0s",
        "etcd://h?timeout=5x",
        "etcd://h?colour=blue",
        "etcd://h/%zz",
        "etcd://[::1/",
        "etcds://h?ca=",
        "etcds://h?ca=/a&ca=/b",
    ] {
        let err = EtcdConfig::from_url(bad).expect_err(bad);
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{bad}: {err}");
    }
    assert!(EtcdConfig::new(Vec::<String>::new()).is_err());
    // The shared reader takes humantime too: `5h` (refused before) and `1m30s`.
    let c = EtcdConfig::from_url("etcd://h?timeout=5h&connect_timeout=1m30s").expect("ok");
    assert_eq!(c.request_timeout(), Duration::from_secs(5 * 3600));
    assert_eq!(c.connect_timeout(), Duration::from_secs(90));
    assert_eq!(EtcdConfig::from_url(&c.to_string()).expect("round trip"), c);
}

#[test]
fn display_and_debug_redact_the_password() {
    let c = EtcdConfig::from_url("etcd://root:hunter2@h1,h2:2380/locks?timeout=2s").expect("ok");
    let shown = c.to_string();
    assert_eq!(shown, "etcd://root:***@h1:2379,h2:2380/locks/?timeout=2s");
    let debug = format!("{c:?}");
    assert!(!debug.contains("hunter2"), "{debug}");
    assert!(debug.contains("***"), "{debug}");
    for bad in [
        "etcd://root:hunter2@h?bogus=1",
        "etcd://root:hunter1@h1,root:hunter2@h2/x",
        "etcd://root:hunter2@h1:port",
    ] {
        let err = EtcdConfig::from_url(bad).expect_err(bad);
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
        assert!(!err.to_string().contains("hunter"), "{err}");
    }
    let reparsed = EtcdConfig::from_url(&shown.replace("***", "hunter2")).expect("ok");
    assert_eq!(reparsed, c);
    let url = "etcds://root:hunter2@h/l?ca=/s/ca.pem&cert=/s/c.pem&key=/s/k.pem";
    let c = EtcdConfig::from_url(url).expect("ok");
    let (shown, debug) = (c.to_string(), format!("{c:?}"));
    assert_eq!(
        shown,
        "etcds://root:***@h:2379/l/?ca=/s/ca.pem&cert=/s/c.pem&key=/s/k.pem"
    );
    assert!(
        debug.contains("/s/k.pem") && !debug.contains("hunter2"),
        "{debug}"
    );
    let reparsed = EtcdConfig::from_url(&shown.replace("***", "hunter2")).expect("ok");
    assert_eq!(reparsed, c);
}
