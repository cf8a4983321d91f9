//! Resource quantities (`resource.Quantity`): `500m`, `1.5Gi`, `2e3`, `128Mi`.
//!
//! [`parse_quantity`] follows apimachinery's `ParseQuantity` grammar and returns the value
//! in milli-units, rounded away from zero like `Quantity.MilliValue()` (so `1n` CPU is
//! `1` milli-CPU). Limits: values must fit an `i128` of milli-units, and a fraction is
//! kept to 38 significant digits in total (digits beyond only decide the rounding).

use std::fmt;

/// Why a quantity string was rejected (the server answers 400/422 with the same text).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// The string does not follow the quantity grammar.
    #[error(
        "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
    )]
    FormatWrong,
    /// The suffix is not one of the known binary, decimal or exponent suffixes.
    #[error("unable to parse quantity's suffix")]
    Suffix,
    /// The value does not fit in the supported range.
    #[error("quantity is out of range")]
    OutOfRange,
}

/// Result alias for this module.
pub type Result<T, E = QuantityError> = std::result::Result<T, E>;

/// How a value is written back, like `resource.Format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `k`, `M`, `G`... and `m` for fractions (what CPU uses).
    DecimalSi,
    /// `Ki`, `Mi`, `Gi`... (what memory uses).
    BinarySi,
}

/// Parses a quantity into milli-units: `parse_quantity("1.5")` is `1500`,
/// `parse_quantity("1Ki")` is `1_024_000`, `parse_quantity("100m")` is `100`.
pub fn parse_quantity(s: &str) -> Result<i128> {
    if s.is_empty() {
        return Err(QuantityError::FormatWrong);
    }
    let b = s.as_bytes();
    let mut pos = 0;
    let mut negative = false;
    if let Some(&c @ (b'-' | b'+')) = b.first() {
        negative = c == b'-';
        pos = 1;
    }
    let int_start = pos;
    while b.get(pos).is_some_and(u8::is_ascii_digit) {
        pos += 1;
    }
    let int_digits = s.get(int_start..pos).unwrap_or("");
    let mut frac_digits = "";
    if b.get(pos) == Some(&b'.') {
        pos += 1;
        let start = pos;
        while b.get(pos).is_some_and(u8::is_ascii_digit) {
            pos += 1;
        }
        frac_digits = s.get(start..pos).unwrap_or("");
    }
    if pos == int_start {
        // `^[+-]?[0-9.]+`: the number part needs at least one digit or dot.
        return Err(QuantityError::FormatWrong);
    }
    let suffix_start = pos;
    while b.get(pos).is_some_and(|c| b"eEinumkKMGTP".contains(c)) {
        pos += 1;
    }
    if matches!(b.get(pos), Some(b'-' | b'+')) {
        pos += 1;
    }
    while b.get(pos).is_some_and(u8::is_ascii_digit) {
        pos += 1;
    }
    if pos != b.len() {
        return Err(QuantityError::FormatWrong);
    }
    let suffix = s.get(suffix_start..).unwrap_or("");
    let (pow2, pow10) = interpret_suffix(suffix)?;

    // Mantissa digits without leading zeros, fraction without trailing zeros.
    let int_digits = int_digits.trim_start_matches('0');
    let frac_digits = frac_digits.trim_end_matches('0');
    const MAX_DIGITS: usize = 38;
    if int_digits.len() > MAX_DIGITS {
        return Err(QuantityError::OutOfRange);
    }
    let keep = frac_digits.len().min(MAX_DIGITS - int_digits.len());
    let (kept, dropped) = frac_digits.split_at(keep);
    let mut sticky = dropped.bytes().any(|c| c != b'0');
    let mut mantissa: i128 = 0;
    for c in int_digits.bytes().chain(kept.bytes()) {
        mantissa = mantissa * 10 + i128::from(c - b'0');
    }
    if mantissa == 0 && !sticky {
        return Ok(0);
    }
    // value(milli) = mantissa * 2^pow2 * 10^(pow10 + 3 - kept)
    let mut exp10 = pow10.saturating_add(3).saturating_sub(keep as i64);
    let mut value = mantissa;
    for _ in 0..pow2 {
        value = value.checked_mul(2).ok_or(QuantityError::OutOfRange)?;
    }
    while exp10 > 0 {
        value = value.checked_mul(10).ok_or(QuantityError::OutOfRange)?;
        exp10 -= 1;
    }
    while exp10 < 0 && value != 0 {
        sticky |= value % 10 != 0;
        value /= 10;
        exp10 += 1;
    }
    if sticky {
        value = value.checked_add(1).ok_or(QuantityError::OutOfRange)?;
    }
    Ok(if negative { -value } else { value })
}

