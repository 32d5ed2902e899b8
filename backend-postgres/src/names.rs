//! The names the backend gives PostgreSQL objects and sessions: identifier limits, quoting,
//! and the quoted schema, table and sequence names one backend uses.

/// The `application_name` sent when the URL sets none.
pub const DEFAULT_APPLICATION_NAME: &str = "anylock";
/// The longest identifier PostgreSQL keeps (`NAMEDATALEN - 1`), in bytes.
pub const MAX_IDENTIFIER_LEN: usize = 63;
/// The longest table name accepted: the fence sequence is named `<table>_fence`, which must
/// still fit in [`MAX_IDENTIFIER_LEN`].
pub const MAX_TABLE_LEN: usize = MAX_IDENTIFIER_LEN - FENCE_SUFFIX.len();

/// The suffix of the fence-token sequence's name.
pub(crate) const FENCE_SUFFIX: &str = "_fence";
/// The suffix of the semaphore permits table's name (`<table>_sem`).
pub(crate) const PERMITS_SUFFIX: &str = "_sem";
/// The suffix of the permits' own fence-token sequence (`<table>_semf`).
pub(crate) const PERMIT_FENCE_SUFFIX: &str = "_semf";

// Every object is named `<table><suffix>`: no suffix may be longer than the one
// [`MAX_TABLE_LEN`] leaves room for.
const _: () = assert!(
    PERMITS_SUFFIX.len() <= FENCE_SUFFIX.len() && PERMIT_FENCE_SUFFIX.len() <= FENCE_SUFFIX.len()
);

/// Quotes an identifier for SQL: `"` + the name with every `"` doubled + `"`.
///
/// Only for names that passed the config's checks (no NUL).
pub(crate) fn quote_identifier(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Cuts `name` to at most [`MAX_IDENTIFIER_LEN`] bytes on a character boundary.
pub(crate) fn truncate(name: &str) -> String {
    let mut end = name.len().min(MAX_IDENTIFIER_LEN);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    name[..end].to_owned()
}

/// The quoted names of the objects one backend uses.
#[derive(Debug, Clone)]
pub(crate) struct Names {
    /// `"schema"`
    pub(crate) schema: String,
    /// `"schema"."table"`
    pub(crate) table: String,
    /// `"schema"."table_fence"`
    pub(crate) sequence: String,
    /// `"schema"."table_sem"`: one row per live permit of a semaphore.
    pub(crate) permits: String,
    /// `"schema"."table_semf"`: the permits' fence tokens.
    pub(crate) permit_sequence: String,
    /// `table_sem` and `table_semf` unquoted, as PostgreSQL names them in messages.
    pub(crate) permit_objects: [String; 2],
}

impl Names {
    /// The quoted names for the (unquoted) `schema` and `table`.
    pub(crate) fn new(schema: &str, table: &str) -> Self {
        let schema = quote_identifier(schema);
        let table_name = table;
        let table = format!("{schema}.{}", quote_identifier(table_name));
        let qualified = |suffix: &str| {
            let name = format!("{table_name}{suffix}");
            (format!("{schema}.{}", quote_identifier(&name)), name)
        };
        let (sequence, _) = qualified(FENCE_SUFFIX);
        let (permits, permits_name) = qualified(PERMITS_SUFFIX);
        let (permit_sequence, permit_sequence_name) = qualified(PERMIT_FENCE_SUFFIX);
        Self {
            schema,
            table,
            sequence,
            permits,
            permit_sequence,
            permit_objects: [permits_name, permit_sequence_name],
        }
    }
}
