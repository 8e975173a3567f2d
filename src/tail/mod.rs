//! Log tailing (not built yet: a stub that issue 5 replaces).

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TailConfig {
    pub name: String,
    pub stream: String,
    pub paths: Vec<String>,
}

impl TailConfig {
    /// For `colibri check`.
    pub fn describe(&self) -> String {
        format!("tail {} -> {}", self.paths.join(", "), self.stream)
    }
}

/// Follows the files of one source until `stopping`.
pub async fn run(
    _config: std::sync::Arc<TailConfig>,
    _store: crate::store::writer::StoreHandle,
    _stopping: tokio_util::sync::CancellationToken,
) {
}