/// (power of two, power of ten) of a suffix.
fn interpret_suffix(suffix: &str) -> Result<(u32, i64)> {
    Ok(match suffix {
        "" => (0, 0),
        "Ki" => (10, 0),
        "Mi" => (20, 0),
        "Gi" => (30, 0),
        "Ti" => (40, 0),
        "Pi" => (50, 0),
        "Ei" => (60, 0),
        "n" => (0, -9),
        "u" => (0, -6),
        "m" => (0, -3),
        "k" => (0, 3),
        "M" => (0, 6),
        "G" => (0, 9),
        "T" => (0, 12),
        "P" => (0, 15),
        "E" => (0, 18),
        _ => {
            let rest = suffix
                .strip_prefix('e')
                .or_else(|| suffix.strip_prefix('E'))
                .ok_or(QuantityError::Suffix)?;
            let digits = rest.trim_start_matches(['+', '-']);
            if digits.is_empty()
                || rest.len() - digits.len() > 1
                || !digits.bytes().all(|c| c.is_ascii_digit())
            {
                return Err(QuantityError::Suffix);
            }
            // Beyond ±10^60 everything overflows or rounds to the smallest unit anyway.
            let magnitude = digits.parse::<i64>().unwrap_or(i64::MAX).min(1_000_000);
            (
                0,
                if rest.starts_with('-') {
                    -magnitude
                } else {
                    magnitude
                },
            )
        }
    })
}

/// Writes milli-units back in canonical form, like `Quantity.String()`.
pub fn format_millis(millis: i128, format: Format) -> String {
    Canonical { millis, format }.to_string()
}

/// CPU: `format_cpu_millis(1500)` is `1500m`, `format_cpu_millis(2000)` is `2`.
pub fn format_cpu_millis(millis: i128) -> String {
    format_millis(millis, Format::DecimalSi)
}

/// Memory: `format_memory_millis(128 * 1024 * 1024 * 1000)` is `128Mi`.
pub fn format_memory_millis(millis: i128) -> String {
    format_millis(millis, Format::BinarySi)
}

struct Canonical {
    millis: i128,
    format: Format,
}

