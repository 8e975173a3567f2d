//! When a task is due: crontab expressions (5 fields, or 6 with seconds first; names such as `MON-FRI`;
//! `@hourly`-style macros; `@reboot`), evaluated in a time zone with cron(8)'s DST rules (`cron`), and fixed
//! intervals with a start offset. This module only answers "what is the next fire time after T"; the
//! scheduler owns the clock, the heap and what happens when a time comes. Parsing is done once, by
//! `config::compile`.

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Local, NaiveDate, Utc};
use croner::Cron;
use croner::parser::{CronParser, Seconds};

mod cron;

/// A compiled schedule.
#[derive(Debug, Clone)]
pub enum Schedule {
    /// A crontab expression in a time zone.
    Cron(CronSchedule),
    /// A fixed interval, measured on the monotonic clock so wall-clock jumps do not disturb it.
    Every { period: Duration, offset: Offset },
    /// Once, when the agent starts.
    Reboot,
}

/// Where an interval task's first run falls after start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offset {
    Fixed(Duration),
    /// Uniform in `[0, period)`, drawn once per start, so many tasks with one interval do not fire
    /// together.
    Random,
}

/// The time zone a cron expression is read in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Zone {
    /// The machine's zone (`TZ`, else `/etc/localtime`).
    Local,
    /// A zone of the tz database, read once at load time.
    Named(crate::zone::NamedZone),
}

/// A validated crontab expression. Only the text is kept: a parsed `croner::Cron` holds about 6 KB
/// (a byte per possible year), which for 10,000 tasks would be 60 MB resident; re-parsing takes
/// microseconds and happens once per fire.
#[derive(Debug, Clone)]
pub struct CronSchedule {
    /// As written, for logs and summaries.
    pub text: String,
    /// The expression croner reads (macros expanded).
    expr: String,
    /// A day must match both the day-of-month and the day-of-week field: one of them begins with
    /// `*` (so `*/2` too), as in Vixie cron and cronie. Otherwise either is enough.
    days_and: bool,
    /// No second, minute or hour field begins with `*`: DST changes move the job rather than
    /// skip or repeat it (`cron::next_after`).
    fixed: bool,
    pub zone: Zone,
}

fn parser(days_and: bool) -> CronParser {
    CronParser::builder()
        .seconds(Seconds::Optional)
        .dom_and_dow(days_and)
        .build()
}

impl CronSchedule {
    /// The first fire time strictly after `after`, or `None` when the expression never matches again
    /// (parsing refuses expressions that never match at all).
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        // Parsed successfully when the config was compiled, so this cannot fail; None is the safe
        // answer regardless ("never due").
        let cron: Cron = parser(self.days_and).parse(&self.expr).ok()?;
        let times = cron::TimesOfDay::of(&cron.pattern);
        match &self.zone {
            Zone::Local => cron::next_after(&cron.pattern, &times, self.fixed, &Local, after),
            Zone::Named(tz) => cron::next_after(&cron.pattern, &times, self.fixed, tz, after),
        }
    }

    /// Whether DST changes move this job (fixed-time) rather than skip or repeat it (wildcard).
    pub fn is_fixed_time(&self) -> bool {
        self.fixed
    }
}

impl Offset {
    /// Resolves the offset for one start of the agent.
    pub fn resolve(self, period: Duration) -> Duration {
        match self {
            Offset::Fixed(d) => d,
            Offset::Random => {
                let nanos = u64::try_from(period.as_nanos()).unwrap_or(u64::MAX);
                Duration::from_nanos(if nanos == 0 {
                    0
                } else {
                    fastrand::u64(0..nanos)
                })
            }
        }
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Schedule::Cron(c) => match &c.zone {
                Zone::Local => write!(f, "{}", c.text),
                Zone::Named(tz) => write!(f, "{} ({tz})", c.text),
            },
            Schedule::Every { period, offset } => {
                write!(f, "every {}", crate::units::fmt_duration(*period))?;
                match offset {
                    Offset::Fixed(d) if d.is_zero() => Ok(()),
                    Offset::Fixed(d) => {
                        write!(f, " from +{}", crate::units::fmt_duration(*d))
                    }
                    Offset::Random => write!(f, " (random offset)"),
                }
            }
            Schedule::Reboot => f.write_str("@reboot"),
        }
    }
}

