//! Report by exception: which sampled values are worth appending. A value is sent when it is the
//! first of its series and field (since the task was made, or since a sampling failed), when it
//! moved more than its `deadband` from the value last sent (absolute, or a percent of that value;
//! any change for booleans and strings, and for numbers without a deadband), or when `heartbeat`
//! has passed since that was sent. What a sampling decides is applied only once its records are
//! stored ([`Exceptions::stored`]): a sampling whose append failed leaves nothing marked sent, and
//! a failed sampling forgets every value ([`Exceptions::failed`]), so the next good value goes out
//! whatever its distance. Owns the rules and the state of one task; it does not read values or
//! build records (its callers do: `task::modbus` per point, `task::scrape` per line-protocol
//! field). No clock: callers pass the time.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// How far a number must move from the value last sent to be sent again.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Deadband {
    Absolute(f64),
    /// Percent of the value last sent (of its magnitude): any change from 0.
    Percent(f64),
}

impl Deadband {
    /// Whether `now` moved more than the band from `last`.
    fn exceeded(self, last: f64, now: f64) -> bool {
        let moved = (now - last).abs();
        match self {
            Deadband::Absolute(b) => moved > b,
            Deadband::Percent(p) => moved > last.abs() * p / 100.0 || (last == 0.0 && moved > 0.0),
        }
    }
}

/// The rule of one value (a task's, or a point's or field's own).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Rule {
    pub deadband: Option<Deadband>,
    pub heartbeat: Option<Duration>,
}

impl Rule {
    /// Whether it filters at all: without a deadband or a heartbeat every value is sent.
    pub fn filters(&self) -> bool {
        self.deadband.is_some() || self.heartbeat.is_some()
    }

    /// This rule, with what `over` sets taking its place.
    pub fn with(self, over: Rule) -> Rule {
        Rule {
            deadband: over.deadband.or(self.deadband),
            heartbeat: over.heartbeat.or(self.heartbeat),
        }
    }
}

/// A sampled value as the filter compares it: a number, or anything else by equality.
#[derive(Debug, Clone, PartialEq)]
pub enum Sample {
    Number(f64),
    Other(String),
}

/// Which value: its series (a point's index, or a line's measurement and tags) and its field.
pub type Key = (String, String);

#[derive(Debug, Clone)]
struct Sent {
    value: Sample,
    at_ms: u64,
}

/// One task's values last sent; shared by its runs (runs of a task never overlap).
#[derive(Debug, Default)]
pub struct Exceptions {
    sent: Mutex<HashMap<Key, Sent>>,
}

/// What one sampling decided, applied once its records are stored.
#[derive(Debug, Default)]
pub struct Decided {
    updates: Vec<(Key, Sent)>,
    pub sent: u64,
    pub suppressed: u64,
}

impl Exceptions {
    /// Whether `value` of `key`, sampled at `now_ms`, is sent under `rule` (noted in `decided`).
    pub fn decide(
        &self,
        key: Key,
        value: Sample,
        rule: &Rule,
        now_ms: u64,
        decided: &mut Decided,
    ) -> bool {
        let send = {
            let sent = self
                .sent
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            sent.get(&key)
                .is_none_or(|last| worth_sending(last, &value, rule, now_ms))
        };
        if send {
            decided.sent += 1;
            decided.updates.push((
                key,
                Sent {
                    value,
                    at_ms: now_ms,
                },
            ));
        } else {
            decided.suppressed += 1;
        }
        send
    }

    /// The sampling's records are stored: what it sent is now the value last sent.
    pub fn stored(&self, decided: Decided) {
        let mut sent = self
            .sent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        sent.extend(decided.updates);
    }

    /// A sampling failed (a read error, a bad answer) or its records were not stored: every
    /// value's next sample is sent, whatever its distance.
    pub fn failed(&self) {
        self.sent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clear();
    }
}

