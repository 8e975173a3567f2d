//! The next fire time of a crontab expression in a time zone, with cron(8)'s rules for the days a
//! zone skips or repeats an hour. croner parses the expression and says which dates, hours, minutes
//! and seconds match; this file owns what an instant is: how matching local times map to instants
//! across DST changes. `schedule` calls it, for the scheduler and for `colibri check` alike.
//!
//! The rule (Vixie cron, cronie): a job is *fixed-time* unless its second, minute or hour field
//! begins with `*` (`*`, `*/15`). A fixed-time job runs once per matching local time: at the first
//! instant that shows it (so once in a repeated hour), or, for a time a spring-forward skips, once at
//! the first instant after the gap. A *wildcard* job follows real elapsed time: it runs at every
//! instant whose local time matches (twice through a repeated hour, never in a skipped one).
//!
//! How: a local day is cut into pieces of constant UTC offset (at most a few; zones change at most
//! twice a year, never twice within 26 hours). In a piece, local time and instants map one to one,
//! so its first matching time after the bound is one bit-set walk. Pieces are taken in instant
//! order; a fixed-time job skips the local times an earlier piece already showed, and a gap between
//! two pieces fires at its end when it hides a matching time.

use chrono::{
    DateTime, Datelike, Duration, NaiveDate, NaiveDateTime, NaiveTime, Offset, TimeZone, Timelike,
    Utc,
};
use croner::{CronPattern, Weekday};

/// Days searched for a matching date: the Gregorian calendar repeats every 400 years, so a pattern
/// with no date in 400 years has none at all.
pub const SEARCH_DAYS: u32 = 146_097;

/// The most a zone's offset can be east (+14:00) or west (-12:00) of UTC, with a margin.
const EAST: i64 = 15 * 3600;
const WEST: i64 = 13 * 3600;
/// Offsets are sampled this far apart to find a day's transitions (never two within 26 hours).
const SAMPLE: i64 = 12 * 3600;

/// The hours, minutes and seconds a pattern allows, as bit sets.
#[derive(Debug, Clone, Copy)]
pub struct TimesOfDay {
    hours: u64,
    minutes: u64,
    seconds: u64,
}

impl TimesOfDay {
    pub fn of(p: &CronPattern) -> Self {
        TimesOfDay {
            hours: bits(24, |v| p.hour_match(v)),
            minutes: bits(60, |v| p.minute_match(v)),
            seconds: bits(60, |v| p.second_match(v)),
        }
    }

    /// The first allowed time of day at or after `t`, if one is left that day.
    fn first_from(&self, t: NaiveTime) -> Option<NaiveTime> {
        let (h0, m0, s0) = (t.hour(), t.minute(), t.second());
        let mut h = next_bit(self.hours, h0)?;
        loop {
            let mut m = next_bit(self.minutes, if h == h0 { m0 } else { 0 });
            while let Some(min) = m {
                let from = if h == h0 && min == m0 { s0 } else { 0 };
                if let Some(s) = next_bit(self.seconds, from) {
                    return NaiveTime::from_hms_opt(h, min, s);
                }
                m = next_bit(self.minutes, min + 1);
            }
            h = next_bit(self.hours, h + 1)?;
        }
    }
}

/// The values below `n` that `matches` takes, as a bit set.
fn bits<E>(n: u32, matches: impl Fn(u32) -> Result<bool, E>) -> u64 {
    (0..n)
        .filter(|v| matches(*v).unwrap_or(false))
        .fold(0, |b, v| b | 1 << v)
}

/// The lowest set bit at or above `from`.
fn next_bit(bits: u64, from: u32) -> Option<u32> {
    let rest = bits.checked_shr(from)?;
    (rest != 0).then(|| from + rest.trailing_zeros())
}

/// Whether the pattern's month and day fields (with their day-of-month / day-of-week rule) take `d`.
pub fn date_matches(p: &CronPattern, d: NaiveDate) -> bool {
    let weekday = Weekday::from_days_from_sunday(d.weekday().num_days_from_sunday());
    p.month_match(d.month()).unwrap_or(false)
        && p.day_match(d.year(), d.month(), d.day(), weekday)
            .unwrap_or(false)
}

