//! Named time zones (`tz: Europe/Berlin`) read from the system's tz database at run time
//! (`$TZDIR`, else `/usr/share/zoneinfo`), as a `chrono::TimeZone` that `schedule` evaluates cron
//! expressions in. TZif files and the POSIX rule in their footer (for dates past the last
//! transition) are parsed by tz-rs. Embedding the database instead (chrono-tz) costs about 1 MB of
//! the static binary. It owns loading, caching (one parsed zone per name for the process, however
//! many tasks use it) and the local-to-UTC mapping across DST gaps and overlaps; it does not decide
//! what a cron time means in a gap (`schedule::cron` does). Called by `config` (to check and
//! load a `tz:`) and `schedule`.

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use chrono::{FixedOffset, MappedLocalTime, NaiveDate, NaiveDateTime, Offset, TimeZone};

/// A zone of the tz database. Cheap to clone (shared).
#[derive(Clone)]
pub struct NamedZone(Arc<Inner>);

struct Inner {
    name: String,
    tz: tz::TimeZone,
}

impl PartialEq for NamedZone {
    fn eq(&self, other: &Self) -> bool {
        self.0.name == other.0.name
    }
}

impl Eq for NamedZone {}

impl fmt::Debug for NamedZone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NamedZone({})", self.0.name)
    }
}

impl fmt::Display for NamedZone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.name)
    }
}

/// Zones loaded so far, by name.
static LOADED: Mutex<Option<HashMap<String, NamedZone>>> = Mutex::new(None);

/// Where the tz database is: `$TZDIR` (as glibc reads it), else the usual place.
fn tz_dir() -> PathBuf {
    std::env::var_os("TZDIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/share/zoneinfo"))
}

impl NamedZone {
    /// Loads `name` (an IANA name such as `Europe/Berlin`, or `UTC`), once per process.
    pub fn load(name: &str) -> Result<NamedZone, String> {
        let mut loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
        let cache = loaded.get_or_insert_with(HashMap::new);
        if let Some(z) = cache.get(name) {
            return Ok(z.clone());
        }
        let tz = if matches!(name, "UTC" | "Etc/UTC" | "Zulu" | "Etc/Zulu") {
            // Always known, with or without a tz database on the machine.
            tz::TimeZone::utc()
        } else {
            let ok = !name.is_empty()
                && !name.starts_with('/')
                && name
                    .split('/')
                    .all(|p| !p.is_empty() && p != "." && p != "..")
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '/' | '_' | '-' | '+'));
            if !ok {
                return Err(format!(
                    "unknown time zone {name:?} (use an IANA name such as Europe/Berlin or UTC)"
                ));
            }
            let path = tz_dir().join(name);
            let bytes = std::fs::read(&path).map_err(|e| {
                format!(
                    "unknown time zone {name:?}: cannot read {} ({}); use an IANA name such as Europe/Berlin or UTC (the machine needs its tz database, Debian's tzdata)",
                    path.display(),
                    match e.kind() {
                        std::io::ErrorKind::NotFound => "no such file".to_string(),
                        _ => e.to_string(),
                    }
                )
            })?;
            tz::TimeZone::from_tz_data(&bytes).map_err(|e| {
                format!(
                    "time zone {name:?}: {} is not a valid TZif file: {e}",
                    path.display()
                )
            })?
        };
        let zone = NamedZone(Arc::new(Inner {
            name: name.to_string(),
            tz,
        }));
        cache.insert(name.to_string(), zone.clone());
        Ok(zone)
    }

    pub fn name(&self) -> &str {
        &self.0.name
    }

    /// The UTC offset in force at a Unix time, in seconds east of UTC.
    fn offset_at(&self, unix: i64) -> i32 {
        // tz-rs refuses times far outside what it can represent; UTC+0 is then as good as any.
        self.0
            .tz
            .find_local_time_type(unix)
            .map_or(0, |t| t.ut_offset())
    }

    fn offset(&self, seconds: i32) -> ZoneOffset {
        ZoneOffset {
            zone: self.clone(),
            fixed: FixedOffset::east_opt(seconds)
                .unwrap_or_else(|| FixedOffset::east_opt(0).expect("0 is a valid offset")),
        }
    }
}

/// An offset in force in a [`NamedZone`] (the zone travels with it, as chrono's `from_offset`
/// rebuilds the zone from an offset).
#[derive(Clone)]
pub struct ZoneOffset {
    zone: NamedZone,
    fixed: FixedOffset,
}

impl fmt::Debug for ZoneOffset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.fixed)
    }
}

