//! Hiding passwords and secret parameters in any backend URL, for messages and logs.

/// Replaces the password of every `user:password@host` (also in comma-separated host
/// lists) and the value of secret-looking query parameters with `***`.
///
/// Passwords are hidden even when written without percent-encoding: a raw `/`, `?` or `#`
/// in a password would end the authority before its `@` (`redis://:pa/ss@h`), so the
/// user info is taken to run to the URL's last `@`. When in doubt, this hides too much
/// rather than too little.
pub fn redact(url: &str) -> String {
    let url = redact_params(url);
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, url.as_str()),
    };
    let after_last_at = rest.rfind('@').map_or(0, |at| at + 1);
    let end = rest[after_last_at..]
        .find(['/', '?', '#'])
        .map_or(rest.len(), |i| after_last_at + i);
    let (authority, tail) = rest.split_at(end);
    let mut out = String::new();
    if let Some(scheme) = scheme {
        out.push_str(scheme);
        out.push_str("://");
    }
    out.push_str(&redact_authority(authority));
    out.push_str(tail);
    out
}

/// Redacts each `user:password@host` of a host list. An entry without `@` before a later
/// one with `@` is taken as part of that one's password (a raw `,` in a password), and so
/// is everything up to the last `@` when only some entries name a password.
fn redact_authority(authority: &str) -> String {
    let entries: Vec<&str> = authority.split(',').collect();
    let Some(last_at) = entries.iter().rposition(|e| e.contains('@')) else {
        return authority.to_owned();
    };
    let with_at = entries[..=last_at].iter().filter(|e| e.contains('@'));
    let with_password = with_at.clone().filter(|e| has_password(e)).count();
    let mixed = with_password > 0 && with_password < with_at.count();
    let mut groups = Vec::new();
    let mut pending: Vec<&str> = Vec::new();
    for entry in &entries[..=last_at] {
        pending.push(entry);
        if entry.contains('@') && !mixed {
            groups.push(redact_userinfo(&pending.join(",")));
            pending.clear();
        }
    }
    if !pending.is_empty() {
        groups.push(redact_userinfo(&pending.join(",")));
    }
    groups.extend(entries[last_at + 1..].iter().map(|e| (*e).to_owned()));
    groups.join(",")
}

fn has_password(entry: &str) -> bool {
    entry
        .rsplit_once('@')
        .is_some_and(|(userinfo, _)| userinfo.contains(':'))
}

fn redact_userinfo(host: &str) -> String {
    match host.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{user}:***@{host}"),
            None => format!("{userinfo}@{host}"),
        },
        None => host.to_owned(),
    }
}

/// Replaces the value of every secret-looking `key=value` that follows a `?` or `&`,
/// wherever it is (a raw `?` in a password can make the real query look like a path).
fn redact_params(url: &str) -> String {
    let mut out = String::with_capacity(url.len());
    let mut done = 0;
    let mut search = 0;
    while let Some(found) = url[search..].find(['?', '&']) {
        let start = search + found + 1;
        search = start;
        let param = &url[start..];
        let Some(eq) = param.find('=') else { continue };
        if !super::is_secret_param(&param[..eq]) {
            continue;
        }
        out.push_str(&url[done..=start + eq]);
        out.push_str("***");
        done = param.find('&').map_or(url.len(), |amp| start + amp);
        search = done;
    }
    out.push_str(&url[done..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hides_misspelled_and_percent_encoded_secret_names() {
        for (url, shown) in [
            (
                "postgres://h/db?pasword=S3CRET",
                "postgres://h/db?pasword=***",
            ),
            (
                "postgres://h/db?pwd=S3CRET&x=1",
                "postgres://h/db?pwd=***&x=1",
            ),
            (
                "postgres://h/db?pass%77ord=S3CRET",
                "postgres://h/db?pass%77ord=***",
            ),
            (
                "postgres://h/db?PassWord=S3CRET",
                "postgres://h/db?PassWord=***",
            ),
            ("gs://b/?access_token=S3CRET", "gs://b/?access_token=***"),
            (
                "postgres://h/db?sslmode=require%",
                "postgres://h/db?sslmode=require%",
            ),
        ] {
            assert_eq!(redact(url), shown, "{url}");
        }
    }

    #[test]
    fn hides_passwords_in_every_host_and_secret_params() {
        let cases = [
            (
                "redis://:hunter2@127.0.0.1:6379/0",
                "redis://:***@127.0.0.1:6379/0",
            ),
            (
                "postgres://app:s3cr3t@db:5432/locks?sslmode=require",
                "postgres://app:***@db:5432/locks?sslmode=require",
            ),
            (
                "etcd://u:pw1@h1:2379,u:pw2@h2:2379/pfx",
                "etcd://u:***@h1:2379,u:***@h2:2379/pfx",
            ),
            (
                "postgres://db/x?password=p&application_name=a",
                "postgres://db/x?password=***&application_name=a",
            ),
            ("redis://user@host", "redis://user@host"),
            ("local:/tmp/x.db", "local:/tmp/x.db"),
            ("gs://bucket/prefix", "gs://bucket/prefix"),
        ];
        for (input, expected) in cases {
            assert_eq!(redact(input), expected, "{input}");
        }
    }
}
