//! colibri: a resident agent for edge machines. This crate is the whole agent; `main.rs` only calls
//! [`cli::main`]. See ARCHITECTURE.md for the map of modules and the invariants between them.

pub(crate) mod admin;
pub(crate) mod agent;
pub(crate) mod backoff;
pub mod cli;
pub mod clock;
pub(crate) mod clock_hold;
pub mod config;
pub(crate) mod counters;
pub(crate) mod delivery;
pub(crate) mod files;
pub(crate) mod link;
pub(crate) mod logging;
pub(crate) mod memory;
pub(crate) mod metrics;
pub(crate) mod net;
pub(crate) mod notify;
pub(crate) mod paused;
pub(crate) mod record;
pub(crate) mod reload;
pub(crate) mod schedule;
pub(crate) mod scheduler;
pub mod scrape;
pub(crate) mod setting;
pub(crate) mod shape;
pub(crate) mod sink;
pub(crate) mod source;
pub mod store;
pub(crate) mod task;
pub mod timesync;
pub(crate) mod units;
pub(crate) mod zone;