const FIELDS6: [(&str, u32, u32); 6] = [
    ("second", 0, 59),
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day of month", 1, 31),
    ("month", 1, 12),
    ("day of week", 0, 7),
];

/// Parses a crontab expression or macro. Errors read like `minute 61 out of range 0-59`.
pub fn parse_cron(text: &str, zone: Zone) -> Result<Schedule, String> {
    let trimmed = text.trim();
    let expr = match trimmed.to_ascii_lowercase().as_str() {
        "@reboot" => return Ok(Schedule::Reboot),
        "@yearly" | "@annually" => "0 0 1 1 *",
        "@monthly" => "0 0 1 * *",
        "@weekly" => "0 0 * * 0",
        "@daily" | "@midnight" => "0 0 * * *",
        "@hourly" => "0 * * * *",
        m if m.starts_with('@') => {
            return Err(format!(
                "unknown macro {trimmed:?} (use @reboot, @yearly, @annually, @monthly, @weekly, @daily, @midnight or @hourly)"
            ));
        }
        _ => trimmed,
    };
    let fields: Vec<&str> = expr.split_whitespace().collect();
    let names: &[(&str, u32, u32)] = match fields.len() {
        5 => &FIELDS6[1..],
        6 => &FIELDS6[..],
        n => {
            return Err(format!(
                "expected 5 fields (minute hour day-of-month month day-of-week) or 6 with seconds first, found {n}"
            ));
        }
    };
    for (field, (name, lo, hi)) in fields.iter().zip(names) {
        check_field(field, name, *lo, *hi)?;
    }
    // The time fields, then day of month, month, day of week.
    let (time, days) = fields.split_at(fields.len() - 3);
    let (dom, month, dow) = (days[0], days[1], days[2]);
    let unrestricted = |f: &str| f.starts_with(['*', '?']);
    let days_and = unrestricted(dom) || unrestricted(dow);
    let fixed = !time.iter().any(|f| f.starts_with('*'));
    let cron = parser(days_and).parse(expr).map_err(|e| {
        let msg = e.to_string();
        msg.trim_end_matches('.').to_lowercase()
    })?;
    let epoch = NaiveDate::from_ymd_opt(2000, 1, 1).expect("a valid date");
    if cron::first_date(&cron.pattern, epoch).is_none() {
        return Err(if unrestricted(dow) {
            format!("never fires: no date has day of month {dom} in month {month}")
        } else {
            format!(
                "never fires: no date matches day of month {dom}, month {month} and day of week {dow} together"
            )
        });
    }
    Ok(Schedule::Cron(CronSchedule {
        text: trimmed.to_string(),
        expr: expr.to_string(),
        days_and,
        fixed,
        zone,
    }))
}

/// The number a month or weekday name stands for (`SUN` is 7 at the end of a range, as in
/// `SAT-SUN`), or the text when it is not a name.
fn name_value(name: &str, b: &str, range_end: bool) -> Option<u32> {
    const DAYS: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];
    const MONTHS: [&str; 12] = [
        "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
    ];
    let upper = b.to_ascii_uppercase();
    match name {
        "day of week" => DAYS.iter().position(|d| *d == upper).map(|i| match i {
            0 if range_end => 7,
            i => i as u32,
        }),
        "month" => MONTHS
            .iter()
            .position(|m| *m == upper)
            .map(|i| i as u32 + 1),
        _ => None,
    }
}

