//! [`parse_duration`]: durations as people write them, the one parser for TTLs, waits and
//! graces.

use std::time::Duration;

use crate::invalid::Invalid;

/// Reads a duration as people write them: humantime (`500ms`, `30s`, `5m`, `1h 30m`) or
/// bare seconds (`90`, `2.5`), as flock's `-w` and `timeout(1)` take them. The one parser
/// for TTLs, waits and graces in the CLI, its environment variables and config files.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(lockcore::parse_duration("1m30s")?, Duration::from_secs(90));
/// assert_eq!(lockcore::parse_duration("2.5")?, Duration::from_millis(2500));
/// assert!(lockcore::parse_duration("soon").is_err());
/// # Ok::<(), lockcore::Error>(())
/// ```
///
/// # Errors
/// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) with the text and why.
pub fn parse_duration(text: &str) -> Result<Duration, Invalid> {
    let text = text.trim();
    if !text.is_empty() && text.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return text
            .parse::<f64>()
            .ok()
            .and_then(|secs| Duration::try_from_secs_f64(secs).ok())
            .ok_or_else(|| Invalid::new(format!("{text:?} is not a number of seconds")));
    }
    humantime::parse_duration(text)
        .map_err(|e| Invalid::new(format!("{text:?} is not a duration: {e}")))
}
