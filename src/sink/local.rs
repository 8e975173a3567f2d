//! What the sinks that write on this machine (`file`, `stdout`) share beyond `Deliver`'s defaults
//! (a record per line, one write at a time): blocking writes run off the event loop, and a spooled
//! file copied out whole with its failures classified. Each sink's own writing is in its file;
//! called by the `file` and `stdout` sinks.

use std::path::Path;

use super::deliver::DeliveryError;

/// Runs `write` on the blocking pool (a stat of a stale network mount, or a stdout nobody reads,
/// can block for minutes); a writer that panicked may pass (`what` names the sink).
pub(super) async fn off_the_loop<T: Send + 'static>(
    what: &str,
    write: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> Result<std::io::Result<T>, DeliveryError> {
    tokio::task::spawn_blocking(write)
        .await
        .map_err(|e| DeliveryError::transient(format!("{what}: writer stopped: {e}")))
}

/// A file job's delivery to a local sink: a missing spooled file is permanent, a missing
/// directory an outage, anything else may pass.
pub(super) fn spooled_outcome(
    what: &str,
    r: std::io::Result<()>,
    src: &Path,
) -> Result<(), DeliveryError> {
    match r {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !src.exists() => Err(
            DeliveryError::Permanent(format!("the spooled file {} is missing", src.display())),
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(DeliveryError::Unavailable(format!("{what}: {e}")))
        }
        Err(e) => Err(DeliveryError::transient(format!("{what}: {e}"))),
    }
}

/// Copies at most the first `len` bytes of the file at `src` into `out`; returns how many.
pub(super) fn copy_prefix(
    src: &Path,
    len: u64,
    out: &mut impl std::io::Write,
) -> std::io::Result<u64> {
    let mut input = std::fs::File::open(src)?;
    std::io::copy(&mut std::io::Read::take(&mut input, len), out)
}

/// An error when fewer than `len` bytes (`n`) were copied: the spooled file shrank.
pub(super) fn short(n: u64, len: u64) -> std::io::Result<()> {
    if n < len {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!(
                "the spooled file ended {} bytes short of its recorded length",
                len - n
            ),
        ));
    }
    Ok(())
}
