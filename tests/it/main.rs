//! The integration tests: one test binary (as ripgrep's `tests/tests.rs`), a module per area, and
//! the helpers they share in `util` (a scratch directory and the real `colibri` binary as a child
//! process, bounded polls, a controllable HTTP receiver, a raw HTTP/1.1 client, an endpoint to
//! scrape). Every test drives the binary as a user would: files, signals, sockets, real servers.
//! One binary links once and shares one pool of test threads; `cargo test --test it tail::` runs
//! one area.

#![allow(
    clippy::too_many_lines,
    reason = "a scenario reads top to bottom as the story it checks; the 100-line bound is the product's"
)]

mod util;

mod architecture;
mod cli;
mod clock;
mod compression;
mod delivery;
mod downsample;
mod exec_stream;
mod file_move;
mod ingest;
mod kafka;
mod lanes;
mod layers;
mod link;
mod listeners;
mod live;
mod log_file;
mod log_summary;
mod man;
mod modbus;
mod mqtt;
mod mqtt_source;
mod nats;
mod opcua;
mod operate;
mod receiver;
mod remote_write;
mod salvage;
mod scrape;
mod ship;
mod sparkplug;
mod store;
mod syslog;
mod tail;
mod tsdb;
