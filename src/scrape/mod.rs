//! Scraped HTTP responses into InfluxDB line-protocol records: the Prometheus text exposition
//! format ([`prometheus`]), JSON documents through an operator's mapping ([`json`]), and the line
//! protocol writer both use ([`lineproto`]), and which sampled values are worth sending
//! ([`exception`], for `http_scrape` and `modbus`). Pure and synchronous: no I/O, no clock (the caller
//! passes the scrape time), no config parsing. A malformed response is an error for the whole
//! response and leaves nothing behind in the caller's output, so a scrape is stored whole or not at
//! all. Called by the `http_scrape` task handler (`task::scrape`), which fetches the body (bounded),
//! appends the records to its stream and counts failed scrapes.

pub mod downsample;
pub mod exception;
pub mod json;
pub mod lineparse;
pub mod lineproto;
pub mod prometheus;