/// The first date at or after `from` that the pattern takes, within [`SEARCH_DAYS`].
pub fn first_date(p: &CronPattern, from: NaiveDate) -> Option<NaiveDate> {
    let mut d = from;
    let end = from.checked_add_signed(Duration::days(i64::from(SEARCH_DAYS)))?;
    while d < end {
        if !p.month_match(d.month()).unwrap_or(false) {
            // The whole month is out: the first of the next one.
            let (y, m) = if d.month() == 12 {
                (d.year() + 1, 1)
            } else {
                (d.year(), d.month() + 1)
            };
            d = NaiveDate::from_ymd_opt(y, m, 1)?;
            continue;
        }
        if date_matches(p, d) {
            return Some(d);
        }
        d = d.succ_opt()?;
    }
    None
}

/// A span of instants `[from, to)` with one UTC offset (seconds east).
#[derive(Debug, Clone, Copy)]
struct Piece {
    from: i64,
    to: i64,
    offset: i64,
}

fn offset_at<Tz: TimeZone>(tz: &Tz, unix: i64) -> i64 {
    DateTime::from_timestamp(unix, 0).map_or(0, |t| {
        i64::from(
            tz.offset_from_utc_datetime(&t.naive_utc())
                .fix()
                .local_minus_utc(),
        )
    })
}

/// The pieces of constant offset covering `[from, to)`, in order.
fn pieces<Tz: TimeZone>(tz: &Tz, from: i64, to: i64) -> Vec<Piece> {
    let mut out = Vec::with_capacity(3);
    let mut start = from;
    let mut offset = offset_at(tz, from);
    let mut probe = from;
    while probe < to {
        let next = (probe + SAMPLE).min(to);
        let o = offset_at(tz, next);
        if o != offset {
            // One transition in (probe, next]: the first instant with the new offset.
            let (mut lo, mut hi) = (probe, next);
            while hi - lo > 1 {
                let mid = lo + (hi - lo) / 2;
                if offset_at(tz, mid) == offset {
                    lo = mid;
                } else {
                    hi = mid;
                }
            }
            out.push(Piece {
                from: start,
                to: hi,
                offset,
            });
            start = hi;
            offset = offset_at(tz, hi);
        }
        probe = next;
    }
    out.push(Piece {
        from: start,
        to,
        offset,
    });
    out
}

fn naive(unix: i64) -> NaiveDateTime {
    DateTime::from_timestamp(unix, 0).map_or(NaiveDateTime::MIN, |t| t.naive_utc())
}

fn unix(t: NaiveDateTime) -> i64 {
    t.and_utc().timestamp()
}

/// The first fire time strictly after `after` (see the module's rule), or `None` when no date
/// matches within [`SEARCH_DAYS`].
pub fn next_after<Tz: TimeZone>(
    p: &CronPattern,
    times: &TimesOfDay,
    fixed: bool,
    tz: &Tz,
    after: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    // An instant fires only if it is > after; in whole seconds, >= this.
    let bound = after.timestamp() + 1;
    let local_day = after.with_timezone(tz).date_naive();
    let last = local_day.checked_add_signed(Duration::days(i64::from(SEARCH_DAYS)))?;
    // From the day before: a piece of it can reach past `after` (a repeated hour at midnight).
    let mut day = local_day.pred_opt()?;
    while day <= last {
        day = first_date(p, day)?;
        if let Some(t) = first_on(day, times, fixed, tz, bound) {
            // Instants of the next local day come before the last ones of this one only when a
            // repeated hour straddles midnight: that day may hold an earlier one.
            let next = day.succ_opt()?;
            let t = match date_matches(p, next) {
                true => first_on(next, times, fixed, tz, bound).map_or(t, |n| n.min(t)),
                false => t,
            };
            return DateTime::from_timestamp(t, 0);
        }
        // Every matching time of this day is past, or skipped by a gap.
        day = day.succ_opt()?;
    }
    None
}

