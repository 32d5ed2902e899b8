//! A Go server's CPU profile, fetched from its pprof endpoint and decoded: an etcd member
//! started with `--enable-pprof` answers `GET <client URL>/debug/pprof/profile?seconds=N`
//! after N seconds of sampling (100 Hz) with a gzip-compressed protobuf in pprof's
//! `profile.proto` format.
//!
//! The gzip wrapper (RFC 1952) is read here and its deflate body inflated by
//! `miniz_oxide`; the protobuf is decoded by the few hand-written `prost` messages in
//! [`pb`] (no `.proto` compiler). Each sample becomes a stack of function names, so the
//! server's CPU time per function can be compared between two client workloads.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use prost::Message as _;

use crate::op::Res;

/// The largest profile [`decode`] inflates, in bytes: a CPU profile of a busy Go server
/// over a minute is a few MB; a larger body is not a profile.
const MAX_INFLATED: usize = 256 << 20;

/// The time [`fetch_cpu_profile`] allows beyond the profile's own seconds, for the member
/// to encode the profile and for the body to arrive.
const FETCH_SLACK: Duration = Duration::from_secs(30);

/// A decoded Go CPU profile.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct CpuProfile {
    /// The profile's duration (`duration_nanos`): the sampling window.
    pub(crate) duration: Duration,
    /// Sum of the CPU-time values of every sample (the `cpu`/`nanoseconds` sample type).
    pub(crate) cpu: Duration,
    /// Number of samples (the `samples`/`count` values summed; one per sample record
    /// where the profile has no `samples` type).
    pub(crate) samples: u64,
    /// Every distinct stack as function names, innermost first, with its CPU nanoseconds
    /// (samples whose stacks read the same are added up, in the order first seen). A
    /// location with inlined calls (several lines) gives one name per line, the innermost
    /// (inlined) function first, as pprof shows them.
    pub(crate) stacks: Vec<(Vec<String>, u64)>,
}

impl CpuProfile {
    /// CPU nanoseconds per function: `(self, inclusive)`. Self counts a stack's innermost
    /// frame; inclusive counts every function anywhere in the stack, once per stack even
    /// where it recurses.
    pub(crate) fn by_function(&self) -> (HashMap<String, u64>, HashMap<String, u64>) {
        let mut own: HashMap<String, u64> = HashMap::new();
        let mut inclusive: HashMap<String, u64> = HashMap::new();
        for (frames, ns) in &self.stacks {
            if let Some(innermost) = frames.first() {
                *own.entry(innermost.clone()).or_insert(0) += ns;
            }
            let mut seen: HashSet<&str> = HashSet::new();
            for frame in frames {
                if seen.insert(frame) {
                    *inclusive.entry(frame.clone()).or_insert(0) += ns;
                }
            }
        }
        (own, inclusive)
    }

    /// Folded stacks for inferno or flamegraph.pl: one `outermost;…;innermost <µs>` line
    /// per stack, sorted, with the CPU time rounded to whole microseconds; stacks that round
    /// to zero, and samples without frames, are left out.
    pub(crate) fn folded(&self) -> Vec<String> {
        let mut lines: Vec<String> = self
            .stacks
            .iter()
            .filter(|(frames, _)| !frames.is_empty())
            .filter_map(|(frames, ns)| {
                let us = ns.saturating_add(500) / 1_000;
                let path: Vec<&str> = frames.iter().rev().map(String::as_str).collect();
                (us > 0).then(|| format!("{} {us}", path.join(";")))
            })
            .collect();
        lines.sort();
        lines
    }

    /// Adds `other` into this profile: the profiles of several members over the same
    /// window. CPU time, samples and the stacks' times add up (equal stacks merge); the
    /// duration is the longer of the two, as the windows overlap.
    pub(crate) fn merge(&mut self, other: CpuProfile) {
        self.duration = self.duration.max(other.duration);
        self.cpu = self.cpu.saturating_add(other.cpu);
        self.samples = self.samples.saturating_add(other.samples);
        let mine = std::mem::take(&mut self.stacks);
        self.stacks = aggregate(mine.into_iter().chain(other.stacks));
    }
}

