//! The two lanes of a `live_first` stream (see [`Replay`]): where the live lane begins in the
//! ready table, and which lane a take serves. A lane is an order of taking, not a copy: jobs, ids
//! and keys stay as they are. The ready table is keyed by id, in append order, so the live lane is
//! its tail; its boundary only moves forward as jobs age, so finding it reads each job's header
//! about once. It does not hand out or settle jobs: `tx::deliver`'s `take` does, asking this file
//! which lane and where. Kept in memory with the stream's state; after a restart it is found again
//! from the jobs' creation times.
//!
//! [`Replay`]: super::Replay

use redb::ReadableTable;

use super::error::StoreError;
use super::format;

/// The jobs a take hands out, in id order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Lane {
    /// Ids from the boundary on: younger than the live window.
    Live,
    /// Ids below the boundary: older.
    Backlog,
}

/// Most headers read to move the boundary in one take: a take holds the writer, and a boundary
/// that lags behind only lets a few aged jobs be taken as live, oldest first.
const BOUNDARY_STEP: usize = 1024;

#[derive(Debug, Default)]
pub(super) struct Lanes {
    /// Every ready job below this id was older than the live window at some take. Only grows
    /// (time moves on); `None` until a take finds it from the newest job backwards.
    boundary: Option<u64>,
    /// Bytes taken from each lane while both had jobs waiting: the backlog's share is kept from
    /// them.
    live_bytes: u64,
    backlog_bytes: u64,
}

impl Lanes {
    /// The first id of the live lane at `cutoff_ms` (jobs created before it are backlog).
    pub(super) fn boundary(
        &mut self,
        ready: &impl ReadableTable<u64, &'static [u8]>,
        cutoff_ms: u64,
    ) -> Result<u64, StoreError> {
        let young = |v: &[u8]| format::header(v).is_ok_and(|h| h.created_ms >= cutoff_ms);
        let b = match self.boundary {
            Some(mut b) => {
                for e in ready.range(b..)?.take(BOUNDARY_STEP) {
                    let (k, v) = e?;
                    if young(v.value()) {
                        break;
                    }
                    b = k.value() + 1;
                }
                b
            }
            None => {
                // The live lane is what arrived within the window: few jobs, read from the end.
                let Some(last) = ready.last()? else {
                    return Ok(0);
                };
                let mut b = last.0.value() + 1;
                for e in ready.iter()?.rev() {
                    let (k, v) = e?;
                    if !young(v.value()) {
                        break;
                    }
                    b = k.value();
                }
                b
            }
        };
        self.boundary = Some(b);
        Ok(b)
    }

    /// The lane to take from, given which have jobs to hand out: the live one first, the backlog
    /// when it is alone or below its `share` of what both were given.
    pub(super) fn choose(&self, share: f64, backlog: bool, live: bool) -> Option<Lane> {
        match (backlog, live) {
            (false, false) => None,
            (true, false) => Some(Lane::Backlog),
            (false, true) => Some(Lane::Live),
            (true, true) => {
                let total = (self.live_bytes + self.backlog_bytes) as f64;
                if (self.backlog_bytes as f64) < share * total {
                    Some(Lane::Backlog)
                } else {
                    Some(Lane::Live)
                }
            }
        }
    }

    /// `bytes` were taken from `lane`; `contended`: the other lane had jobs waiting too. Only
    /// contended takes count towards the share, and the count starts again once a lane is
    /// empty: a backlog that drained alone for an hour earns no credit against the present.
    pub(super) fn taken(&mut self, lane: Lane, bytes: u64, contended: bool) {
        if !contended {
            self.live_bytes = 0;
            self.backlog_bytes = 0;
            return;
        }
        match lane {
            Lane::Live => self.live_bytes += bytes,
            Lane::Backlog => self.backlog_bytes += bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_live_lane_goes_first_and_the_backlog_keeps_its_share() {
        let mut l = Lanes::default();
        assert_eq!(l.choose(0.25, false, false), None);
        assert_eq!(l.choose(0.25, true, false), Some(Lane::Backlog));
        assert_eq!(l.choose(0.25, false, true), Some(Lane::Live));
        // Both waiting, nothing given yet: the present first.
        assert_eq!(l.choose(0.25, true, true), Some(Lane::Live));
        // A busy present: over many takes the backlog gets a quarter of the bytes.
        let (mut live, mut backlog) = (0u64, 0u64);
        for _ in 0..1000 {
            let lane = l.choose(0.25, true, true).unwrap();
            l.taken(lane, 100, true);
            match lane {
                Lane::Live => live += 100,
                Lane::Backlog => backlog += 100,
            }
        }
        let share = backlog as f64 / (live + backlog) as f64;
        assert!((0.24..=0.26).contains(&share), "{share}");
        // An uncontended take starts the count again.
        l.taken(Lane::Backlog, 1 << 20, false);
        assert_eq!(l.choose(0.25, true, true), Some(Lane::Live));
    }
}
