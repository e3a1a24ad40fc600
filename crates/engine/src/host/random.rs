//! Randomness from the operating system's RNG: ids, names and a restored copy's fresh
//! identity. A failure is an error its caller must handle, never ignored: a copy reseeded with
//! bytes the RNG did not give would share its parent's randomness, and names drawn so would
//! clash.

/// `buf`, filled from the operating system's RNG.
pub fn fill(buf: &mut [u8]) -> std::io::Result<()> {
    getrandom::getrandom(buf).map_err(|e| {
        std::io::Error::other(format!(
            "the operating system's random number generator failed: {e}"
        ))
    })
}

/// `n` random bytes, as `2n` lowercase hex digits.
pub fn hex(n: usize) -> std::io::Result<String> {
    let mut b = vec![0u8; n];
    fill(&mut b)?;
    Ok(to_hex(&b))
}

/// `bytes` as lowercase hex digits.
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn hex_draws_are_fresh_and_of_their_length() {
        let (a, b) = (hex(16).unwrap(), hex(16).unwrap());
        assert_eq!(a.len(), 32);
        assert!(a
            .bytes()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_ne!(a, b);
        assert_eq!(to_hex(&[0, 0xab, 0x7f]), "00ab7f");
    }
}
