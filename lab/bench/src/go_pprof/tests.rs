//! Tests of the Go profile decoder: built profiles, gzip wrappers, bad input, and a
//! live member (ignored unless `GO_PPROF_URL` names one).

use super::*;

/// 10 ms: one sample at Go's 100 Hz.
const TICK: i64 = 10_000_000;

/// Wraps `data` in a gzip member with the given FLG bits (and a name, comment, extra
/// field and header CRC for them).
fn gzip_with(data: &[u8], flags: u8) -> Vec<u8> {
    let mut out = vec![0x1f, 0x8b, 8, flags, 0x78, 0x56, 0x34, 0x12, 0, 255];
    if flags & gzip::FEXTRA != 0 {
        out.extend([6, 0, b'A', b'P', 2, 0, 7, 7]);
    }
    if flags & gzip::FNAME != 0 {
        out.extend(b"profile.pb\0");
    }
    if flags & gzip::FCOMMENT != 0 {
        out.extend(b"cpu profile\0");
    }
    if flags & gzip::FHCRC != 0 {
        let crc = gzip::crc32(&out).to_le_bytes();
        out.extend(&crc[..2]);
    }
    out.extend(miniz_oxide::deflate::compress_to_vec(data, 6));
    out.extend(gzip::crc32(data).to_le_bytes());
    out.extend(u32::try_from(data.len()).expect("small").to_le_bytes());
    out
}

/// A plain gzip member, as Go writes it.
fn gzip(data: &[u8]) -> Vec<u8> {
    gzip_with(data, 0)
}

/// A Go-shaped CPU profile: `samples`/`count` then `cpu`/`nanoseconds`.
///
/// Functions: 1 main, 2 work, 3 helper (inlined into work), 4 rec, 5 mallocgc.
/// Locations: 1 main; 2 helper inlined into work; 3 rec; 4 mallocgc; 5 work (another
/// PC of the same function).
fn profile() -> pb::Profile {
    let strings = [
        "",
        "samples",
        "count",
        "cpu",
        "nanoseconds",
        "main.main",
        "main.work",
        "main.helper",
        "main.rec",
        "runtime.mallocgc",
        "main.go",
    ];
    let function = |id: u64, name: i64| pb::Function {
        id,
        name,
        filename: 10,
    };
    let line = |function_id: u64| pb::Line {
        function_id,
        line: 7,
    };
    let location = |id: u64, functions: &[u64]| pb::Location {
        id,
        address: 0x40_0000 + id,
        line: functions.iter().map(|&f| line(f)).collect(),
    };
    let sample = |locations: &[u64], count: i64, ns: i64| pb::Sample {
        location_id: locations.to_vec(),
        value: vec![count, ns],
    };
    let value_type = |r#type: i64, unit: i64| pb::ValueType { r#type, unit };
    pb::Profile {
        sample_type: vec![value_type(1, 2), value_type(3, 4)],
        sample: vec![
            sample(&[2, 1], 3, 3 * TICK),
            sample(&[4, 3, 3, 1], 2, 2 * TICK),
            sample(&[5, 1], 1, TICK + 1_500),
            sample(&[3, 3, 1], 1, TICK),
            // The first stack again (Go splits samples by label): it adds up.
            sample(&[2, 1], 1, TICK),
            sample(&[1], 1, 499),
        ],
        location: vec![
            location(1, &[1]),
            location(2, &[3, 2]),
            location(3, &[4]),
            location(4, &[5]),
            location(5, &[2]),
        ],
        function: vec![
            function(1, 5),
            function(2, 6),
            function(3, 7),
            function(4, 8),
            function(5, 9),
        ],
        string_table: strings.iter().map(|s| (*s).to_owned()).collect(),
        time_nanos: 1_700_000_000_000_000_000,
        duration_nanos: 5_000_000_000,
        period_type: Some(value_type(3, 4)),
        period: TICK,
    }
}

fn names(frames: &[&str]) -> Vec<String> {
    frames.iter().map(|f| (*f).to_owned()).collect()
}

fn map(pairs: &[(&str, u64)]) -> HashMap<String, u64> {
    pairs.iter().map(|&(k, v)| (k.to_owned(), v)).collect()
}

const T: u64 = 10_000_000;

