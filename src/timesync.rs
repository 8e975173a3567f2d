//! Whether the wall clock can be trusted: the kernel says whether an NTP client has synchronised it
//! (`adjtimex`: `TIME_ERROR` while it has not, as on a box without a real-time clock that started
//! at 1970 or at the last saved time). Owns the process-wide answer (the last one asked for, by
//! the agent's watcher, `/metrics` or `/readyz`; read by the store when it stamps the jobs of a `hold_until_clock_synced` stream), the
//! [`ClockStamp`] such a job carries (the boot it was appended in and the time since that boot,
//! which no clock step changes) and the [`Anchor`] that turns a stamp into true time once the
//! clock is synchronised. Deciding what to do with held records is the store's and the agent's.
//!
//! The test seam: `COLIBRI_FAKE_CLOCK=FILE` makes the file the kernel's answer (`synced`, or
//! `unsynced OFFSET_MS`) and moves colibri's wall clock ([`crate::clock::now_ms`], `unix_ns`) by
//! the offset while it says unsynced, as a box that started with a wrong clock and was then set
//! by NTP. Read at start and at every poll; never set in production.

use std::sync::atomic::{AtomicU8, Ordering::Relaxed};

use serde::{Deserialize, Serialize};

/// The environment variable naming the test seam's file.
pub const FAKE_ENV: &str = "COLIBRI_FAKE_CLOCK";

const UNKNOWN: u8 = 0;
const SYNCED: u8 = 1;
const UNSYNCED: u8 = 2;
static STATE: AtomicU8 = AtomicU8::new(UNKNOWN);

/// Where a job appended while the clock was unsynchronised was in time: which boot (a hash of the
/// kernel's boot id) and how long after it (`CLOCK_BOOTTIME`, which counts suspend and is never
/// set). Stored with the job (`format::Meta::V5`), so a restart keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClockStamp {
    pub boot: u64,
    pub boot_ms: u64,
}

/// The true Unix time of a boot's start, learnt once the clock is synchronised: a stamp of that
/// boot was appended at `epoch_ms + boot_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Anchor {
    pub boot: u64,
    pub epoch_ms: i64,
}

impl Anchor {
    /// The anchor of this boot, from the (synchronised) wall clock now.
    pub fn now() -> Anchor {
        let (boot, boot_ms) = here();
        Anchor {
            boot,
            epoch_ms: crate::clock::now_ms() as i64 - boot_ms as i64,
        }
    }

    /// How far off the wall clock was when a job with `stamp` was created at `created_ms` by that
    /// clock (true time minus recorded), or `None` for a stamp of another boot, whose time since
    /// boot says nothing now.
    pub fn offset_ms(&self, stamp: ClockStamp, created_ms: u64) -> Option<i64> {
        (stamp.boot == self.boot).then(|| self.epoch_ms + stamp.boot_ms as i64 - created_ms as i64)
    }
}

/// Whether the wall clock is synchronised, as last observed (`None` before the first look).
pub fn synced() -> Option<bool> {
    match STATE.load(Relaxed) {
        SYNCED => Some(true),
        UNSYNCED => Some(false),
        _ => None,
    }
}

/// The stamp for a job appended now to a stream that holds its records until the clock is
/// synchronised: `None` when it is (or was never looked at: the agent looks before it starts).
pub fn stamp_if_unsynced() -> Option<ClockStamp> {
    (synced() == Some(false)).then(|| {
        let (boot, boot_ms) = here();
        ClockStamp { boot, boot_ms }
    })
}

/// Sets the answer without asking (unit tests of the stamping, which run in one process).
#[cfg(test)]
pub(crate) fn force(synced: bool) {
    STATE.store(if synced { SYNCED } else { UNSYNCED }, Relaxed);
}

/// Asks the kernel (or the test seam) now and remembers the answer; returns it.
pub fn observe() -> bool {
    let synced = match std::env::var_os(FAKE_ENV) {
        Some(file) => fake(std::path::Path::new(&file)),
        None => kernel_synced(),
    };
    STATE.store(if synced { SYNCED } else { UNSYNCED }, Relaxed);
    synced
}

/// The kernel's word: `adjtimex` returns `TIME_ERROR` while the clock is not synchronised (the
/// `STA_UNSYNC` status an NTP client clears). A kernel that refuses the call counts as synced:
/// nothing is held on a guess.
fn kernel_synced() -> bool {
    // SAFETY: a zeroed `timex` is a valid argument; `modes` 0 only reads the kernel's state into it.
    let rc = unsafe {
        let mut t: libc::timex = std::mem::zeroed();
        libc::adjtimex(&mut t)
    };
    rc != libc::TIME_ERROR
}

/// The test seam's file: `synced`, or `unsynced OFFSET_MS` (the wall clock's error meanwhile). An
/// unreadable file leaves everything as it was last read.
fn fake(file: &std::path::Path) -> bool {
    let Ok(text) = std::fs::read_to_string(file) else {
        return synced().unwrap_or(true);
    };
    let mut words = text.split_whitespace();
    let unsynced = words.next() == Some("unsynced");
    let offset = words.next().and_then(|w| w.parse::<i64>().ok());
    crate::clock::set_offset_ms(if unsynced { offset.unwrap_or(0) } else { 0 });
    !unsynced
}

/// This boot (a hash of `/proc/sys/kernel/random/boot_id`, 0 when it cannot be read) and the
/// milliseconds since it.
fn here() -> (u64, u64) {
    (boot_id(), boot_ms())
}

fn boot_id() -> u64 {
    static ID: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *ID.get_or_init(|| {
        std::fs::read("/proc/sys/kernel/random/boot_id")
            .map_or(0, |b| crate::files::fnv1a(b.trim_ascii()))
    })
}

fn boot_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec on our stack for the call to write into.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    if rc != 0 {
        return 0;
    }
    (ts.tv_sec as u64).saturating_mul(1000) + (ts.tv_nsec as u64) / 1_000_000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_anchor_gives_the_offset_of_its_own_boot_only() {
        let a = Anchor {
            boot: 7,
            epoch_ms: 1_000_000,
        };
        let stamp = ClockStamp {
            boot: 7,
            boot_ms: 5_000,
        };
        // Appended 5 s after a boot that truly began at 1,000,000, recorded as 3,000.
        assert_eq!(a.offset_ms(stamp, 3_000), Some(1_002_000));
        assert_eq!(a.offset_ms(ClockStamp { boot: 8, ..stamp }, 3_000), None);
    }

    #[test]
    fn this_boot_is_known_and_its_time_moves_forward() {
        let (b1, t1) = here();
        let (b2, t2) = here();
        assert_eq!(b1, b2);
        assert_ne!(b1, 0, "boot id readable on linux");
        assert!(t2 >= t1 && t1 > 0);
    }
}