/// Decodes a profile body: gzip (a single member, as Go writes it) or already-raw
/// protobuf.
///
/// # Errors
/// When the gzip wrapper is malformed, truncated or fails its CRC, the protobuf does not
/// decode, the profile has no `cpu` sample type in nanoseconds, or a sample, location or
/// function refers to something the profile does not have (a corrupt profile must not
/// give wrong numbers quietly).
pub(crate) fn decode(body: &[u8]) -> Res<CpuProfile> {
    if body.is_empty() {
        return Err("empty profile body".into());
    }
    let inflated;
    let raw = if body.starts_with(&gzip::MAGIC) {
        inflated = gzip::gunzip(body)?;
        inflated.as_slice()
    } else {
        body
    };
    let profile =
        pb::Profile::decode(raw).map_err(|e| format!("not a pprof profile protobuf: {e}"))?;
    resolve(&profile)
}

/// GETs `{base}/debug/pprof/profile?seconds={seconds}` (`base` like
/// `http://127.0.0.1:2379`) with `client` and decodes the answer. The request waits the
/// profile's seconds plus [`FETCH_SLACK`] (a client-wide timeout would cut it short).
///
/// # Errors
/// When `seconds` is 0 (Go would take 30), the request fails, the answer is not a 2xx
/// (the error names the URL, the status and the start of the body; on 404, that the
/// member needs `--enable-pprof`), or the body does not [`decode`].
pub(crate) async fn fetch_cpu_profile(
    client: &reqwest::Client,
    base: &str,
    seconds: u64,
) -> Res<CpuProfile> {
    if seconds == 0 {
        return Err("a CPU profile needs at least 1 second".into());
    }
    let url = format!(
        "{}/debug/pprof/profile?seconds={seconds}",
        base.trim_end_matches('/')
    );
    let response = client
        .get(&url)
        .timeout(Duration::from_secs(seconds).saturating_add(FETCH_SLACK))
        .send()
        .await
        .map_err(|e| format!("GET {url}: {e}"))?;
    let status = response.status();
    if !status.is_success() {
        // Go's pprof handler explains its refusals in a short text body ("Could not
        // enable CPU profiling: cpu profiling already in use").
        let text = response.text().await.unwrap_or_default();
        let text: String = text.trim().chars().take(200).collect();
        let hint = if status == reqwest::StatusCode::NOT_FOUND {
            " (is the member started with --enable-pprof?)"
        } else {
            ""
        };
        return Err(format!("GET {url}: {status}{hint}: {text:?}").into());
    }
    let body = response
        .bytes()
        .await
        .map_err(|e| format!("GET {url}: reading the body: {e}"))?;
    decode(&body).map_err(|e| format!("GET {url}: {e}").into())
}

