//! Lowercase hex: how drun spells digests, MACs, tokens and fingerprints.

use std::fmt::Write;

/// `bytes` in lowercase hex, two digits a byte.
pub fn hex(bytes: &[u8]) -> String {
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

#[cfg(test)]
mod tests {
    #[test]
    fn two_lowercase_digits_a_byte_leading_zeros_kept() {
        assert_eq!(super::hex(&[0x00, 0x0a, 0xff, 0x7b]), "000aff7b");
        assert_eq!(super::hex(&[]), "");
    }
}
