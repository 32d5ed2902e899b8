//! Notes stored with a lease ([`Note`]) and the entries of a listing ([`HeldLock`]).

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use crate::invalid::Invalid;
use crate::name::LockName;

/// The longest note accepted, in bytes of UTF-8.
pub const MAX_NOTE_LEN: usize = 512;

/// Whether `ch` must not reach a terminal as it is: a control character (C0, DEL, C1), or
/// an invisible or direction-changing format character (bidi embeddings, overrides and
/// isolates, zero-width characters, the BOM) that can make text read as something else.
pub fn is_unsafe_to_show(ch: char) -> bool {
    ch.is_control()
        || matches!(
            ch,
            '\u{061c}' | '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2060}'..='\u{2069}' | '\u{feff}'
        )
}

/// `text` with every character [unsafe to show](is_unsafe_to_show) replaced by U+FFFD, for
/// printing what a server returned (owners, names, notes written by anyone). Borrows when
/// there is nothing to replace.
///
/// ```
/// assert_eq!(lockcore::display_safe("host/1\x1b]0;pwned\x07"), "host/1\u{fffd}]0;pwned\u{fffd}");
/// assert_eq!(lockcore::display_safe("a\u{202e}b"), "a\u{fffd}b");
/// ```
pub fn display_safe(text: &str) -> Cow<'_, str> {
    if !text.chars().any(is_unsafe_to_show) {
        return Cow::Borrowed(text);
    }
    Cow::Owned(
        text.chars()
            .map(|c| if is_unsafe_to_show(c) { '\u{fffd}' } else { c })
            .collect(),
    )
}

/// A short text stored with a lease for people (a CI run URL, a host and job), shown by
/// `inspect` and `list`: at most [`MAX_NOTE_LEN`] bytes, no control characters.
///
/// The note is information, never identity: it plays no part in who owns a lock, and
/// anyone who can read the lock can read it, so it must not hold secrets.
///
/// ```
/// use lockcore::Note;
/// let note = Note::new("https://ci.example/run/42")?;
/// assert_eq!(note.as_str(), "https://ci.example/run/42");
/// assert!(Note::new("two\nlines").is_err());
/// // What a server returns is shown, never refused: control characters become U+FFFD.
/// assert_eq!(Note::lossy("a\x1b[2Jb").as_str(), "a\u{fffd}[2Jb");
/// # Ok::<(), lockcore::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Note(Arc<str>);

impl Note {
    /// Validates `text`.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) when the note is empty,
    /// longer than [`MAX_NOTE_LEN`] bytes, or contains a control character (a newline
    /// included: notes are shown on one line) or an invisible or direction-changing
    /// character ([`is_unsafe_to_show`]).
    pub fn new(text: impl AsRef<str>) -> Result<Self, Invalid> {
        let text = text.as_ref();
        if text.is_empty() {
            return Err(Invalid::new("note is empty; leave it out instead"));
        }
        if text.len() > MAX_NOTE_LEN {
            return Err(Invalid::new(format!(
                "note is {} bytes long; the limit is {MAX_NOTE_LEN}",
                text.len()
            )));
        }
        if let Some((pos, ch)) = text.char_indices().find(|(_, c)| is_unsafe_to_show(*c)) {
            return Err(Invalid::new(format!(
                "note contains the control or invisible character {ch:?} at byte {pos}"
            )));
        }
        Ok(Self(Arc::from(text)))
    }

    /// A note read back from a server, which may have been written by anyone: control,
    /// invisible and direction-changing characters ([`is_unsafe_to_show`]) become U+FFFD and the text is cut to [`MAX_NOTE_LEN`] bytes (at a
    /// character boundary), so showing it can never move a terminal's cursor.
    pub fn lossy(text: &str) -> Self {
        let mut clean = String::with_capacity(text.len().min(MAX_NOTE_LEN));
        for ch in text.chars() {
            let ch = if is_unsafe_to_show(ch) {
                '\u{fffd}'
            } else {
                ch
            };
            if clean.len() + ch.len_utf8() > MAX_NOTE_LEN {
                break;
            }
            clean.push(ch);
        }
        Self(Arc::from(clean))
    }

    /// A stored note, if `text` is not empty (backends store "no note" as an empty text).
    pub fn from_stored(text: &str) -> Option<Self> {
        (!text.is_empty()).then(|| Self::lossy(text))
    }

    /// The note as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl TryFrom<&str> for Note {
    type Error = Invalid;
    fn try_from(value: &str) -> Result<Self, Invalid> {
        Self::new(value)
    }
}

/// Checks a prefix for [`LockBackend::list`](crate::LockBackend::list): empty (every
/// lock), or at most [`MAX_NAME_LEN`](crate::MAX_NAME_LEN) bytes with no control
/// characters, the rules of a [`LockName`].
///
/// # Errors
/// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) naming the rule broken.
pub fn validate_prefix(prefix: &str) -> Result<(), Invalid> {
    if prefix.is_empty() {
        return Ok(());
    }
    LockName::new(prefix)
        .map(drop)
        .map_err(|e| e.context("bad prefix"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_are_checked() {
        assert!(Note::new("").is_err());
        assert!(Note::new("x".repeat(MAX_NOTE_LEN)).is_ok());
        let long = Note::new("x".repeat(MAX_NOTE_LEN + 1)).unwrap_err();
        assert!(long.to_string().contains("513 bytes"), "{long}");
        assert!(Note::new("tab\there").is_err());
        assert!(Note::new("bell\u{7}").is_err());
        assert!(Note::new("ünïcode ✓ עברית").is_ok());
        assert!(Note::new("evil\u{202e}txt.exe").is_err());
        assert!(Note::new("zero\u{200b}width").is_err());
    }

    #[test]
    fn stored_notes_are_made_safe_to_show() {
        assert_eq!(Note::from_stored(""), None);
        assert_eq!(Note::lossy("\u{9b}31m").as_str(), "\u{fffd}31m");
        let long = "é".repeat(MAX_NOTE_LEN);
        let cut = Note::lossy(&long);
        assert_eq!(cut.as_str().len(), MAX_NOTE_LEN);
        assert!(cut.as_str().chars().all(|c| c == 'é'));
    }

    #[test]
    fn prefixes_follow_the_name_rules() {
        assert!(validate_prefix("").is_ok());
        assert!(validate_prefix("deploy/").is_ok());
        assert!(validate_prefix("a\nb").is_err());
        assert!(validate_prefix(&"p".repeat(513)).is_err());
    }
}
