//! HTTP plumbing below every edge: [`server`] (the HTTP/1.1 server under the ingest API and the
//! admin endpoint: bind, accept), [`slots`] (the connection slots of a TCP listener, the idle one
//! closed for a newcomer: the HTTP server's and the syslog source's), [`token`] (the bearer token both listeners
//! check), [`tls_server`] (a listener's rustls settings from its `tls` block, replaceable by a
//! reload) [`tls_client`] (an outgoing connection's `tls` block and its rustls settings), `mqtt` (what
//! every MQTT connection has, the sink's and the source's) and [`client`] (what the `http` sink and the `http_scrape` task share: `User-Agent`,
//! rustls' provider, header and URL handling, error chains), and [`hostname`]. None of it knows
//! what a request means or what a sink is; `ingest`, `admin`, `sink` and `task` build on it.

pub mod client;
mod host;
#[cfg(feature = "mqtt")]
pub mod mqtt;
pub mod server;
pub mod slots;
pub mod tls_client;
pub mod tls_server;
pub mod token;

pub use host::hostname;
