//! `colibri check --bind`: tries to bind every listener of a config (the admin endpoint, the
//! ingest API, each source's ports) and reports each that cannot be bound, so a port another
//! program holds, or one below 1024 without the right to it, is found before `run` (which refuses
//! to start on it). Each socket is closed at once; the check binds as `run` does (TCP with
//! `SO_REUSEADDR`, so a port in TIME_WAIT after a restart is not reported).

use std::net::SocketAddr;

use crate::config::Config;

/// A listener of the config: the setting that names it, its protocol and address.
pub struct Listener {
    pub setting: String,
    pub proto: &'static str,
    pub addr: SocketAddr,
}

/// Every listener `config` would open at `run`.
pub fn listeners(config: &Config) -> Vec<Listener> {
    let mut out = Vec::new();
    if let Some(a) = &config.admin {
        out.push(Listener {
            setting: "admin.listen".into(),
            proto: "tcp",
            addr: a.listen,
        });
    }
    if let Some(i) = &config.ingest {
        out.push(Listener {
            setting: "ingest.listen".into(),
            proto: "tcp",
            addr: i.listen,
        });
    }
    for s in &config.sources {
        for (setting, proto, addr) in s.listens() {
            out.push(Listener {
                setting: format!("sources.{}.{setting}", s.name()),
                proto,
                addr,
            });
        }
    }
    out
}

/// Binds each listener and closes it again; the failures, one line each.
pub fn try_binds(config: &Config) -> Vec<String> {
    listeners(config)
        .iter()
        .filter_map(|l| {
            let bound = match l.proto {
                "udp" => std::net::UdpSocket::bind(l.addr).map(drop),
                _ => std::net::TcpListener::bind(l.addr).map(drop),
            };
            bound.err().map(|e| {
                format!(
                    "cannot listen on {} {} ({}): {e}",
                    l.proto, l.addr, l.setting
                )
            })
        })
        .collect()
}