/// Resolves a decoded profile's samples to function names and totals.
fn resolve(p: &pb::Profile) -> Res<CpuProfile> {
    let string = |what: &str, i: i64| -> Res<&str> {
        usize::try_from(i)
            .ok()
            .and_then(|i| p.string_table.get(i))
            .map(String::as_str)
            .ok_or_else(|| format!("{what} names string {i}, past the string table").into())
    };
    let mut types = Vec::with_capacity(p.sample_type.len());
    for t in &p.sample_type {
        types.push((
            string("a sample type", t.r#type)?,
            string("a unit", t.unit)?,
        ));
    }
    let cpu = types
        .iter()
        .position(|&(kind, _)| kind == "cpu")
        .ok_or_else(|| format!("not a CPU profile: its sample types are {types:?}"))?;
    if types[cpu].1 != "nanoseconds" {
        return Err(format!(
            "the cpu sample type is in {}, not nanoseconds",
            types[cpu].1
        )
        .into());
    }
    let count = types.iter().position(|&(kind, _)| kind == "samples");

    let mut functions: HashMap<u64, &str> = HashMap::with_capacity(p.function.len());
    for f in &p.function {
        functions.insert(f.id, string("a function", f.name)?);
    }
    // Each location's names, innermost (inlined) line first; an address where the
    // profile has no lines for it (code without symbols).
    let mut locations: HashMap<u64, Vec<String>> = HashMap::with_capacity(p.location.len());
    for l in &p.location {
        let names = if l.line.is_empty() {
            vec![format!("{:#x}", l.address)]
        } else {
            l.line
                .iter()
                .map(|line| {
                    functions
                        .get(&line.function_id)
                        .map(|&name| name.to_owned())
                        .ok_or_else(|| {
                            format!(
                                "location {} names function {}, which the profile does not have",
                                l.id, line.function_id
                            )
                        })
                })
                .collect::<Result<_, _>>()?
        };
        locations.insert(l.id, names);
    }

    let value = |i: usize, s: &pb::Sample, at: usize| -> Res<u64> {
        let v = *s.value.get(at).ok_or_else(|| {
            format!(
                "sample {i} has {} values for {} sample types",
                s.value.len(),
                types.len()
            )
        })?;
        u64::try_from(v).map_err(|_| format!("sample {i} has a negative value {v}").into())
    };
    let mut total: u64 = 0;
    let mut samples: u64 = 0;
    let mut stacks = Vec::with_capacity(p.sample.len());
    for (i, s) in p.sample.iter().enumerate() {
        let ns = value(i, s, cpu)?;
        let n = match count {
            Some(at) => value(i, s, at)?,
            None => 1,
        };
        let mut frames = Vec::with_capacity(s.location_id.len());
        for id in &s.location_id {
            let names = locations.get(id).ok_or_else(|| {
                format!("sample {i} names location {id}, which the profile does not have")
            })?;
            frames.extend(names.iter().cloned());
        }
        total = total.saturating_add(ns);
        samples = samples.saturating_add(n);
        stacks.push((frames, ns));
    }
    let duration = u64::try_from(p.duration_nanos)
        .map_err(|_| format!("negative profile duration {} ns", p.duration_nanos))?;
    Ok(CpuProfile {
        duration: Duration::from_nanos(duration),
        cpu: Duration::from_nanos(total),
        samples,
        stacks: aggregate(stacks),
    })
}

/// One entry per distinct stack, in the order first seen, its times added up.
fn aggregate(stacks: impl IntoIterator<Item = (Vec<String>, u64)>) -> Vec<(Vec<String>, u64)> {
    let mut index: HashMap<Vec<String>, usize> = HashMap::new();
    let mut out: Vec<(Vec<String>, u64)> = Vec::new();
    for (frames, ns) in stacks {
        match index.get(&frames) {
            Some(&i) => out[i].1 = out[i].1.saturating_add(ns),
            None => {
                index.insert(frames.clone(), out.len());
                out.push((frames, ns));
            }
        }
    }
    out
}

/// RFC 1952's wrapper around a deflate stream, read by hand (`miniz_oxide` inflates raw
/// deflate only).
mod gzip {
    use crate::op::Res;

    /// ID1 ID2: what every gzip member starts with.
    pub(super) const MAGIC: [u8; 2] = [0x1f, 0x8b];
    /// CM: the one compression method, deflate.
    const DEFLATE: u8 = 8;
    /// FLG bits: a CRC-16 of the header follows it.
    pub(super) const FHCRC: u8 = 0x02;
    /// FLG bits: a length-prefixed extra field follows MTIME, XFL and OS.
    pub(super) const FEXTRA: u8 = 0x04;
    /// FLG bits: a zero-terminated original file name follows.
    pub(super) const FNAME: u8 = 0x08;
    /// FLG bits: a zero-terminated comment follows.
    pub(super) const FCOMMENT: u8 = 0x10;
    /// FLG bits that must be zero.
    const RESERVED: u8 = 0xe0;
    /// The fixed header: ID1 ID2 CM FLG MTIME(4) XFL OS.
    const HEADER: usize = 10;
    /// The trailer: CRC-32 and ISIZE (the data's length mod 2^32), little-endian.
    const TRAILER: usize = 8;

    /// The data of the one gzip member `body` holds, its CRC-32 and length checked.
    pub(super) fn gunzip(body: &[u8]) -> Res<Vec<u8>> {
        let mut rest = body;
        let header = take(&mut rest, HEADER, "header")?;
        if header[..2] != MAGIC {
            return Err("not gzip".into());
        }
        if header[2] != DEFLATE {
            return Err(format!("gzip compression method {} is not deflate", header[2]).into());
        }
        let flags = header[3];
        if flags & RESERVED != 0 {
            return Err(format!("gzip header has reserved flags set ({flags:#04x})").into());
        }
        if flags & FEXTRA != 0 {
            let len = take(&mut rest, 2, "extra field length")?;
            let len = usize::from(u16::from_le_bytes([len[0], len[1]]));
            take(&mut rest, len, "extra field")?;
        }
        for (flag, what) in [(FNAME, "file name"), (FCOMMENT, "comment")] {
            if flags & flag != 0 {
                let end = rest
                    .iter()
                    .position(|&b| b == 0)
                    .ok_or_else(|| format!("gzip {what} runs past the end"))?;
                rest = &rest[end + 1..];
            }
        }
        if flags & FHCRC != 0 {
            let covered = body.len() - rest.len();
            let stored = take(&mut rest, 2, "header CRC")?;
            let stored = u16::from_le_bytes([stored[0], stored[1]]);
            let [lo, hi, _, _] = crc32(&body[..covered]).to_le_bytes();
            if stored != u16::from_le_bytes([lo, hi]) {
                return Err("gzip header CRC mismatch".into());
            }
        }
        let Some(split) = rest.len().checked_sub(TRAILER) else {
            return Err("gzip body truncated (no trailer)".into());
        };
        let (deflated, trailer) = rest.split_at(split);
        let data =
            miniz_oxide::inflate::decompress_to_vec_with_limit(deflated, super::MAX_INFLATED)
                .map_err(|e| format!("gzip body: {e}"))?;
        let crc = u32::from_le_bytes([trailer[0], trailer[1], trailer[2], trailer[3]]);
        let size = u32::from_le_bytes([trailer[4], trailer[5], trailer[6], trailer[7]]);
        if crc32(&data) != crc {
            return Err("gzip CRC-32 mismatch (a corrupt or truncated body)".into());
        }
        // ISIZE is the length modulo 2^32.
        if (data.len() as u64) & u64::from(u32::MAX) != u64::from(size) {
            return Err(format!("gzip length mismatch: {} bytes, ISIZE {size}", data.len()).into());
        }
        Ok(data)
    }

    /// The next `n` bytes of `rest`, which moves past them.
    fn take<'a>(rest: &mut &'a [u8], n: usize, what: &str) -> Res<&'a [u8]> {
        if rest.len() < n {
            return Err(format!("gzip {what} truncated").into());
        }
        let (head, tail) = rest.split_at(n);
        *rest = tail;
        Ok(head)
    }

    /// CRC-32 (IEEE 802.3, reflected, as gzip uses it), a byte at a time from [`TABLE`].
    pub(super) fn crc32(data: &[u8]) -> u32 {
        !data.iter().fold(!0u32, |crc, &b| {
            TABLE[usize::from((crc as u8) ^ b)] ^ (crc >> 8)
        })
    }

    /// The CRC-32 of each byte value: the remainder of the reflected polynomial
    /// `0xEDB88320` after eight shifts.
    const TABLE: [u32; 256] = {
        let mut table = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u32;
            let mut bit = 0;
            while bit < 8 {
                c = if c & 1 == 1 {
                    0xedb8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
                bit += 1;
            }
            table[i] = c;
            i += 1;
        }
        table
    };
}

