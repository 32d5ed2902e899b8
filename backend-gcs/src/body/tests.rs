//! The largest replies GCS can send fit their limits; a body is read only up to its limit.

use serde_json::{Value, json};

use super::*;

/// A name of `len` bytes as GCS's JSON writes it at its largest: every character escaped
/// (`\u003d`; Google's JSON escapes `=`, `<`, `>`, `&` and `'` this way), six bytes each.
fn escaped_name(len: usize) -> String {
    "=".repeat(len)
}

/// The name in a link: percent-encoded, three bytes per byte.
fn link_name(len: usize) -> String {
    "%3D".repeat(len)
}

/// An object resource as GCS sends it for the name `prefix/…`, 1,024 bytes (GCS's most),
/// with 8 KiB of custom metadata (GCS's most) escaped, and `acl` entries (full
/// projection) each repeating the name.
fn largest_object(acl_entries: usize) -> Value {
    const NAME: usize = 1024;
    let bucket = "b".repeat(63);
    let (name, link) = (escaped_name(NAME), link_name(NAME));
    let generation = "1764633600000000";
    // 8 KiB of keys and values, GCS's most, every byte escaped: one key, one value.
    let metadata = json!({ "k": "=".repeat(8191) });
    let email = format!(
        "{}@{}.iam.gserviceaccount.com",
        "a".repeat(30),
        "p".repeat(30)
    );
    let acl: Vec<Value> = (0..acl_entries)
        .map(|i| {
            json!({
                "kind": "storage#objectAccessControl",
                "id": format!("{bucket}/{name}/{generation}/user-{i}{email}"),
                "selfLink": format!("https://www.googleapis.com/storage/v1/b/{bucket}/o/{link}/acl/user-{i}{email}"),
                "bucket": bucket, "object": name, "generation": generation,
                "entity": format!("user-{i}{email}"), "role": "OWNER", "email": format!("{i}{email}"),
                "etag": "CAE=", "projectTeam": {"projectNumber": "123456789012", "team": "owners"},
            })
        })
        .collect();
    let mut object = json!({
        "kind": "storage#object",
        "id": format!("{bucket}/{name}/{generation}"),
        "selfLink": format!("https://www.googleapis.com/storage/v1/b/{bucket}/o/{link}"),
        "mediaLink": format!("https://storage.googleapis.com/download/storage/v1/b/{bucket}/o/{link}?generation={generation}&alt=media"),
        "name": name, "bucket": bucket, "generation": generation, "metageneration": "12345",
        "contentType": "application/octet-stream", "storageClass": "STANDARD", "size": "0",
        "md5Hash": "1B2M2Y8AsgTpgAmY7PhCfg==", "cacheControl": "no-store", "crc32c": "AAAAAA==",
        "etag": "CJCS6rLc1ZEDEAE=", "timeCreated": "2026-12-01T10:00:00.123Z",
        "updated": "2026-12-01T10:00:00.123Z", "timeStorageClassUpdated": "2026-12-01T10:00:00.123Z",
        "metadata": metadata,
    });
    if acl_entries > 0 {
        object["acl"] = json!(acl);
        object["owner"] = json!({"entity": format!("user-{email}"), "entityId": "0".repeat(21)});
    }
    object
}

/// Its JSON length with every escapable character escaped as Google's JSON escapes it.
fn wire_len(value: &Value) -> usize {
    let text = value.to_string();
    text.len() + 5 * text.matches('=').count()
}

/// The numbers `body.rs`'s documentation quotes, and each limit's headroom over them.
#[test]
fn the_largest_replies_gcs_can_send_fit_their_limits() {
    let object = wire_len(&largest_object(100));
    let item = wire_len(&largest_object(0));
    let list = 1000 * item + 100;
    let default_acl = wire_len(&largest_object(4));
    // Each batch answer: its part headers and the HTTP status line, about 150 bytes.
    let batch = 100 * (default_acl + 150);
    let mb = |n: usize| n as f64 / 1e6;
    eprintln!(
        "object {:.2} MB, list page {:.1} MB, batch {:.1} MB",
        mb(object),
        mb(list),
        mb(batch)
    );
    for (size, limit) in [(object, OBJECT), (list, LIST_PAGE), (batch, BATCH)] {
        assert!(
            size < limit.bytes,
            "{}: {size} > {}",
            limit.what,
            limit.bytes
        );
    }
    // Ours: an object as the test server sends it is about 1 KB.
    assert!(
        100 * wire_len(&largest_object(100)) > BATCH.bytes,
        "the documented exception"
    );
}

#[test]
fn sizes_read_as_people_write_them() {
    assert_eq!(size(4 * MIB), "4 MiB");
    assert_eq!(size(64 * 1024), "64 KiB");
    assert_eq!(size(100), "100 bytes");
}

/// A one-shot HTTP server: answers the first request with `head` and then `body`
/// (`chunks` of it, then nothing more: the connection stays open).
async fn serve(head: String, chunk: Vec<u8>, chunks: usize) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/", listener.local_addr().expect("addr"));
    tokio::spawn(async move {
        let (mut tcp, _) = listener.accept().await.expect("accept");
        let mut request = [0u8; 4096];
        let _ = tcp.read(&mut request).await;
        tcp.write_all(head.as_bytes()).await.expect("head");
        for _ in 0..chunks {
            if tcp.write_all(&chunk).await.is_err() {
                return;
            }
        }
        tokio::time::sleep(std::time::Duration::from_secs(60)).await;
    });
    url
}

async fn get(url: &str) -> reqwest::Response {
    #[cfg(feature = "tls")]
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new().get(url).send().await.expect("reply")
}

#[tokio::test]
async fn a_declared_length_over_the_limit_is_refused_before_reading() {
    let head = "HTTP/1.1 200 OK\r\nContent-Length: 6000000000\r\n\r\n".to_owned();
    let url = serve(head, Vec::new(), 0).await;
    let read = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        read(get(&url).await, OBJECT),
    );
    assert!(matches!(read.await, Ok(Err(Unread::TooLarge(OBJECT)))));
}

#[tokio::test]
async fn a_body_is_read_up_to_its_limit_and_no_further() {
    let limit = Limit {
        what: "test",
        bytes: 1000,
    };
    let fits = "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n".to_owned();
    let url = serve(fits, vec![b'x'; 500], 2).await;
    assert_eq!(
        read(get(&url).await, limit).await.expect("fits").len(),
        1000
    );
    // Chunked, never ending: refused at the chunk that passes the limit.
    let endless = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_owned();
    let url = serve(
        endless,
        b"190\r\n"
            .iter()
            .chain(&[b'x'; 400])
            .chain(b"\r\n")
            .copied()
            .collect(),
        1000,
    )
    .await;
    let read = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        read(get(&url).await, limit),
    );
    assert!(matches!(read.await, Ok(Err(Unread::TooLarge(_)))));
}
