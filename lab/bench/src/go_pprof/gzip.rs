//! RFC 1952's wrapper around a deflate stream, read by hand (`miniz_oxide` inflates raw
//! deflate only).

use crate::op::Res;

/// The largest profile [`gunzip`] inflates, in bytes: a CPU profile of a busy Go server
/// over a minute is a few MB; a larger body is not a profile.
pub(super) const MAX_INFLATED: usize = 256 << 20;

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
    let data = miniz_oxide::inflate::decompress_to_vec_with_limit(deflated, MAX_INFLATED)
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