/// The first instant `>= bound` at which the pattern fires for a matching time of local `day`.
fn first_on<Tz: TimeZone>(
    day: NaiveDate,
    times: &TimesOfDay,
    fixed: bool,
    tz: &Tz,
    bound: i64,
) -> Option<i64> {
    let start = day.and_time(NaiveTime::MIN);
    let end = day.succ_opt()?.and_time(NaiveTime::MIN);
    let (day_start, day_end) = (unix(start), unix(end));
    // Every instant whose local time is on `day`.
    let parts = pieces(tz, day_start - EAST, day_end + WEST);
    // Local times (as naive seconds) already shown by an earlier piece.
    let mut shown = i64::MIN;
    let mut best: Option<i64> = None;
    let mut prev: Option<Piece> = None;
    for piece in parts {
        let (lo_local, hi_local) = (piece.from + piece.offset, piece.to + piece.offset);
        if fixed
            && let Some(before) = prev
            && before.offset < piece.offset
        {
            // A gap: local times [before.to + before.offset, lo_local) never show. A fixed-time job
            // due in it runs once, at the first instant after it.
            let (g0, g1) = (
                (before.to + before.offset).max(day_start),
                lo_local.min(day_end),
            );
            if g0 < g1 && piece.from >= bound && first_between(times, g0, g1).is_some() {
                best = Some(best.map_or(piece.from, |b| b.min(piece.from)));
            }
        }
        let mut lo = lo_local.max(day_start).max(bound + piece.offset);
        if fixed {
            lo = lo.max(shown);
        }
        let hi = hi_local.min(day_end);
        if lo < hi
            && let Some(t) = first_between(times, lo, hi)
        {
            let at = t - piece.offset;
            best = Some(best.map_or(at, |b| b.min(at)));
        }
        shown = shown.max(hi_local);
        prev = Some(piece);
    }
    best
}

