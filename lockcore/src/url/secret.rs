//! Which URL query parameters hold secrets: the one rule every backend and the facade
//! redact by.

/// Parameter names whose values are always hidden.
const SECRET_NAMES: &[&str] = &["password", "pass", "token", "secret", "key", "sslpassword"];

/// Fragments that make any name secret, so a misspelled `pasword=` or `pwd=` (refused as
/// unknown, but shown in the meantime) is hidden too.
const SECRET_FRAGMENTS: &[&str] = &[
    "pass", "pasw", "pwd", "secret", "token", "auth_key", "apikey", "api_key",
];

/// Whether the value of the query parameter named `raw` must be hidden. The name is
/// percent-decoded and lowercased first (`pass%77ord` is `password` to a driver). When in
/// doubt this hides too much: `key=` (a client key's path) is hidden as well.
///
/// ```
/// assert!(lockcore::is_secret_param("PassWord"));
/// assert!(lockcore::is_secret_param("pass%77ord"));
/// assert!(lockcore::is_secret_param("pwd"));
/// assert!(!lockcore::is_secret_param("sslmode"));
/// ```
pub fn is_secret_param(raw: &str) -> bool {
    let name = percent_decode(raw).to_ascii_lowercase();
    SECRET_NAMES.contains(&name.as_str()) || SECRET_FRAGMENTS.iter().any(|part| name.contains(part))
}

/// `%XX` decoded and `+` as a space, as form decoding does; invalid escapes kept.
fn percent_decode(raw: &str) -> String {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push((h * 16 + l) as u8);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
