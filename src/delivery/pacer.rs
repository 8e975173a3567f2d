//! A sink's replay pacing: a token bucket over request bytes ([`Pacer`]) that the workers of
//! every stream of the sink share while a backlog drains (`replay_rate`), and the wait it imposes
//! ([`pace`]). It knows nothing of jobs or sinks. Built by `SinkRuntime::new`; awaited before a
//! request by `job`.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A token bucket over request bytes: a request may start when the bucket is not in debt, and then
/// takes its size (so one large request never waits forever, and the average rate holds).
pub(super) struct Pacer {
    rate: f64,
    tokens: f64,
    refilled_at: Instant,
}

impl Pacer {
    pub(super) fn new(bytes_per_sec: u64) -> Pacer {
        Pacer {
            rate: bytes_per_sec as f64,
            tokens: bytes_per_sec as f64,
            refilled_at: Instant::now(),
        }
    }

    /// How long to wait before a request may start; `None`: start now (and `bytes` are taken).
    fn admit(&mut self, bytes: u64, now: Instant) -> Option<Duration> {
        let elapsed = now
            .saturating_duration_since(self.refilled_at)
            .as_secs_f64();
        self.refilled_at = now;
        self.tokens = (self.tokens + elapsed * self.rate).min(self.rate);
        if self.tokens < 0.0 {
            return Some(Duration::from_secs_f64(-self.tokens / self.rate));
        }
        self.tokens -= bytes as f64;
        None
    }
}

/// Takes `bytes` from the bucket without waiting (it may go into debt): a request that goes ahead
/// of those the pacer holds back, whose wait grows by it.
pub(super) fn charge(p: &Mutex<Pacer>, bytes: u64) {
    let mut p = p.lock().expect("never poisoned: no panics while held");
    p.admit(0, Instant::now());
    p.tokens -= bytes as f64;
}

/// Waits until the pacer admits a request of `bytes`.
pub(super) async fn pace(p: &Mutex<Pacer>, bytes: u64) {
    loop {
        let wait = p
            .lock()
            .expect("never poisoned: no panics while held")
            .admit(bytes, Instant::now());
        match wait {
            None => return,
            Some(d) => tokio::time::sleep(d).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pacer_holds_the_average_rate_and_never_starves_a_large_request() {
        let t0 = Instant::now();
        let mut p = Pacer::new(1000);
        // A full bucket lets the first request through, even one larger than a second's worth.
        assert_eq!(p.admit(3000, t0), None);
        // Now 2000 bytes in debt: two seconds until the next may start.
        let wait = p.admit(10, t0).unwrap();
        assert!((wait.as_secs_f64() - 2.0).abs() < 1e-6, "{wait:?}");
        assert!(p.admit(10, t0 + Duration::from_millis(1999)).is_some());
        assert_eq!(p.admit(500, t0 + Duration::from_millis(2000)), None);
        // Over a long run the bytes admitted track the rate.
        let mut admitted = 0u64;
        let mut now = t0 + Duration::from_secs(3);
        let end = now + Duration::from_secs(100);
        while now < end {
            match p.admit(250, now) {
                None => admitted += 250,
                Some(d) => now += d,
            }
        }
        assert!((99_000..=101_500).contains(&admitted), "{admitted}");
    }
}