/// The first allowed local time (naive seconds) in `[lo, hi)`, both on one day.
fn first_between(times: &TimesOfDay, lo: i64, hi: i64) -> Option<i64> {
    let t = naive(lo);
    let found = t.date().and_time(times.first_from(t.time())?);
    let at = unix(found);
    (at < hi).then_some(at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::zone::NamedZone;
    use croner::parser::{CronParser, Seconds};

    /// A compiled expression as `schedule` builds it, with its flags read off the fields.
    struct Expr {
        pattern: CronPattern,
        times: TimesOfDay,
        fixed: bool,
        step: i64,
    }

    fn expr(text: &str) -> Expr {
        let fields: Vec<&str> = text.split_whitespace().collect();
        let (time, days) = fields.split_at(fields.len() - 3);
        let star = |f: &str| f.starts_with(['*', '?']);
        let cron = CronParser::builder()
            .seconds(Seconds::Optional)
            .dom_and_dow(star(days[0]) || star(days[2]))
            .build()
            .parse(text)
            .unwrap_or_else(|e| panic!("{text}: {e}"));
        Expr {
            times: TimesOfDay::of(&cron.pattern),
            pattern: cron.pattern,
            fixed: !time.iter().any(|f| f.starts_with('*')),
            step: if fields.len() == 6 { 10 } else { 60 },
        }
    }

    fn matches(e: &Expr, local: i64) -> bool {
        let t = naive(local);
        date_matches(&e.pattern, t.date()) && e.times.first_from(t.time()) == Some(t.time())
    }

    /// The rule, by brute force over instants `step` apart: a wildcard job fires at every instant
    /// whose local time matches; a fixed-time job at the first instant showing a matching local
    /// time, or at the first instant after a gap that hid one.
    fn reference(e: &Expr, tz: &NamedZone, from: i64, to: i64) -> Vec<i64> {
        let mut out = Vec::new();
        let mut shown = from + offset_at(tz, from) - e.step;
        let mut u = from;
        while u < to {
            let local = u + offset_at(tz, u);
            let fire = if !e.fixed {
                matches(e, local)
            } else if local > shown {
                let hidden = (shown + e.step..local)
                    .step_by(e.step as usize)
                    .any(|l| matches(e, l));
                hidden || matches(e, local)
            } else {
                false
            };
            if fire {
                out.push(u);
            }
            shown = shown.max(local);
            u += e.step;
        }
        out
    }

    fn walk(e: &Expr, tz: &NamedZone, from: i64, to: i64) -> Vec<i64> {
        let mut out = Vec::new();
        let mut after = DateTime::from_timestamp(from - 1, 0).unwrap();
        for _ in 0..100_000 {
            match next_after(&e.pattern, &e.times, e.fixed, tz, after) {
                Some(t) if t.timestamp() < to => {
                    out.push(t.timestamp());
                    after = t;
                }
                _ => return out,
            }
        }
        panic!("too many fires")
    }

    /// The transitions of `tz` in 2026, by sampling every 6 hours.
    fn transitions(tz: &NamedZone) -> Vec<i64> {
        let start = 1_767_225_600; // 2026-01-01T00:00Z
        (0..4 * 365)
            .map(|i| start + i * 6 * 3600)
            .filter(|u| offset_at(tz, *u) != offset_at(tz, u + 6 * 3600))
            .collect()
    }

    /// Expressions whose fields are lists, ranges, steps and single values, in every position that
    /// DST touches, against the brute-force rule around every 2026 transition of zones that change
    /// by an hour at 02:00 (New York, Berlin), at midnight (Havana), by half an hour (Lord Howe),
    /// late in the evening (Nuuk) and by an hour on the other side of the world (Chatham).
    #[test]
    fn next_after_agrees_with_the_rule_by_brute_force_around_every_transition() {
        let minutes = ["0", "30", "0,30", "59", "15-45/15", "*/20", "*", "0-10"];
        let hours = [
            "1", "2", "0", "23", "1,3", "1-3", "2,3", "*", "*/2", "22-23",
        ];
        let days = [("*", "*"), ("*/2", "*"), ("*", "SUN"), ("1-7", "*")];
        let zones = [
            "America/New_York",
            "Europe/Berlin",
            "America/Havana",
            "Australia/Lord_Howe",
            "America/Nuuk",
            "Pacific/Chatham",
        ];
        let mut rng = fastrand::Rng::with_seed(14);
        let mut compared = 0;
        for zone in zones {
            let tz = NamedZone::load(zone).expect("Debian's tzdata is installed");
            let ts = transitions(&tz);
            assert!(!ts.is_empty(), "{zone}: no transition in 2026");
            for t in ts {
                for _ in 0..12 {
                    let (dom, dow) = days[rng.usize(..days.len())];
                    let m = minutes[rng.usize(..minutes.len())];
                    let h = hours[rng.usize(..hours.len())];
                    let text = if rng.bool() {
                        format!("{m} {h} {dom} * {dow}")
                    } else {
                        let s = ["0", "30", "*/20"][rng.usize(..3)];
                        format!("{s} {m} {h} {dom} * {dow}")
                    };
                    let e = expr(&text);
                    let (from, to) = (t - 2 * 86_400, t + 2 * 86_400);
                    let want = reference(&e, &tz, from, to);
                    let got = walk(&e, &tz, from, to);
                    assert_eq!(got, want, "{text:?} in {zone} around {t}");
                    // And from a few arbitrary moments: the first fire after each.
                    for _ in 0..4 {
                        let after = rng.i64(from..to - 3600);
                        let next = want.iter().copied().find(|w| *w > after);
                        let got = next_after(
                            &e.pattern,
                            &e.times,
                            e.fixed,
                            &tz,
                            DateTime::from_timestamp(after, 0).unwrap(),
                        )
                        .map(|d| d.timestamp());
                        if let Some(n) = next {
                            assert_eq!(got, Some(n), "{text:?} in {zone} after {after}");
                        }
                    }
                    compared += 1;
                }
            }
        }
        assert!(compared >= 100, "{compared}");
    }

    #[test]
    fn first_date_skips_months_and_finds_rare_dates() {
        let e = expr("0 0 29 2 *");
        let d = first_date(&e.pattern, NaiveDate::from_ymd_opt(2026, 3, 1).unwrap());
        assert_eq!(d, NaiveDate::from_ymd_opt(2028, 2, 29));
        assert_eq!(
            first_date(
                &expr("0 0 31 4 *").pattern,
                NaiveDate::MIN.succ_opt().unwrap()
            ),
            None
        );
    }
}