/// Range-checks the plain numbers of one field so the message names the field; anything else
/// (`L`, `W`, `#`) is left to croner.
fn check_field(field: &str, name: &str, lo: u32, hi: u32) -> Result<(), String> {
    for item in field.split(',') {
        let (range, step) = match item.split_once('/') {
            Some((r, s)) => (r, Some(s)),
            None => (item, None),
        };
        if let Some(step) = step {
            match step.parse::<u32>() {
                Ok(0) => {
                    return Err(format!(
                        "{name} step 0 in {item:?} (a step must be at least 1)"
                    ));
                }
                Ok(_) => {}
                Err(_) => return Err(format!("{name} step {step:?} in {item:?} is not a number")),
            }
        }
        let range = range.trim_start_matches('+');
        let range = range.split('#').next().unwrap_or(range);
        let bounds: Vec<&str> = range.split('-').collect();
        for b in &bounds {
            let b = b.trim_end_matches(['W', 'w', 'L', 'l']);
            if !b.is_empty() && b.bytes().all(|c| c.is_ascii_digit()) {
                let v: u64 = b.parse().unwrap_or(u64::MAX);
                if v < u64::from(lo) || v > u64::from(hi) {
                    return Err(format!("{name} {b} out of range {lo}-{hi}"));
                }
            }
        }
        if let [a, z] = bounds[..] {
            let value = |b: &str, end: bool| b.parse::<u32>().ok().or(name_value(name, b, end));
            if let (Some(va), Some(vz)) = (value(a, false), value(z, true))
                && va > vz
            {
                // Ranges do not wrap around (cron(8) refuses them too): say how to write it.
                let named = a.parse::<u32>().is_err();
                let (last, first) = match (name, named) {
                    ("day of week", true) => ("SAT".to_string(), "SUN".to_string()),
                    ("day of week", false) => ("6".to_string(), "0".to_string()),
                    ("month", true) => ("DEC".to_string(), "JAN".to_string()),
                    _ => (hi.to_string(), lo.to_string()),
                };
                return Err(format!(
                    "{name} range {a}-{z} runs backwards (ranges do not wrap around: write {a}-{last},{first}-{z})"
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{Datelike, TimeZone, Timelike, Weekday};
    fn zone(name: &str) -> crate::zone::NamedZone {
        crate::zone::NamedZone::load(name).expect("the machine's tz database has it")
    }

    fn cron(text: &str, tz: &str) -> CronSchedule {
        match parse_cron(text, Zone::Named(zone(tz))).unwrap() {
            Schedule::Cron(c) => c,
            other => panic!("not a cron schedule: {other:?}"),
        }
    }

    fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32, s: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(y, mo, d, h, mi, s).unwrap()
    }

    /// All fire times in `[from, to)`, in UTC.
    fn fires(c: &CronSchedule, from: DateTime<Utc>, to: DateTime<Utc>) -> Vec<DateTime<Utc>> {
        let mut out = Vec::new();
        let mut t = from - chrono::Duration::seconds(1);
        for _ in 0..10_000 {
            match c.next_after(t) {
                Some(n) if n < to => {
                    out.push(n);
                    t = n;
                }
                _ => return out,
            }
        }
        panic!("too many fire times")
    }

    #[test]
    fn weekday_numbers_follow_crontab() {
        // 2026-11-30 is a Monday.
        let start = utc(2026, 11, 29, 12, 0, 0); // Sunday noon UTC
        let mon = cron("0 0 * * 1", "UTC").next_after(start).unwrap();
        assert_eq!(mon.weekday(), Weekday::Mon);
        for sunday in ["0 0 * * 0", "0 0 * * 7", "0 0 * * SUN", "0 0 * * sun"] {
            let t = cron(sunday, "UTC").next_after(start).unwrap();
            assert_eq!(t.weekday(), Weekday::Sun, "{sunday}");
        }
    }

    #[test]
    fn names_and_ranges() {
        let c = cron("30 8 * * MON-FRI", "UTC");
        let days: Vec<Weekday> = fires(&c, utc(2026, 11, 30, 0, 0, 0), utc(2026, 12, 7, 0, 0, 0))
            .iter()
            .map(|t| t.weekday())
            .collect();
        assert_eq!(
            days,
            [
                Weekday::Mon,
                Weekday::Tue,
                Weekday::Wed,
                Weekday::Thu,
                Weekday::Fri
            ]
        );
        let c = cron("0 0 1 JAN,jul *", "UTC");
        let t = c.next_after(utc(2026, 2, 1, 0, 0, 0)).unwrap();
        assert_eq!((t.month(), t.day()), (7, 1));
    }

    #[test]
    fn day_of_month_or_day_of_week_as_in_crontab() {
        // crontab(5): when both are restricted, either matching is enough.
        let c = cron("0 0 13 * FRI", "UTC");
        let f = fires(&c, utc(2026, 11, 1, 0, 0, 0), utc(2026, 12, 1, 0, 0, 0));
        // Fridays in Nov 2026: 6, 13, 20, 27; plus the 13th (itself a Friday).
        let days: Vec<u32> = f.iter().map(|t| t.day()).collect();
        assert_eq!(days, [6, 13, 20, 27]);
    }

    #[test]
    fn macros() {
        let start = utc(2026, 11, 30, 10, 20, 0);
        let h = cron("@hourly", "UTC").next_after(start).unwrap();
        assert_eq!(h, utc(2026, 11, 30, 11, 0, 0));
        let d = cron("@daily", "UTC").next_after(start).unwrap();
        assert_eq!(d, utc(2026, 12, 1, 0, 0, 0));
        assert_eq!(cron("@midnight", "UTC").next_after(start), Some(d));
        let w = cron("@weekly", "UTC").next_after(start).unwrap();
        assert_eq!(w, utc(2026, 12, 6, 0, 0, 0));
        let m = cron("@monthly", "UTC").next_after(start).unwrap();
        assert_eq!(m, utc(2026, 12, 1, 0, 0, 0));
        let y = cron("@yearly", "UTC").next_after(start).unwrap();
        assert_eq!(y, utc(2027, 1, 1, 0, 0, 0));
        assert!(matches!(
            parse_cron("@reboot", Zone::Local),
            Ok(Schedule::Reboot)
        ));
        assert!(
            parse_cron("@fortnightly", Zone::Local)
                .unwrap_err()
                .contains("unknown macro")
        );
    }

    #[test]
    fn optional_seconds_field() {
        let c = cron("*/15 * * * * *", "UTC");
        let f = fires(&c, utc(2026, 1, 1, 0, 0, 0), utc(2026, 1, 1, 0, 1, 0));
        let secs: Vec<u32> = f.iter().map(|t| t.second()).collect();
        assert_eq!(secs, [0, 15, 30, 45]);
    }

    #[test]
    fn errors_name_the_field() {
        let e = |s: &str| parse_cron(s, Zone::Local).unwrap_err();
        assert_eq!(e("61 * * * *"), "minute 61 out of range 0-59");
        assert_eq!(e("* 24 * * *"), "hour 24 out of range 0-23");
        assert_eq!(e("* * 0 * *"), "day of month 0 out of range 1-31");
        assert_eq!(e("* * * 13 *"), "month 13 out of range 1-12");
        assert_eq!(e("* * * * 8"), "day of week 8 out of range 0-7");
        assert_eq!(e("60 * * * * *"), "second 60 out of range 0-59");
        assert_eq!(
            e("*/0 * * * *"),
            "minute step 0 in \"*/0\" (a step must be at least 1)"
        );
        assert_eq!(
            e("30-10 * * * *"),
            "minute range 30-10 runs backwards (ranges do not wrap around: write 30-59,0-10)"
        );
        assert!(e("* * *").contains("expected 5 fields"));
        assert!(
            e("* * * * FUNDAY").starts_with("invalid pattern")
                || e("* * * * FUNDAY").contains("illegal")
        );
    }

    /// Europe/Berlin springs forward on 2026-03-29 at 02:00 CET (01:00 UTC) to 03:00 CEST.
    #[test]
    fn berlin_spring_forward_runs_a_skipped_time_once() {
        let c = cron("30 2 * * *", "Europe/Berlin");
        let f = fires(&c, utc(2026, 3, 28, 0, 0, 0), utc(2026, 3, 31, 0, 0, 0));
        assert_eq!(
            f,
            [
                utc(2026, 3, 28, 1, 30, 0), // 02:30 CET
                utc(2026, 3, 29, 1, 0, 0), // 02:30 does not exist: the first instant after the gap, 03:00 CEST
                utc(2026, 3, 30, 0, 30, 0), // 02:30 CEST
            ]
        );
    }

    /// Europe/Berlin falls back on 2026-10-25 at 03:00 CEST (01:00 UTC) to 02:00 CET.
    #[test]
    fn berlin_fall_back_runs_a_repeated_time_once() {
        let c = cron("30 2 * * *", "Europe/Berlin");
        let f = fires(&c, utc(2026, 10, 24, 0, 0, 0), utc(2026, 10, 27, 0, 0, 0));
        assert_eq!(
            f,
            [
                utc(2026, 10, 24, 0, 30, 0), // 02:30 CEST
                utc(2026, 10, 25, 0, 30, 0), // the first 02:30 (CEST) only
                utc(2026, 10, 26, 1, 30, 0), // 02:30 CET
            ]
        );
        // A job that runs every 30 minutes keeps running every 30 real minutes through the repeat.
        let c = cron("*/30 * * * *", "Europe/Berlin");
        let f = fires(&c, utc(2026, 10, 24, 23, 0, 0), utc(2026, 10, 25, 2, 0, 0));
        let gaps: Vec<i64> = f.windows(2).map(|w| (w[1] - w[0]).num_minutes()).collect();
        assert_eq!(f.len(), 6);
        assert!(gaps.iter().all(|g| *g == 30), "{gaps:?}");
    }

    /// America/New_York springs forward on 2026-03-08 at 02:00 EST (07:00 UTC) to 03:00 EDT.
    #[test]
    fn new_york_spring_forward() {
        let c = cron("30 2 * * *", "America/New_York");
        let f = fires(&c, utc(2026, 3, 7, 0, 0, 0), utc(2026, 3, 10, 0, 0, 0));
        assert_eq!(
            f,
            [
                utc(2026, 3, 7, 7, 30, 0), // 02:30 EST
                utc(2026, 3, 8, 7, 0, 0),  // 03:00 EDT, once
                utc(2026, 3, 9, 6, 30, 0), // 02:30 EDT
            ]
        );
        // A daily job outside the gap is not disturbed.
        let c = cron("0 9 * * *", "America/New_York");
        let f = fires(&c, utc(2026, 3, 7, 0, 0, 0), utc(2026, 3, 10, 0, 0, 0));
        let local: Vec<u32> = f
            .iter()
            .map(|t| t.with_timezone(&zone("America/New_York")).hour())
            .collect();
        assert_eq!(local, [9, 9, 9]);
    }

    /// America/New_York falls back on 2026-11-01 at 02:00 EDT (06:00 UTC) to 01:00 EST.
    #[test]
    fn new_york_fall_back() {
        let c = cron("30 1 * * *", "America/New_York");
        let f = fires(&c, utc(2026, 10, 31, 0, 0, 0), utc(2026, 11, 3, 0, 0, 0));
        assert_eq!(
            f,
            [
                utc(2026, 10, 31, 5, 30, 0), // 01:30 EDT
                utc(2026, 11, 1, 5, 30, 0),  // the first 01:30 (EDT) only
                utc(2026, 11, 2, 6, 30, 0),  // 01:30 EST
            ]
        );
    }

    /// The days of the fires in `[from, to)`.
    fn days(c: &CronSchedule, from: DateTime<Utc>, to: DateTime<Utc>) -> Vec<u32> {
        fires(c, from, to).iter().map(|t| t.day()).collect()
    }

    #[test]
    fn a_list_in_a_skipped_hour_runs_once_after_the_gap() {
        // New York skips 02:00-03:00 on 2026-03-08 (07:00 UTC).
        let c = cron("0,30 2 * * *", "America/New_York");
        assert!(c.is_fixed_time());
        assert_eq!(
            c.next_after(utc(2026, 3, 8, 5, 0, 0)),
            Some(utc(2026, 3, 8, 7, 0, 0))
        );
        let f = fires(&c, utc(2026, 3, 8, 5, 0, 0), utc(2026, 3, 10, 0, 0, 0));
        assert_eq!(
            f,
            [
                utc(2026, 3, 8, 7, 0, 0), // 03:00 EDT, once for both 02:00 and 02:30
                utc(2026, 3, 9, 6, 0, 0), // 02:00 EDT
                utc(2026, 3, 9, 6, 30, 0),
            ]
        );
        // A range too, and an hour list reaching into the gap.
        let c = cron("0 1-3 * * *", "America/New_York");
        let f = fires(&c, utc(2026, 3, 8, 5, 0, 0), utc(2026, 3, 8, 12, 0, 0));
        assert_eq!(f, [utc(2026, 3, 8, 6, 0, 0), utc(2026, 3, 8, 7, 0, 0)]);
    }

    #[test]
    fn a_list_in_a_repeated_hour_runs_once() {
        // New York repeats 01:00-02:00 on 2026-11-01 (05:00-06:00 UTC as EDT, then as EST).
        let c = cron("59 1,3 * * *", "America/New_York");
        assert_eq!(
            c.next_after(utc(2026, 11, 1, 6, 0, 0)),
            Some(utc(2026, 11, 1, 8, 59, 0)) // 03:59 EST; 01:59 ran at 05:59 UTC (EDT)
        );
        let f = fires(&c, utc(2026, 11, 1, 4, 0, 0), utc(2026, 11, 1, 12, 0, 0));
        assert_eq!(f, [utc(2026, 11, 1, 5, 59, 0), utc(2026, 11, 1, 8, 59, 0)]);
        // Minutes as a list in the repeated hour: each once, in the first 01:xx.
        let c = cron("10,40 1 * * *", "America/New_York");
        let f = fires(&c, utc(2026, 11, 1, 4, 0, 0), utc(2026, 11, 1, 12, 0, 0));
        assert_eq!(f, [utc(2026, 11, 1, 5, 10, 0), utc(2026, 11, 1, 5, 40, 0)]);
    }

    #[test]
    fn a_wildcard_hour_follows_real_time_through_dst() {
        // `0 * * * *`: hourly in real time, so the repeated 01:00 runs twice and the skipped 02:00
        // never.
        let c = cron("0 * * * *", "America/New_York");
        assert!(!c.is_fixed_time());
        let f = fires(&c, utc(2026, 11, 1, 4, 30, 0), utc(2026, 11, 1, 8, 30, 0));
        assert_eq!(
            f,
            [
                utc(2026, 11, 1, 5, 0, 0), // 01:00 EDT
                utc(2026, 11, 1, 6, 0, 0), // 01:00 EST
                utc(2026, 11, 1, 7, 0, 0), // 02:00 EST
                utc(2026, 11, 1, 8, 0, 0),
            ]
        );
        let f = fires(&c, utc(2026, 3, 8, 5, 30, 0), utc(2026, 3, 8, 8, 30, 0));
        assert_eq!(
            f,
            [
                utc(2026, 3, 8, 6, 0, 0), // 01:00 EST
                utc(2026, 3, 8, 7, 0, 0), // 03:00 EDT
                utc(2026, 3, 8, 8, 0, 0),
            ]
        );
        // A step in the minute field makes the job a wildcard one: both 01:xx hours run.
        let c = cron("*/30 1 * * *", "America/New_York");
        let f = fires(&c, utc(2026, 11, 1, 4, 0, 0), utc(2026, 11, 1, 12, 0, 0));
        assert_eq!(f.len(), 4, "{f:?}");
    }

    #[test]
    fn a_day_field_beginning_with_a_star_restricts_nothing_as_in_cronie() {
        // `*/2` in day-of-month: Mondays that are odd days, not every odd day plus every Monday.
        let c = cron("0 0 */2 * 1", "UTC");
        assert_eq!(
            days(&c, utc(2026, 11, 1, 0, 0, 0), utc(2027, 1, 1, 0, 0, 0)),
            [9, 23, 7, 21] // Mondays 2, 9, 16, 23, 30 Nov and 7, 14, 21, 28 Dec: the odd ones
        );
        // The same with `*/2` in day-of-week: the 1st when it is Sun, Tue, Thu or Sat.
        let c = cron("0 0 1 * */2", "UTC");
        let f = fires(&c, utc(2026, 1, 1, 0, 0, 0), utc(2027, 1, 1, 0, 0, 0));
        let weekdays: Vec<Weekday> = f.iter().map(|t| t.weekday()).collect();
        assert!(!f.is_empty());
        assert!(
            weekdays.iter().all(|w| w.num_days_from_sunday() % 2 == 0),
            "{weekdays:?}"
        );
        assert!(f.iter().all(|t| t.day() == 1));
        // Both restricted: either is enough (crontab(5)).
        let c = cron("0 0 1 * 1", "UTC");
        assert_eq!(
            days(&c, utc(2026, 11, 1, 0, 0, 0), utc(2026, 12, 1, 0, 0, 0)),
            [1, 2, 9, 16, 23, 30]
        );
    }

    #[test]
    fn an_expression_that_never_fires_is_refused_with_the_reason() {
        let e = |s: &str| parse_cron(s, Zone::Local).unwrap_err();
        assert_eq!(
            e("0 0 30 2 *"),
            "never fires: no date has day of month 30 in month 2"
        );
        assert_eq!(
            e("0 0 31 4 *"),
            "never fires: no date has day of month 31 in month 4"
        );
        assert_eq!(
            e("0 0 31 APR,JUN *"),
            "never fires: no date has day of month 31 in month APR,JUN"
        );
        // Rare is not never: 29 February, and 29 February on a Monday (every 28 years or so).
        assert!(parse_cron("0 0 29 2 *", Zone::Local).is_ok());
        let c = cron("0 0 29 2 +1", "UTC");
        let n = c.next_after(utc(2026, 1, 1, 0, 0, 0)).unwrap();
        assert_eq!((n.year(), n.month(), n.day()), (2044, 2, 29));
    }

    #[test]
    fn wrap_around_ranges_get_one_clear_message() {
        let e = |s: &str| parse_cron(s, Zone::Local).unwrap_err();
        assert_eq!(
            e("0 0 * * FRI-MON"),
            "day of week range FRI-MON runs backwards (ranges do not wrap around: write FRI-SAT,SUN-MON)"
        );
        assert_eq!(
            e("0 0 * * 5-1"),
            "day of week range 5-1 runs backwards (ranges do not wrap around: write 5-6,0-1)"
        );
        assert_eq!(
            e("0 0 * NOV-FEB *"),
            "month range NOV-FEB runs backwards (ranges do not wrap around: write NOV-DEC,JAN-FEB)"
        );
        assert_eq!(
            e("0 22-2 * * *"),
            "hour range 22-2 runs backwards (ranges do not wrap around: write 22-23,0-2)"
        );
        // Sunday as the end of a range is 7.
        let c = cron("0 0 * * SAT-SUN", "UTC");
        let f = fires(&c, utc(2026, 11, 30, 0, 0, 0), utc(2026, 12, 7, 0, 0, 0));
        let w: Vec<Weekday> = f.iter().map(|t| t.weekday()).collect();
        assert_eq!(w, [Weekday::Sat, Weekday::Sun]);
        assert!(parse_cron("0 0 * * fri-sun", Zone::Local).is_ok());
    }

    #[test]
    fn random_offset_stays_inside_the_period() {
        let period = Duration::from_secs(30);
        let mut seen_low = false;
        let mut seen_high = false;
        for _ in 0..1000 {
            let o = Offset::Random.resolve(period);
            assert!(o < period);
            seen_low |= o < Duration::from_secs(10);
            seen_high |= o > Duration::from_secs(20);
        }
        assert!(
            seen_low && seen_high,
            "offsets should spread over the period"
        );
        assert_eq!(
            Offset::Fixed(Duration::from_secs(5)).resolve(period),
            Duration::from_secs(5)
        );
    }
}