#[test]
fn decodes_a_gzipped_profile_with_inlined_frames() {
    let decoded = decode(&gzip(&profile().encode_to_vec())).expect("decodes");
    assert_eq!(decoded.duration, Duration::from_secs(5));
    assert_eq!(decoded.cpu, Duration::from_nanos(8 * T + 1_999));
    assert_eq!(decoded.samples, 9);
    assert_eq!(
        decoded.stacks,
        vec![
            (names(&["main.helper", "main.work", "main.main"]), 4 * T),
            (
                names(&["runtime.mallocgc", "main.rec", "main.rec", "main.main"]),
                2 * T
            ),
            (names(&["main.work", "main.main"]), T + 1_500),
            (names(&["main.rec", "main.rec", "main.main"]), T),
            (names(&["main.main"]), 499),
        ]
    );
    // The same protobuf, not gzipped, and gzipped with every optional header field.
    let raw = profile().encode_to_vec();
    assert_eq!(decode(&raw).expect("raw"), decoded);
    let all = gzip::FEXTRA | gzip::FNAME | gzip::FCOMMENT | gzip::FHCRC;
    assert_eq!(decode(&gzip_with(&raw, all)).expect("flags"), decoded);
}

#[test]
fn self_and_inclusive_time_count_recursion_once() {
    let decoded = decode(&gzip(&profile().encode_to_vec())).expect("decodes");
    let (own, inclusive) = decoded.by_function();
    assert_eq!(
        own,
        map(&[
            ("main.helper", 4 * T),
            ("runtime.mallocgc", 2 * T),
            ("main.work", T + 1_500),
            ("main.rec", T),
            ("main.main", 499),
        ])
    );
    assert_eq!(
        inclusive,
        map(&[
            ("main.main", 8 * T + 1_999),
            ("main.work", 5 * T + 1_500),
            ("main.helper", 4 * T),
            ("main.rec", 3 * T),
            ("runtime.mallocgc", 2 * T),
        ])
    );
}

#[test]
fn folded_lines_run_outermost_first_in_rounded_microseconds() {
    let decoded = decode(&gzip(&profile().encode_to_vec())).expect("decodes");
    // 10,001.5 µs rounds up; 0.499 µs rounds to nothing and goes.
    assert_eq!(
        decoded.folded(),
        [
            "main.main;main.rec;main.rec 10000",
            "main.main;main.rec;main.rec;runtime.mallocgc 20000",
            "main.main;main.work 10002",
            "main.main;main.work;main.helper 40000",
        ]
    );
}

#[test]
fn merging_adds_times_and_joins_equal_stacks() {
    let mut merged = decode(&profile().encode_to_vec()).expect("decodes");
    let other = CpuProfile {
        duration: Duration::from_secs(6),
        cpu: Duration::from_nanos(3 * T),
        samples: 3,
        stacks: vec![
            (names(&["main.work", "main.main"]), 2 * T),
            (names(&["runtime.futex"]), T),
        ],
    };
    merged.merge(other);
    assert_eq!(merged.duration, Duration::from_secs(6));
    assert_eq!(merged.cpu, Duration::from_nanos(11 * T + 1_999));
    assert_eq!(merged.samples, 12);
    assert_eq!(merged.stacks.len(), 6);
    assert_eq!(
        merged.stacks[2],
        (names(&["main.work", "main.main"]), 3 * T + 1_500)
    );
    assert_eq!(merged.stacks[5], (names(&["runtime.futex"]), T));
    let (own, inclusive) = merged.by_function();
    assert_eq!(own["runtime.futex"], T);
    assert_eq!(inclusive["main.main"], 10 * T + 1_999);
}

#[test]
fn crc32_matches_the_check_value() {
    assert_eq!(gzip::crc32(b"123456789"), 0xcbf4_3926);
    assert_eq!(gzip::crc32(b""), 0);
}

#[test]
fn garbage_and_truncated_bodies_are_errors() {
    assert!(decode(b"").is_err());
    assert!(decode(b"404 page not found\n").is_err());
    assert!(decode(&[0x1f, 0x8b]).is_err());
    // Bytes from a xorshift generator: an error every time, never a panic.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for len in [1, 7, 64, 1_000] {
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x.to_le_bytes()[0]
            })
            .collect();
        assert!(decode(&bytes).is_err(), "{len} random bytes");
        let mut gz = gzip::MAGIC.to_vec();
        gz.extend(&bytes);
        assert!(decode(&gz).is_err(), "gzip magic and {len} random bytes");
    }
    let raw = profile().encode_to_vec();
    let gz = gzip_with(&raw, gzip::FNAME | gzip::FHCRC);
    for cut in 0..gz.len() {
        assert!(decode(&gz[..cut]).is_err(), "cut at {cut} of {}", gz.len());
    }
    for at in [3, 12, gz.len() / 2, gz.len() - 5] {
        let mut flipped = gz.clone();
        flipped[at] ^= 0x10;
        assert!(decode(&flipped).is_err(), "bit flipped at {at}");
    }
    let mut other_method = gzip(&raw);
    other_method[2] = 7;
    let error = decode(&other_method).expect_err("not deflate").to_string();
    assert!(error.contains("not deflate"), "{error}");
}