impl fmt::Display for ZoneOffset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.fixed)
    }
}

impl Offset for ZoneOffset {
    fn fix(&self) -> FixedOffset {
        self.fixed
    }
}

impl TimeZone for NamedZone {
    type Offset = ZoneOffset;

    fn from_offset(offset: &ZoneOffset) -> Self {
        offset.zone.clone()
    }

    fn offset_from_local_date(&self, local: &NaiveDate) -> MappedLocalTime<ZoneOffset> {
        match local.and_hms_opt(0, 0, 0) {
            Some(dt) => self.offset_from_local_datetime(&dt),
            None => MappedLocalTime::None,
        }
    }

    /// The offsets under which `local` is a real time: none in a gap (spring forward), two in an
    /// overlap (fall back; the earlier instant first), one otherwise. The candidates are the
    /// offsets in force a day either side, which covers every transition the database has (zones
    /// change at most twice a year, and never twice within 26 hours).
    fn offset_from_local_datetime(&self, local: &NaiveDateTime) -> MappedLocalTime<ZoneOffset> {
        let l = local.and_utc().timestamp();
        let mut found: Vec<i32> = Vec::with_capacity(2);
        for probe in [l - 26 * 3600, l, l + 26 * 3600] {
            let o = self.offset_at(probe);
            if !found.contains(&o) && self.offset_at(l - i64::from(o)) == o {
                found.push(o);
            }
        }
        // The earlier instant has the larger offset.
        found.sort_unstable_by(|a, b| b.cmp(a));
        match found[..] {
            [] => MappedLocalTime::None,
            [o] => MappedLocalTime::Single(self.offset(o)),
            [a, b, ..] => MappedLocalTime::Ambiguous(self.offset(a), self.offset(b)),
        }
    }

    fn offset_from_utc_date(&self, utc: &NaiveDate) -> ZoneOffset {
        let t = utc
            .and_hms_opt(0, 0, 0)
            .map_or(0, |d| d.and_utc().timestamp());
        self.offset(self.offset_at(t))
    }

    fn offset_from_utc_datetime(&self, utc: &NaiveDateTime) -> ZoneOffset {
        self.offset(self.offset_at(utc.and_utc().timestamp()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{NaiveDate, Utc};

    fn local(zone: &NamedZone, y: i32, m: u32, d: u32, h: u32, min: u32) -> MappedLocalTime<i32> {
        let dt = NaiveDate::from_ymd_opt(y, m, d)
            .unwrap()
            .and_hms_opt(h, min, 0)
            .unwrap();
        zone.offset_from_local_datetime(&dt)
            .map(|o| o.fix().local_minus_utc())
    }

    #[test]
    fn berlin_has_its_offsets_its_gap_and_its_overlap() {
        let z = NamedZone::load("Europe/Berlin").expect("Debian's tzdata is installed");
        assert_eq!(local(&z, 2026, 1, 15, 12, 0), MappedLocalTime::Single(3600));
        assert_eq!(local(&z, 2026, 7, 15, 12, 0), MappedLocalTime::Single(7200));
        // 2026-03-29 02:30 does not exist; 2026-10-25 02:30 exists twice.
        assert_eq!(local(&z, 2026, 3, 29, 2, 30), MappedLocalTime::None);
        assert_eq!(
            local(&z, 2026, 10, 25, 2, 30),
            MappedLocalTime::Ambiguous(7200, 3600)
        );
        // Far past the last transition in the file: the footer's rule still gives summer time.
        assert_eq!(local(&z, 2099, 7, 1, 12, 0), MappedLocalTime::Single(7200));
        let t = Utc
            .with_ymd_and_hms(2026, 7, 1, 10, 0, 0)
            .unwrap()
            .with_timezone(&z);
        assert_eq!(t.to_string(), "2026-07-01 12:00:00 +02:00");
    }

    #[test]
    fn names_are_checked_and_zones_shared() {
        let a = NamedZone::load("America/New_York").unwrap();
        let b = NamedZone::load("America/New_York").unwrap();
        assert!(Arc::ptr_eq(&a.0, &b.0), "one parsed zone per name");
        assert_eq!(
            local(&a, 2026, 1, 15, 12, 0),
            MappedLocalTime::Single(-5 * 3600)
        );
        assert_eq!(NamedZone::load("UTC").unwrap().offset_at(0), 0);
        for bad in [
            "Mars/Olympus",
            "../etc/passwd",
            "/etc/localtime",
            "Europe/Berlin ",
        ] {
            assert!(NamedZone::load(bad).is_err(), "{bad:?} accepted");
        }
    }
}
