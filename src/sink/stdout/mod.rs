//! The `stdout` sink: records written to colibri's standard output, a record per line (a spooled
//! file as its bytes), flushed before the job counts as delivered. For trying a pipeline out and for
//! a supervisor that reads the output; nothing to probe. Its file shape is [`config`]'s. Built by
//! `sink::Sink::new`.

use std::io::Write;

use super::SinkConfig;
use super::deliver::{Batch, Deliver, DeliveryError, Probe};
use super::kind::{KindConfig, Settings};
use super::local;
use crate::setting::SettingError;
use crate::store::FileJob;
pub use config::StdoutSinkSpec as Spec;

mod config;

/// The compiled `type: stdout` settings: there are none of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StdoutConfig;

impl Settings for StdoutConfig {
    fn describe(&self, name: &str) -> String {
        describe(name)
    }
}

impl KindConfig for StdoutConfig {
    type Built = StdoutSink;

    fn build(&self, sink: &SinkConfig) -> Result<StdoutSink, SettingError> {
        Ok(StdoutSink::new(&sink.name))
    }
}

/// For logs: the sink's type and name.
fn describe(name: &str) -> String {
    format!("stdout sink {name}")
}

/// The stdout sink, ready to write.
pub struct StdoutSink {
    /// [`describe`]'s line, for failure reasons.
    shown: String,
}

impl StdoutSink {
    pub fn new(name: &str) -> StdoutSink {
        StdoutSink {
            shown: describe(name),
        }
    }
}

impl Deliver for StdoutSink {
    async fn send(&self, _batch: &Batch<'_>, body: Vec<u8>) -> Result<(), DeliveryError> {
        local::off_the_loop(&self.shown, move || {
            let mut out = std::io::stdout().lock();
            out.write_all(&body)?;
            out.flush()
        })
        .await?
        .map_err(|e| DeliveryError::transient(format!("{}: {e}", self.shown)))
    }

    /// Writes a file job's file, as its bytes.
    async fn send_file(&self, _batch: &Batch<'_>, file: &FileJob) -> Result<(), DeliveryError> {
        let (src, len) = (file.path.clone(), file.len);
        let written = local::off_the_loop(&self.shown, move || {
            let mut out = std::io::stdout().lock();
            let n = local::copy_prefix(&src, len, &mut out)?;
            out.flush()?;
            local::short(n, len)
        })
        .await?;
        local::spooled_outcome(&self.shown, written, &file.path)
    }

    /// Standard output is always there.
    async fn probe(&self, _how: &Probe) -> Result<(), String> {
        Ok(())
    }
}