impl fmt::Display for Canonical {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.millis;
        if m == 0 {
            return f.write_str("0");
        }
        if m % 1000 != 0 {
            return write!(f, "{m}m");
        }
        let units = m / 1000;
        // Binary format is only used from 1Ki up, as apimachinery's CanonicalizeBytes does.
        if self.format == Format::BinarySi && units.abs() >= 1024 {
            let mut v = units;
            let mut i = 0;
            const SUFFIXES: [&str; 7] = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
            while v % 1024 == 0 && i + 1 < SUFFIXES.len() {
                v /= 1024;
                i += 1;
            }
            if i > 0 {
                return write!(f, "{v}{}", SUFFIXES.get(i).unwrap_or(&""));
            }
        }
        let mut v = units;
        let mut i = 0;
        const SUFFIXES: [&str; 7] = ["", "k", "M", "G", "T", "P", "E"];
        while v % 1000 == 0 && i + 1 < SUFFIXES.len() {
            v /= 1000;
            i += 1;
        }
        write!(f, "{v}{}", SUFFIXES.get(i).unwrap_or(&""))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parse_table() {
        let cases: &[(&str, i128)] = &[
            ("0", 0),
            ("1", 1000),
            ("+1", 1000),
            ("-1", -1000),
            ("100m", 100),
            ("0.1", 100),
            (".5", 500),
            ("1.", 1000),
            ("1.5", 1500),
            ("250m", 250),
            ("1n", 1),
            ("1u", 1),
            ("1001u", 2),
            ("-1n", -1),
            ("1k", 1_000_000),
            ("2M", 2_000_000_000),
            ("1G", 1_000_000_000_000),
            ("1E", 1_000_000_000_000_000_000_000),
            ("1Ki", 1_024_000),
            ("1.5Ki", 1_536_000),
            ("128Mi", 128 * 1024 * 1024 * 1000),
            ("4Gi", 4 * (1i128 << 30) * 1000),
            ("1Ei", (1i128 << 60) * 1000),
            ("1e3", 1_000_000),
            ("1E3", 1_000_000),
            ("1e-3", 1),
            ("5e+2", 500_000),
            ("12e0", 12_000),
            ("0001.000", 1000),
            ("0.0000000000000000000000000000000000000000001", 1),
            (".", 0),
            ("0Gi", 0),
        ];
        for (s, want) in cases {
            assert_eq!(parse_quantity(s), Ok(*want), "{s}");
        }
    }

    #[test]
    fn parse_errors() {
        for bad in [
            "", "abc", "1 Gi", "1Gb", "1KI", "1e", "1e+-3", "1.2.3", "1Mi2", "Mi", "-", "+",
        ] {
            assert!(parse_quantity(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse_quantity("1Gb"), Err(QuantityError::FormatWrong));
        assert_eq!(parse_quantity("1iM"), Err(QuantityError::Suffix));
        assert_eq!(parse_quantity("1e1000"), Err(QuantityError::OutOfRange));
        assert_eq!(
            parse_quantity(&"9".repeat(50)),
            Err(QuantityError::OutOfRange)
        );
        assert_eq!(parse_quantity("1e-1000"), Ok(1));
        // 38 significant digits are the most a quantity may carry; rounding stays in range.
        let nines = "9".repeat(38);
        let max: i128 = nines.parse().unwrap_or(0);
        assert_eq!(parse_quantity(&format!("{nines}m")), Ok(max));
        assert_eq!(parse_quantity(&format!("{nines}.5m")), Ok(max + 1));
        assert_eq!(
            parse_quantity(&format!("{nines}k")),
            Err(QuantityError::OutOfRange)
        );
    }

    #[test]
    fn format_table() {
        assert_eq!(format_cpu_millis(0), "0");
        assert_eq!(format_cpu_millis(100), "100m");
        assert_eq!(format_cpu_millis(1500), "1500m");
        assert_eq!(format_cpu_millis(2000), "2");
        assert_eq!(format_cpu_millis(4_000_000), "4k");
        assert_eq!(format_cpu_millis(-2000), "-2");
        assert_eq!(format_memory_millis(128 * 1024 * 1024 * 1000), "128Mi");
        assert_eq!(format_memory_millis(1536 * 1000), "1536");
        assert_eq!(format_memory_millis(1000 * 1000), "1k");
        assert_eq!(format_memory_millis(1_536_000 * 1024), "1536Ki");
        assert_eq!(format_memory_millis(2_000_000_000), "2M");
        assert_eq!(format_memory_millis(500), "500m");
    }

    proptest! {
        #[test]
        fn parse_never_panics(s in "\\PC{0,30}") {
            let _ = parse_quantity(&s);
        }

        #[test]
        fn grammar_chars_never_panic(s in "[-+0-9.eEinumkKMGTP]{0,30}") {
            let _ = parse_quantity(&s);
        }

        #[test]
        fn format_round_trips(m in -1_000_000_000_000_000i128..1_000_000_000_000_000) {
            prop_assert_eq!(parse_quantity(&format_cpu_millis(m)), Ok(m));
            prop_assert_eq!(parse_quantity(&format_memory_millis(m)), Ok(m));
        }
    }
}