/// The messages of pprof's `profile.proto` (github.com/google/pprof/proto/profile.proto)
/// this module reads, field numbers as there; `prost` skips the rest (mappings, labels,
/// comments, drop/keep frames).
mod pb {
    /// A profile: its sample types, samples, and the tables they index.
    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct Profile {
        /// What each of a sample's values measures, in order.
        #[prost(message, repeated, tag = "1")]
        pub(super) sample_type: Vec<ValueType>,
        /// The samples: a stack and its values.
        #[prost(message, repeated, tag = "2")]
        pub(super) sample: Vec<Sample>,
        /// The program counters the stacks name, by id.
        #[prost(message, repeated, tag = "4")]
        pub(super) location: Vec<Location>,
        /// The functions the locations' lines name, by id.
        #[prost(message, repeated, tag = "5")]
        pub(super) function: Vec<Function>,
        /// Every string the profile holds, indexed by the other messages; entry 0 is "".
        #[prost(string, repeated, tag = "6")]
        pub(super) string_table: Vec<String>,
        /// When the profile was taken, nanoseconds since the Unix epoch.
        #[prost(int64, tag = "9")]
        pub(super) time_nanos: i64,
        /// How long the sampling lasted.
        #[prost(int64, tag = "10")]
        pub(super) duration_nanos: i64,
        /// What the sampling period counts (`cpu`/`nanoseconds` for Go).
        #[prost(message, optional, tag = "11")]
        pub(super) period_type: Option<ValueType>,
        /// The sampling period (10,000,000 ns at Go's 100 Hz).
        #[prost(int64, tag = "12")]
        pub(super) period: i64,
    }

