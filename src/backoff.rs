//! The retry delay as a pure function of the attempt number: `base * 2^attempt * (0.5 + r)`, capped,
//! where `r` is uniform in `[0, 1)`. Pure so that persisted retries (a due time stored on disk) and
//! task retries share one formula and tests can pin `r`. Called by `task::run` and, later, by delivery.

use std::time::Duration;

/// The delay before retry number `attempt` (0 for the first retry), with the jitter `r` in `[0, 1)`.
pub fn delay(attempt: u32, base: Duration, cap: Duration, r: f64) -> Duration {
    let factor = 2f64.powi(attempt.min(1024) as i32) * (0.5 + r.clamp(0.0, 1.0));
    let secs = base.as_secs_f64() * factor;
    if !secs.is_finite() || secs >= cap.as_secs_f64() {
        cap
    } else {
        Duration::from_secs_f64(secs)
    }
}

/// [`delay`] with a fresh random jitter.
pub fn jittered(attempt: u32, base: Duration, cap: Duration) -> Duration {
    delay(attempt, base, cap, fastrand::f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn doubles_with_jitter_between_half_and_one_and_a_half() {
        assert_eq!(delay(0, S, Duration::from_secs(60), 0.5), S);
        assert_eq!(
            delay(3, S, Duration::from_secs(60), 0.5),
            Duration::from_secs(8)
        );
        assert_eq!(
            delay(2, S, Duration::from_secs(60), 0.0),
            Duration::from_secs(2)
        );
        assert_eq!(
            delay(2, S, Duration::from_secs(60), 1.0),
            Duration::from_secs(6)
        );
    }

    #[test]
    fn capped_and_never_overflows() {
        let cap = Duration::from_secs(300);
        assert_eq!(delay(20, S, cap, 0.5), cap);
        assert_eq!(delay(u32::MAX, S, cap, 0.99), cap);
        for a in 0..64 {
            let d = jittered(a, Duration::from_millis(100), cap);
            assert!(d <= cap);
            assert!(d >= Duration::from_millis(50).min(cap));
        }
    }
}
