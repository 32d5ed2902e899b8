//! The messages of pprof's `profile.proto` (github.com/google/pprof/proto/profile.proto)
//! this module reads, field numbers as there; `prost` skips the rest (mappings, labels,
//! comments, drop/keep frames).

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
