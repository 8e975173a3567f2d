//! colibri: a resident agent for edge machines. This crate is the whole agent; `main.rs` only calls
//! [`cli::main`]. See ARCHITECTURE.md for the map of modules and the invariants between them.

pub mod admin;
pub mod agent;
pub mod backoff;
pub mod cli;
pub mod clock;
pub mod config;
pub mod delivery;
pub mod files;
pub mod ingest;
pub mod link;
pub mod logging;
pub mod metrics;
pub mod net;
pub mod notify;
pub mod reload;
pub mod schedule;
pub mod scheduler;
pub mod scrape;
pub mod sink;
pub mod store;
pub mod tail;
pub mod task;
pub mod units;
pub mod zone;
