//! Byte sizes as users write them (`64M`, `2GiB`, `4096`) and as locus prints them.

/// Parses a size: a decimal number with an optional binary suffix K, M, G, T (also KiB, MiB,
/// GiB, TiB; case-insensitive; `B` alone means bytes).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, suffix) = text.split_at(split);
    if digits.is_empty() {
        return Err(format!("`{text}` does not start with a number"));
    }
    let number: u64 = digits
        .parse()
        .map_err(|_| format!("`{digits}` is too large"))?;
    let shift = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kib" => 10,
        "m" | "mib" => 20,
        "g" | "gib" => 30,
        "t" | "tib" => 40,
        other => {
            return Err(format!(
                "unknown size suffix `{other}` (use K, M, G or T, powers of 1024)"
            ));
        }
    };
    number
        .checked_mul(1u64 << shift)
        .ok_or_else(|| format!("`{text}` does not fit in 64 bits"))
}

/// Formats bytes with a binary unit and two decimals: `3.59 GiB`, `512 B`.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.2} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_suffixes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("1k"), Ok(1024));
        assert!(parse_size("M").unwrap_err().contains("number"));
        assert!(parse_size("3X").unwrap_err().contains("suffix"));
        assert!(parse_size("99999999999T").unwrap_err().contains("64 bits"));
    }

    #[test]
    fn formats_with_binary_units() {
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(1536), "1.50 KiB");
        assert_eq!(format_bytes(3 << 30), "3.00 GiB");
    }
}
