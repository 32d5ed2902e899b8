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
mod tests;
