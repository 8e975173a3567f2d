//! Report by exception as the sampling tasks' entries write it (`deadband`, `heartbeat`, for the
//! task and for a point or field of its own) and its compilation into
//! [`crate::scrape::exception::Rule`]. Shared by the `http_scrape` and `modbus` entries (below
//! both, as an edge never imports another); the filtering itself is `scrape::exception`'s.

use serde::Deserialize;

use crate::scrape::exception::{Deadband, Rule};
use crate::shape::Problems;
use crate::shape::scalar::Scalar;
use crate::shape::units::Dur;

/// A deadband as a config file writes it: a number (absolute) or a string (`"2%"`: of the value
/// last sent), read as its text (not an untagged enum: serde's buffering for one costs the
/// binary tens of KB).
pub type DeadbandSpec = Scalar;

/// A value's own `deadband` and `heartbeat`, over the task's.
#[derive(Debug, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    /// A number is sent when it moved more than this from the value last sent: absolute
    /// (`0.5`) or a percent of that value (`"2%"`). Booleans and strings are sent when they change.
    #[serde(default)]
    pub deadband: Option<DeadbandSpec>,
    /// A value is sent anyway when this long has passed since it was last sent.
    #[serde(default)]
    pub heartbeat: Option<Dur>,
}

/// The rule `deadband` and `heartbeat` make; problems are reported under their names.
pub fn compile(
    deadband: Option<&DeadbandSpec>,
    heartbeat: Option<Dur>,
    err: &mut Problems<'_>,
) -> Rule {
    let deadband = deadband.and_then(|d| match parse(d) {
        Ok(b) => Some(b),
        Err(m) => {
            err.add("deadband", m);
            None
        }
    });
    if heartbeat.is_some_and(|h| h.0.is_zero()) {
        err.add("heartbeat", "must be positive".into());
    }
    Rule {
        deadband,
        heartbeat: heartbeat.map(|h| h.0),
    }
}

/// `0.5` (absolute) or `"2%"` (percent); the error says what is expected.
fn parse(spec: &DeadbandSpec) -> Result<Deadband, String> {
    let s = spec.0.trim();
    let pct = s.strip_suffix('%').map(str::trim);
    let band = match (pct.map(str::parse::<f64>), s.parse::<f64>()) {
        (Some(Ok(p)), _) => Deadband::Percent(p),
        (None, Ok(v)) => Deadband::Absolute(v),
        _ => {
            return Err(format!(
                "{:?}: a number (absolute, 0.5) or a percent of the value last sent (\"2%\")",
                spec.0
            ));
        }
    };
    match band {
        Deadband::Absolute(v) | Deadband::Percent(v) if !(v.is_finite() && v >= 0.0) => {
            Err(format!("{v}: must be a finite number, 0 or more"))
        }
        b => Ok(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadbands_are_read_as_numbers_or_percents() {
        let p = |s: &str| parse(&Scalar(s.into()));
        assert_eq!(p("0.5"), Ok(Deadband::Absolute(0.5)));
        assert_eq!(p("2%"), Ok(Deadband::Percent(2.0)));
        assert_eq!(p(" 1.5 "), Ok(Deadband::Absolute(1.5)));
        assert!(p("lots").unwrap_err().contains("a percent"));
        assert!(p("true").unwrap_err().contains("a percent"));
        assert!(p("-1").unwrap_err().contains("0 or more"));
    }
}