    /// A kind of value and its unit, both as string-table indices.
    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct ValueType {
        /// `cpu`, `samples`, …
        #[prost(int64, tag = "1")]
        pub(super) r#type: i64,
        /// `nanoseconds`, `count`, …
        #[prost(int64, tag = "2")]
        pub(super) unit: i64,
    }

    /// One stack and its values, one per sample type.
    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct Sample {
        /// Location ids, the leaf (innermost) first.
        #[prost(uint64, repeated, tag = "1")]
        pub(super) location_id: Vec<u64>,
        /// The values, in the order of the profile's sample types.
        #[prost(int64, repeated, tag = "2")]
        pub(super) value: Vec<i64>,
    }

    /// A program counter and the source lines it stands for.
    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct Location {
        /// The id samples name it by (nonzero).
        #[prost(uint64, tag = "1")]
        pub(super) id: u64,
        /// The instruction address.
        #[prost(uint64, tag = "3")]
        pub(super) address: u64,
        /// The lines, the innermost inlined call first and the function it was inlined
        /// into last.
        #[prost(message, repeated, tag = "4")]
        pub(super) line: Vec<Line>,
    }

    /// One source line of a location.
    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct Line {
        /// The function's id in the function table.
        #[prost(uint64, tag = "1")]
        pub(super) function_id: u64,
        /// The line number.
        #[prost(int64, tag = "2")]
        pub(super) line: i64,
    }

    /// A function, its strings as string-table indices.
    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct Function {
        /// The id lines name it by (nonzero).
        #[prost(uint64, tag = "1")]
        pub(super) id: u64,
        /// The readable name (`go.etcd.io/etcd/…/mvcc.(*store).Range` for Go).
        #[prost(int64, tag = "2")]
        pub(super) name: i64,
        /// The source file.
        #[prost(int64, tag = "4")]
        pub(super) filename: i64,
    }
}

#[cfg(test)]
mod tests {
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

    /// A `reqwest::Client` (a GCS backend installs the rustls provider it needs first).
    async fn client() -> reqwest::Client {
        drop(
            backend_gcs::GcsBackend::from_url("gs://provider-warmup")
                .await
                .expect("backend"),
        );
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
}
