//! The `type: file` sink entry: its file shape ([`FileSinkSpec`]) and its compilation into
//! [`FileConfig`] (the directory, read from the config file's directory; a missing one is an outage
//! at delivery, not a problem now). Called through the sinks' list (`sink::compile_kind`).

use serde::Deserialize;

use super::FileConfig;
use crate::sink::config::RetrySpec;
use crate::sink::kind::{Compile, KindSpec};

/// `type: file` settings.
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct FileSinkSpec {
    /// The directory. Relative paths are read from the config file's directory.
    pub path: String,
    #[serde(default)]
    pub retry: RetrySpec,
}

impl KindSpec for FileSinkSpec {
    type Config = FileConfig;

    fn compile(self, cx: &mut Compile<'_, '_>) -> Option<FileConfig> {
        let dir = cx.base.join(&self.path);
        if dir.exists() && !dir.is_dir() {
            cx.err.add(
                "path",
                format!("{} exists and is not a directory", dir.display()),
            );
        }
        // A missing directory is definite: no point in waiting for more failures.
        cx.link.down_after = 1;
        cx.retry = self.retry;
        Some(FileConfig { dir })
    }
}