fn worth_sending(last: &Sent, value: &Sample, rule: &Rule, now_ms: u64) -> bool {
    if let Some(h) = rule.heartbeat
        && now_ms.saturating_sub(last.at_ms) >= u64::try_from(h.as_millis()).unwrap_or(u64::MAX)
    {
        return true;
    }
    match (&last.value, value, rule.deadband) {
        (Sample::Number(a), Sample::Number(b), Some(band)) => band.exceeded(*a, *b),
        // Not NaN-safe by equality: a NaN is sent every time, which is what a reader wants to see.
        (a, b, _) => a != b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(f: &str) -> Key {
        ("s".into(), f.into())
    }

    fn run(x: &Exceptions, rule: &Rule, values: &[(u64, f64)]) -> Vec<f64> {
        let mut out = Vec::new();
        for &(at, v) in values {
            let mut d = Decided::default();
            if x.decide(key("v"), Sample::Number(v), rule, at, &mut d) {
                out.push(v);
            }
            x.stored(d);
        }
        out
    }

    #[test]
    fn an_absolute_deadband_sends_what_moved_more_than_it_from_the_last_sent() {
        let x = Exceptions::default();
        let rule = Rule {
            deadband: Some(Deadband::Absolute(1.0)),
            heartbeat: None,
        };
        // Drift of 0.4 each: sent when 1.0 from the last sent is passed, not from the last seen.
        let got = run(
            &x,
            &rule,
            &[(0, 10.0), (1, 10.4), (2, 10.8), (3, 11.2), (4, 11.0)],
        );
        assert_eq!(got, [10.0, 11.2]);
    }

    #[test]
    fn a_percent_deadband_is_of_the_last_value_sent_and_any_change_from_zero() {
        let x = Exceptions::default();
        let rule = Rule {
            deadband: Some(Deadband::Percent(5.0)),
            heartbeat: None,
        };
        let got = run(
            &x,
            &rule,
            &[(0, 100.0), (1, 104.0), (2, 106.0), (3, 0.0), (4, 0.001)],
        );
        assert_eq!(got, [100.0, 106.0, 0.0, 0.001]);
    }

    #[test]
    fn a_heartbeat_sends_an_unchanged_value_again() {
        let x = Exceptions::default();
        let rule = Rule {
            deadband: Some(Deadband::Absolute(1.0)),
            heartbeat: Some(Duration::from_secs(10)),
        };
        let got = run(
            &x,
            &rule,
            &[(0, 1.0), (9_999, 1.0), (10_000, 1.0), (15_000, 1.0)],
        );
        assert_eq!(got, [1.0, 1.0]);
    }

    #[test]
    fn what_was_not_stored_is_not_marked_sent_and_a_failure_forgets_every_value() {
        let x = Exceptions::default();
        let rule = Rule {
            deadband: Some(Deadband::Absolute(1.0)),
            heartbeat: None,
        };
        let mut d = Decided::default();
        assert!(x.decide(key("v"), Sample::Number(1.0), &rule, 0, &mut d));
        drop(d); // the append failed
        assert_eq!(run(&x, &rule, &[(1, 1.1)]), [1.1], "still the first");
        assert_eq!(run(&x, &rule, &[(2, 1.2)]), Vec::<f64>::new());
        x.failed();
        assert_eq!(run(&x, &rule, &[(3, 1.2)]), [1.2], "first after a failure");
    }

    #[test]
    fn other_values_are_sent_when_they_change() {
        let x = Exceptions::default();
        let rule = Rule {
            deadband: Some(Deadband::Absolute(5.0)),
            heartbeat: None,
        };
        let mut sent = Vec::new();
        for v in ["open", "open", "closed", "closed"] {
            let mut d = Decided::default();
            if x.decide(key("valve"), Sample::Other(v.into()), &rule, 0, &mut d) {
                sent.push(v);
            }
            x.stored(d);
        }
        assert_eq!(sent, ["open", "closed"]);
    }
}