#[test]
fn dangling_references_are_errors() {
    let check = |change: &dyn Fn(&mut pb::Profile), expected: &str| {
        let mut p = profile();
        change(&mut p);
        let error = decode(&gzip(&p.encode_to_vec()))
            .expect_err(expected)
            .to_string();
        assert!(error.contains(expected), "{error} lacks {expected:?}");
    };
    check(
        &|p| p.sample[1].location_id.push(42),
        "sample 1 names location 42",
    );
    check(
        &|p| p.location[1].line[0].function_id = 9,
        "location 2 names function 9",
    );
    check(&|p| p.function[0].name = 99, "string 99");
    check(&|p| p.sample_type[0].r#type = -1, "string -1");
    check(&|p| p.sample[2].value.truncate(1), "sample 2 has 1 values");
    check(&|p| p.sample[0].value[1] = -5, "negative value -5");
    check(&|p| p.duration_nanos = -1, "negative profile duration");
    check(&|p| p.sample_type.truncate(1), "not a CPU profile");
    check(&|p| p.sample_type[1].unit = 2, "in count, not nanoseconds");
    // An id given twice would let the later entry replace the earlier quietly.
    check(
        &|p| p.function.push(p.function[0].clone()),
        &format!("function id {} appears twice", profile().function[0].id),
    );
    check(
        &|p| p.location.push(p.location[0].clone()),
        &format!("location id {} appears twice", profile().location[0].id),
    );
}

#[test]
fn a_semicolon_in_a_name_cannot_split_a_folded_frame() {
    let odd = CpuProfile {
        stacks: vec![(names(&["pkg.f;g", "main.main"]), 2_000)],
        ..CpuProfile::default()
    };
    assert_eq!(odd.folded(), ["main.main;pkg.f:g 2"]);
}

#[test]
fn without_a_samples_type_each_sample_counts_once() {
    let mut p = profile();
    p.sample_type.remove(0);
    for s in &mut p.sample {
        s.value.remove(0);
    }
    let decoded = decode(&p.encode_to_vec()).expect("decodes");
    assert_eq!(decoded.samples, 6);
    assert_eq!(decoded.cpu, Duration::from_nanos(8 * T + 1_999));
}

/// A `reqwest::Client`, with the rustls provider it needs installed first.
async fn client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}

/// Serves one HTTP request on loopback with `status` and `body`; the base URL and the
/// request line it got.
async fn serve_once(
    status: &'static str,
    body: Vec<u8>,
) -> (String, tokio::task::JoinHandle<String>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let served = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.expect("accept");
        let mut request = Vec::new();
        let mut buf = [0u8; 1024];
        while !request.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = socket.read(&mut buf).await.expect("read");
            assert!(n > 0, "the request ended early");
            request.extend(&buf[..n]);
        }
        let head = format!(
            "HTTP/1.1 {status}\r\nContent-Type: application/octet-stream\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        socket.write_all(head.as_bytes()).await.expect("head");
        socket.write_all(&body).await.expect("body");
        let request = String::from_utf8_lossy(&request).into_owned();
        request.lines().next().unwrap_or_default().to_owned()
    });
    (base, served)
}

#[tokio::test]
async fn fetches_and_decodes_a_profile() {
    let body = gzip(&profile().encode_to_vec());
    let (base, served) = serve_once("200 OK", body).await;
    let fetched = fetch_cpu_profile(&client().await, &format!("{base}/"), 2)
        .await
        .expect("fetches");
    assert_eq!(
        served.await.expect("server"),
        "GET /debug/pprof/profile?seconds=2 HTTP/1.1"
    );
    assert_eq!(fetched.samples, 9);
}

