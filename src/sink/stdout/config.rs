//! The `type: stdout` sink entry: its file shape ([`StdoutSinkSpec`]: only `retry`). Called
//! through the sinks' list (`sink::compile_kind`).

use serde::Deserialize;

use super::StdoutConfig;
use crate::sink::config::RetrySpec;
use crate::sink::kind::{Compile, KindSpec};

/// `type: stdout` settings.
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct StdoutSinkSpec {
    #[serde(default)]
    pub retry: RetrySpec,
}

impl KindSpec for StdoutSinkSpec {
    type Config = StdoutConfig;

    fn compile(self, cx: &mut Compile<'_, '_>) -> Option<StdoutConfig> {
        cx.retry = self.retry;
        Some(StdoutConfig)
    }
}
