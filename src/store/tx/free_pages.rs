//! The database file's free pages as free space for `storage.min_free`: counting them (redb's
//! statistics and the file's allocated blocks), the throttle that keeps counting off the append
//! path, and the figure a transaction counts down. Used by [`super::Tx::below_min_free`]; the
//! store keeps one [`FreePages`].

use std::path::Path;

use redb::WriteTransaction;

use crate::store::error::StoreError;

/// The database file's free pages that occupy disk: space redb fills before it grows the file,
/// so it counts as free for `storage.min_free`. It is the file's allocated blocks (a sparse
/// file's holes are not free space: writing them takes disk) less redb's allocated pages.
///
/// Counting asks redb for its statistics, which walk every table's tree and so read the whole
/// backlog (measured: `store/tests/free_pages.rs`); an append must not pay that. So the count is
/// made only when the disk alone would refuse an append, kept, counted down by what later
/// transactions append, and made again only after a commit (which may have freed pages) and
/// once 20 times as long as it is expected to take has passed: counting takes at most about 5 %
/// of the writer's time however large the backlog. What a count takes is expected from the last
/// one, in proportion to the bytes queued then and now: so when the backlog has drained (the
/// moment the count matters, producers having been refused while it waited) the next count is
/// made at once, however long the last one took over the full backlog. Between counts the figure
/// errs low: pages freed since are not in it.
#[derive(Debug)]
pub(in crate::store) struct FreePages {
    /// Bytes, as last counted and counted down since.
    bytes: u64,
    /// A commit since the last count may have freed pages.
    stale: bool,
    /// The last count: when it ended, what it took, and the bytes queued then (the throttle).
    last: Option<(std::time::Instant, std::time::Duration, u64)>,
    /// Counts made, and what the last one took (tests check that appends do not each make one,
    /// and measure).
    pub(in crate::store) counts: u64,
    pub(in crate::store) last_took: std::time::Duration,
}

/// What a commit writes besides its jobs, at most in practice (about 50 KB, see `page_fit`): free
/// pages count towards `min_free` only beyond it.
pub(in crate::store) const COMMIT_PAGES: u64 = 64 << 10;

/// The throttle of [`FreePages`]: the wait after a count, in multiples of what it took.
const COUNT_DUTY: u32 = 20;

impl FreePages {
    pub(in crate::store) fn new() -> Self {
        FreePages {
            bytes: 0,
            stale: true,
            last: None,
            counts: 0,
            last_took: std::time::Duration::ZERO,
        }
    }

    /// The free pages' bytes: counted now in `txn` when the last count is stale and the
    /// throttle allows, otherwise the last figure. `queued`: the bytes of jobs in the store.
    pub(super) fn get(&mut self, txn: &WriteTransaction, path: &Path, queued: u64) -> u64 {
        let now = std::time::Instant::now();
        if !self.stale {
            return self.bytes;
        }
        if let Some((ended, took, then)) = self.last {
            // The tree walked is the backlog; a megabyte stands for what does not shrink with it.
            const FLOOR: u64 = 1 << 20;
            let ratio = (queued + FLOOR) as f64 / (then + FLOOR) as f64;
            let expected = took.mul_f64(ratio.min(1e6));
            if now < ended + expected * COUNT_DUTY {
                return self.bytes;
            }
        }
        let counted = count_free_pages(txn, path);
        let took = now.elapsed();
        self.counts += 1;
        self.last_took = took;
        self.last = Some((std::time::Instant::now(), took, queued));
        match counted {
            Ok(n) => {
                self.bytes = n;
                self.stale = false;
            }
            // Not counted: none are assumed (the disk alone decides, as before).
            Err(e) => {
                tracing::debug!(error = %e, "cannot count the store file's free pages");
                self.bytes = 0;
            }
        }
        self.bytes
    }

    /// A transaction committed: what it appended was taken from `left` (when it counted), and
    /// what it removed may have freed pages.
    pub(super) fn committed(&mut self, left: Option<u64>) {
        if let Some(left) = left {
            self.bytes = left;
        }
        self.stale = true;
    }
}

/// The file's allocated blocks less redb's allocated pages (see [`FreePages`]).
fn count_free_pages(txn: &WriteTransaction, path: &Path) -> Result<u64, StoreError> {
    use std::os::unix::fs::MetadataExt;
    let stats = txn.stats()?;
    let used = stats.allocated_pages() * stats.page_size() as u64;
    let on_disk = std::fs::metadata(path)?.blocks() * 512;
    Ok(on_disk.saturating_sub(used))
}