#[tokio::test]
async fn a_404_says_to_enable_pprof() {
    let (base, served) = serve_once("404 Not Found", b"404 page not found\n".to_vec()).await;
    let error = fetch_cpu_profile(&client().await, &base, 1)
        .await
        .expect_err("404")
        .to_string();
    served.await.expect("server");
    assert!(error.contains(&format!("{base}/debug/pprof/profile?seconds=1")));
    assert!(error.contains("404 Not Found"), "{error}");
    assert!(error.contains("--enable-pprof"), "{error}");
    assert!(error.contains("404 page not found"), "{error}");
    let error = fetch_cpu_profile(&client().await, &base, 0)
        .await
        .expect_err("0 s");
    assert!(error.to_string().contains("at least 1 second"), "{error}");
}

/// The `n` largest entries of `counts`, largest first.
fn top(counts: &HashMap<String, u64>, n: usize) -> Vec<(&str, u64)> {
    let mut sorted: Vec<(&str, u64)> = counts.iter().map(|(k, &v)| (k.as_str(), v)).collect();
    sorted.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
    sorted.truncate(n);
    sorted
}

/// A live Go server's profile: `GO_PPROF_URL` (its base URL, pprof enabled),
/// `GO_PPROF_SECONDS` (5 unless set) and, to compare the profile's CPU time with the
/// kernel's, `GO_PPROF_PID` (its process id). Prints totals and the top functions.
#[tokio::test]
#[ignore = "needs a live Go server: GO_PPROF_URL (and GO_PPROF_PID)"]
async fn live_server_profile() {
    let base = std::env::var("GO_PPROF_URL").expect("set GO_PPROF_URL to a pprof base URL");
    let seconds: u64 = std::env::var("GO_PPROF_SECONDS")
        .map_or(Ok(5), |s| s.parse())
        .expect("GO_PPROF_SECONDS is a number");
    let pid = std::env::var("GO_PPROF_PID").ok();
    let ticks = || {
        let pid = pid.as_deref()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        crate::procstat::thread_ticks(&stat).map(|(_, t)| t)
    };
    let client = client().await;
    let before = ticks();
    let started = std::time::Instant::now();
    let profile = fetch_cpu_profile(&client, &base, seconds)
        .await
        .expect("profile");
    let wall = started.elapsed();
    let after = ticks();
    println!(
        "profile: duration {:?}, cpu {:?} ({:.0} % of a core), {} samples, {} distinct \
         stacks; request took {wall:?}",
        profile.duration,
        profile.cpu,
        100.0 * profile.cpu.as_secs_f64() / profile.duration.as_secs_f64().max(1e-9),
        profile.samples,
        profile.stacks.len(),
    );
    if let (Some(before), Some(after)) = (before, after) {
        let proc_cpu = Duration::from_millis(10 * after.saturating_sub(before));
        println!(
            "/proc utime+stime over the request: {proc_cpu:?}; profile / proc = {:.3}",
            profile.cpu.as_secs_f64() / proc_cpu.as_secs_f64().max(1e-9)
        );
    }
    print_top(&profile);
    assert!(profile.cpu > Duration::ZERO, "no CPU in the profile");
}

/// A profile saved to `GO_PPROF_FILE` (say by `curl -o`): prints its totals and top
/// functions, to check the decoding against another reader of the same bytes.
#[test]
#[ignore = "needs a saved profile: GO_PPROF_FILE"]
fn saved_profile_file() {
    let path = std::env::var("GO_PPROF_FILE").expect("set GO_PPROF_FILE to a profile");
    let profile = decode(&std::fs::read(&path).expect("readable")).expect("decodes");
    println!(
        "{path}: duration {:?}, cpu {:?}, {} samples, {} distinct stacks",
        profile.duration,
        profile.cpu,
        profile.samples,
        profile.stacks.len()
    );
    print_top(&profile);
}

/// Prints the 15 functions with the most self and inclusive CPU time, and the number
/// of folded lines.
fn print_top(profile: &CpuProfile) {
    let (own, inclusive) = profile.by_function();
    let cpu = profile.cpu.as_secs_f64().max(1e-9);
    for (what, counts) in [("self", &own), ("inclusive", &inclusive)] {
        println!("\ntop 15 by {what}:");
        for (name, ns) in top(counts, 15) {
            let share = 100.0 * ns as f64 / 1e9 / cpu;
            println!("{:9.1} ms {share:5.1} %  {name}", ns as f64 / 1e6);
        }
    }
    let folded = profile.folded();
    println!(
        "\n{} folded lines; first: {:?}",
        folded.len(),
        folded.first()
    );
}

/// [`fetch_body`], then [`decode`].
async fn fetch_cpu_profile(client: &reqwest::Client, base: &str, seconds: u64) -> Res<CpuProfile> {
    decode(&fetch_body(client, base, seconds).await?)
}
