//! The grammar of durations (`500ms`, `30s`, `1h30m`, `7d`) and byte sizes (`512KiB`, `64MiB`, `2GB`):
//! parsing the written form and formatting a value back into it. Pure functions with no I/O and no
//! serde, so every layer can print a duration or a size the way the config file writes it. It does not
//! know which fields use them or which ranges are allowed there (that is each entry's `config.rs`),
//! nor how they are read from the file (`shape::units` holds the serde and schema glue).

use std::time::Duration;

/// Parses `500ms`, `30s`, `5m`, `2h`, `7d` and sequences of them (`1h30m`). A bare number is refused:
/// `timeout: 30` is ambiguous (seconds? milliseconds?) and a typo should not pass silently.
///
/// A message quotes the whole text and never a part of it, so `config` can name the variable a
/// value came from instead of the value (which may be a secret).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let s = text.trim();
    if s.is_empty() {
        return Err("empty duration (write e.g. 30s, 500ms, 5m, 2h, 7d)".into());
    }
    let mut total: u128 = 0;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(format!(
                "duration {text:?}: expected a number before each unit (write e.g. 30s, 500ms, 5m, 2h, 7d)"
            ));
        }
        let value: u128 = rest[..digits]
            .parse()
            .map_err(|_| format!("duration {text:?}: number too large"))?;
        rest = &rest[digits..];
        let unit_len = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let nanos_per: u128 = match unit {
            "ns" => 1,
            "us" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60 * 1_000_000_000,
            "h" => 3_600 * 1_000_000_000,
            "d" => 86_400 * 1_000_000_000,
            "" => {
                return Err(format!(
                    "duration {text:?}: missing unit after a number (ns, us, ms, s, m, h or d, e.g. 30s)"
                ));
            }
            _ => {
                return Err(format!(
                    "duration {text:?}: unknown unit (use ns, us, ms, s, m, h or d)"
                ));
            }
        };
        total = value
            .checked_mul(nanos_per)
            .and_then(|n| total.checked_add(n))
            .ok_or_else(|| format!("duration {text:?}: too large"))?;
    }
    let secs = u64::try_from(total / 1_000_000_000)
        .map_err(|_| format!("duration {text:?}: too large"))?;
    let nanos =
        u32::try_from(total % 1_000_000_000).expect("remainder of a division by 1e9 fits u32");
    Ok(Duration::new(secs, nanos))
}

/// Parses `4096`, `512B`, `512KiB`, `64MiB`, `2GiB`, `1TiB` and the decimal `KB`, `MB`, `GB`, `TB`.
/// Like [`parse_duration`], a message quotes the whole text, never a part.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let s = text.trim();
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return Err(format!(
            "size {text:?}: expected a number (write e.g. 512KiB, 64MiB, 2GiB)"
        ));
    }
    let value: u64 = s[..digits]
        .parse()
        .map_err(|_| format!("size {text:?}: number too large"))?;
    let mult: u64 = match s[digits..].trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        _ => {
            return Err(format!(
                "size {text:?}: unknown unit (use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)"
            ));
        }
    };
    value
        .checked_mul(mult)
        .ok_or_else(|| format!("size {text:?}: too large"))
}

/// Formats a duration the way the file writes it, for summaries and error messages.
pub fn fmt_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 && !d.is_zero() {
        return format!("{}us", d.as_micros());
    }
    let units: [(u128, &str); 5] = [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "m"),
        (1_000, "s"),
        (1, "ms"),
    ];
    if ms == 0 {
        return "0s".into();
    }
    let mut out = String::new();
    let mut rest = ms;
    for (per, unit) in units {
        if rest >= per {
            out.push_str(&format!("{}{unit}", rest / per));
            rest %= per;
        }
    }
    out
}

/// Formats a size the way the file writes it (`512KiB`, `12.3MiB`), for summaries.
pub fn fmt_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i < UNITS.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    match i {
        0 => format!("{bytes}B"),
        _ if v.fract() == 0.0 => format!("{v:.0}{}", UNITS[i]),
        _ => format!("{v:.1}{}", UNITS[i]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_in_every_unit() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86400)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("1s500ms"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
    }

    #[test]
    fn bad_durations_say_why() {
        assert_eq!(
            parse_duration("30").unwrap_err(),
            "duration \"30\": missing unit after a number (ns, us, ms, s, m, h or d, e.g. 30s)"
        );
        assert_eq!(
            parse_duration("30x").unwrap_err(),
            "duration \"30x\": unknown unit (use ns, us, ms, s, m, h or d)"
        );
        // The whole text is quoted once and no part of it on its own (it may be a secret that
        // `config` names by its variable instead).
        for bad in ["5s x", "1h30q", "-5s", "s", "30"] {
            let e = parse_duration(bad).unwrap_err();
            assert_eq!(e.matches('"').count(), 2, "{e}");
            assert!(e.starts_with(&format!("duration {bad:?}: ")), "{e}");
        }
        assert!(parse_duration("").unwrap_err().contains("empty"));
        assert!(
            parse_duration("s")
                .unwrap_err()
                .contains("expected a number")
        );
        assert!(
            parse_duration("-5s")
                .unwrap_err()
                .contains("expected a number")
        );
        assert!(
            parse_duration("99999999999999999999999d")
                .unwrap_err()
                .contains("too large")
        );
    }

    #[test]
    fn sizes_binary_and_decimal() {
        assert_eq!(parse_size("512KiB"), Ok(512 * 1024));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("1TiB"), Ok(1 << 40));
        assert_eq!(parse_size("10MB"), Ok(10_000_000));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("12B"), Ok(12));
        assert!(parse_size("12XB").unwrap_err().contains("unknown unit"));
        assert!(parse_size("MiB").unwrap_err().contains("expected a number"));
        assert!(
            parse_size("99999999999TiB")
                .unwrap_err()
                .contains("too large")
        );
    }

    #[test]
    fn formats_round_trip() {
        for s in ["500ms", "30s", "5m", "2h", "7d", "1h30m", "1d2h3m4s5ms"] {
            assert_eq!(fmt_duration(parse_duration(s).unwrap()), s);
        }
        assert_eq!(fmt_duration(Duration::ZERO), "0s");
    }

    #[test]
    fn sizes_format_for_people() {
        assert_eq!(fmt_size(0), "0B");
        assert_eq!(fmt_size(1023), "1023B");
        assert_eq!(fmt_size(512 << 10), "512KiB");
        assert_eq!(fmt_size(256 << 20), "256MiB");
        assert_eq!(fmt_size((12 << 20) + (300 << 10)), "12.3MiB");
        assert_eq!(fmt_size(2 << 30), "2GiB");
    }
}
