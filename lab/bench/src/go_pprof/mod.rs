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

/// The time [`fetch_body`] allows beyond the profile's own seconds, for the member
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
    /// per stack (a `;` in a name becomes `:`), sorted, with the CPU time rounded to whole microseconds; stacks that round
    /// to zero, and samples without frames, are left out.
    pub(crate) fn folded(&self) -> Vec<String> {
        let mut lines: Vec<String> = self
            .stacks
            .iter()
            .filter(|(frames, _)| !frames.is_empty())
            .filter_map(|(frames, ns)| {
                let us = ns.saturating_add(500) / 1_000;
                // `;` separates frames in the folded format: none may stay in a name.
                let path: Vec<String> = frames.iter().rev().map(|f| f.replace(';', ":")).collect();
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
/// `http://127.0.0.1:2379`) with `client` and returns the body
/// undecoded, so a caller can decode it after the profiled window (decoding is CPU the
/// window should not see). The request waits the profile's seconds plus
/// [`FETCH_SLACK`] (a client-wide timeout would cut it short).
///
/// # Errors
/// When `seconds` is 0 (Go would take 30), the request fails, the answer is not a 2xx
/// (the error names the URL, the status and the start of the body; on 404, how to start
/// the member with `--enable-pprof`), or the body is larger than any profile.
pub(crate) async fn fetch_body(client: &reqwest::Client, base: &str, seconds: u64) -> Res<Vec<u8>> {
    if seconds == 0 {
        return Err("a CPU profile needs at least 1 second".into());
    }
    let url = format!(
        "{}/debug/pprof/profile?seconds={seconds}",
        base.trim_end_matches('/')
    );
    let mut response = client
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
            " (is the member started with --enable-pprof? For the test servers: \
             scripts/servers stop, then ANYLOCK_ETCD_PPROF=1 scripts/servers start)"
        } else {
            ""
        };
        return Err(format!("GET {url}: {status}{hint}: {text:?}").into());
    }
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| format!("GET {url}: reading the body: {e}"))?
    {
        if body.len().saturating_add(chunk.len()) > gzip::MAX_INFLATED {
            return Err(format!(
                "GET {url}: a body over {} bytes is no profile",
                gzip::MAX_INFLATED
            )
            .into());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
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
        if functions
            .insert(f.id, string("a function", f.name)?)
            .is_some()
        {
            return Err(format!("function id {} appears twice", f.id).into());
        }
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
        if locations.insert(l.id, names).is_some() {
            return Err(format!("location id {} appears twice", l.id).into());
        }
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

mod gzip;

mod pb;

#[cfg(test)]
mod tests;
