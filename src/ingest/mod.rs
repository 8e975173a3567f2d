//! The local ingest API (not built yet: a stub that issue 5 replaces).

use std::net::SocketAddr;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IngestConfig {
    pub listen: SocketAddr,
}

impl IngestConfig {
    /// For `colibri check`.
    pub fn describe(&self) -> String {
        format!("http://{}", self.listen)
    }
}

/// Binds the listener (an error here stops colibri's start) and serves until `stopping`.
pub async fn start(
    _config: IngestConfig,
    _store: crate::store::writer::StoreHandle,
    _stopping: tokio_util::sync::CancellationToken,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    Ok(tokio::spawn(async {}))
}
