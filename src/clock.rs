//! Time as colibri sees it: the wall clock behind a trait (so tests can jump it), and a watcher that
//! learns from the kernel when the wall clock is *set* (an NTP step, an RTC reset on a box without a
//! battery, an operator's `date -s`) without polling: a `timerfd` armed with `TFD_TIMER_CANCEL_ON_SET`
//! wakes exactly then. Monotonic time is tokio's `Instant`, which tests pause and advance. Used by the
//! scheduler; nothing here decides what a jump means. [`unix_ns`] is the plain wall-clock reading the
//! ingest API and `queue push` stamp line-protocol points with; [`now_ms`] the one the store stamps
//! jobs, retries and expiry with.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::sync::Notify;

/// What the test seam (`timesync::FAKE_ENV`) adds to the wall clock: 0 unless a test set it.
static OFFSET_MS: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);

/// Moves colibri's wall clock by `ms` (the test seam of `timesync`, nothing else).
pub(crate) fn set_offset_ms(ms: i64) {
    OFFSET_MS.store(ms, std::sync::atomic::Ordering::Relaxed);
}

fn offset_ms() -> i64 {
    OFFSET_MS.load(std::sync::atomic::Ordering::Relaxed)
}

pub trait Clock: Send + Sync + 'static {
    fn wall(&self) -> DateTime<Utc>;
}

/// The real wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn wall(&self) -> DateTime<Utc> {
        Utc::now() + chrono::Duration::milliseconds(offset_ms())
    }
}

/// The wall clock as Unix milliseconds: 0 before 1970, saturating far in the future (the stamp on
/// jobs, retry times and TTLs, read by the store, its writer, delivery and `colibri queue`).
pub fn now_ms() -> u64 {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    ms.saturating_add_signed(offset_ms())
}

/// The wall clock as Unix nanoseconds, saturating outside 1677-2262 (the stamp the ingest API and
/// `queue push` give a line-protocol point that has none).
pub fn unix_ns() -> i64 {
    let ns = match std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_nanos()).unwrap_or(i64::MAX),
        Err(e) => i64::try_from(e.duration().as_nanos()).map_or(i64::MIN, |n| -n),
    };
    ns.saturating_add(offset_ms().saturating_mul(1_000_000))
}

/// Spawns a task that calls `notify.notify_one()` each time the wall clock is set. Returns an error
/// when the kernel lacks `timerfd` support; the scheduler then relies on its bounded sleeps.
pub fn watch_wall_clock(notify: Arc<Notify>) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let fd = arm_cancel_on_set_timer()?;
    // SAFETY: `fd` is an open OwnedFd moved into the AsyncFd, which keeps it open and returns the same
    // raw fd from every as_raw_fd() until it is dropped.
    let fd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }
        .map_err(std::io::Error::from)?;
    Ok(tokio::spawn(async move {
        loop {
            let Ok(mut guard) = fd.readable().await else {
                return;
            };
            let mut buf = [0u8; 8];
            // SAFETY: reads at most 8 bytes into a live 8-byte buffer from an fd we own.
            let n =
                unsafe { libc::read(fd.get_ref().as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n >= 0 {
                continue; // the far-future expiry itself; cannot happen for decades
            }
            match std::io::Error::last_os_error().raw_os_error() {
                Some(libc::ECANCELED) => {
                    notify.notify_one();
                    // The cancel disarms the timer; arm it again for the next jump.
                    if rearm(fd.get_ref()).is_err() {
                        return;
                    }
                }
                Some(libc::EAGAIN) => guard.clear_ready(),
                _ => return,
            }
        }
    }))
}

fn arm_cancel_on_set_timer() -> std::io::Result<OwnedFd> {
    // SAFETY: timerfd_create takes integer flags and returns a new fd or -1.
    let raw = unsafe {
        libc::timerfd_create(libc::CLOCK_REALTIME, libc::TFD_NONBLOCK | libc::TFD_CLOEXEC)
    };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `raw` is a freshly created fd that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    rearm(&fd)?;
    Ok(fd)
}

fn rearm(fd: &OwnedFd) -> std::io::Result<()> {
    let far = Utc::now().timestamp() + 100 * 365 * 86_400;
    let spec = libc::itimerspec {
        it_interval: libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        },
        it_value: libc::timespec {
            tv_sec: far as libc::time_t,
            tv_nsec: 0,
        },
    };
    // SAFETY: `spec` is a valid itimerspec on our stack; the old-value pointer may be null.
    let rc = unsafe {
        libc::timerfd_settime(
            fd.as_raw_fd(),
            libc::TFD_TIMER_ABSTIME | libc::TFD_TIMER_CANCEL_ON_SET,
            &spec,
            std::ptr::null_mut(),
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
pub mod testing {
    //! A wall clock that follows tokio's (pausable) monotonic clock plus an offset the test can jump.
    use super::*;
    use std::sync::Mutex;
    use tokio::time::Instant;

    pub struct FakeClock {
        origin: (Instant, DateTime<Utc>),
        jump: Mutex<chrono::Duration>,
    }

    impl FakeClock {
        pub fn starting_at(wall: DateTime<Utc>) -> Arc<Self> {
            Arc::new(FakeClock {
                origin: (Instant::now(), wall),
                jump: Mutex::new(chrono::Duration::zero()),
            })
        }
        pub fn jump(&self, by: chrono::Duration) {
            *self.jump.lock().unwrap() += by;
        }
    }

    impl Clock for FakeClock {
        fn wall(&self) -> DateTime<Utc> {
            let elapsed = Instant::now() - self.origin.0;
            self.origin.1
                + chrono::Duration::from_std(elapsed).unwrap()
                + *self.jump.lock().unwrap()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn watcher_arms_without_waking() {
        // Setting the real clock needs privileges and would disturb the machine; this checks that the
        // timer arms and stays quiet while the clock is left alone.
        let notify = Arc::new(Notify::new());
        let handle = watch_wall_clock(notify.clone()).expect("timerfd is available on Linux");
        let woke =
            tokio::time::timeout(std::time::Duration::from_millis(200), notify.notified()).await;
        assert!(woke.is_err(), "no clock change, no notification");
        handle.abort();
    }
}
