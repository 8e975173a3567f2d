//! What every MQTT connection of colibri's has, whichever edge makes it (the `mqtt` sink, the
//! `mqtt` source): the MQTT 5 client options (the broker under its TLS server name, dialled at
//! another address when set, TLS, Nagle off, credentials), why a connection failed in words for the
//! log, and the TCP stream under it ([`socket`]). Knows nothing of sessions, topics or records.

use std::sync::Arc;

use rumqttc::{ConnectReturnCode, ConnectionError, MqttOptions, TlsConfiguration, Transport};

use crate::net::client::chain;
use crate::net::tls_client::TlsConfig;
use crate::setting::{Secret, SettingError};

pub mod socket;

/// What every MQTT 5 connection of colibri's has (the sink's and the mqtt source's): the broker
/// named `server_name` (the name its certificate is checked for) at `port`, dialled at `dial`
/// (`host:port`) when that differs, TLS when set (reads its files), Nagle off, the credentials.
pub fn connection_options(
    client_id: &str,
    server_name: String,
    port: u16,
    dial: Option<String>,
    tls: Option<&TlsConfig>,
    username: Option<&String>,
    password: Option<&Secret>,
) -> Result<MqttOptions, SettingError> {
    let mut opts = MqttOptions::new(client_id, rumqttc::Broker::tcp(server_name, port));
    if let Some(tls) = tls {
        let config = super::tls_client::client_config(tls)?;
        opts.set_transport(Transport::tls_with_config(TlsConfiguration::Rustls(
            Arc::new(config),
        )));
    }
    opts.set_socket_connector(move |addr, net| socket::connect(dial.clone(), addr, net));
    let mut net = rumqttc::NetworkOptions::new();
    net.set_tcp_nodelay(true);
    opts.set_network_options(net);
    match (username, password) {
        (Some(u), Some(p)) => {
            opts.set_credentials(u.clone(), p.0.clone().into_bytes());
        }
        (Some(u), None) => {
            opts.set_username(u.clone());
        }
        (None, Some(p)) => {
            opts.set_password(p.0.clone().into_bytes());
        }
        (None, None) => {}
    }
    Ok(opts)
}

/// Why the connection is down, for the log (the sink's link, the mqtt source) and the
/// deliveries it refuses.
pub fn reason(shown: &str, e: &ConnectionError) -> String {
    use ConnectReturnCode as C;
    match e {
        ConnectionError::ConnectionRefused(
            code @ (C::BadUserNamePassword
            | C::NotAuthorized
            | C::Banned
            | C::BadAuthenticationMethod),
        ) => refused_credentials(shown, code),
        ConnectionError::ConnectionRefused(code) => {
            format!("{shown}: the broker refused the connection ({code:?})")
        }
        other => format!("{shown}: {}", chain(other)),
    }
}

/// The reason a CONNACK refused colibri's credentials gives, in both versions' words.
pub fn refused_credentials(shown: &str, code: impl std::fmt::Debug) -> String {
    format!(
        "{shown}: the broker refused colibri's credentials ({code:?}); nothing goes through until they are accepted"
    )
}
