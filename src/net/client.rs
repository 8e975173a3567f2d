//! What every outgoing HTTP client of colibri shares (the `http` sink's and the `http_scrape`
//! task's): the `User-Agent`, rustls' ring provider installed before a client is built, no proxies
//! from the environment, configured headers kept out of `Debug`, URLs fit for logs, and an error
//! with its causes on one line. It builds no request and classifies no answer: that is each
//! caller's (`sink::http`, `task::scrape`).

use reqwest::Url;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

/// Sent with every request, so a receiver can tell colibri and its version apart.
pub const USER_AGENT: &str = concat!("colibri/", env!("CARGO_PKG_VERSION"));

/// Installs rustls' ring provider as the process default. Idempotent; called before any client is
/// built (a second install just reports that one exists).
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A client builder with what every colibri client has: the crypto provider installed, the
/// `User-Agent`, and no proxy. Proxies from the environment would turn an upstream outage into
/// 502s that spend attempts, while the sink's probe dials the origin directly: not supported for
/// now.
pub fn builder() -> reqwest::ClientBuilder {
    install_crypto_provider();
    reqwest::Client::builder().no_proxy().user_agent(USER_AGENT)
}

/// A configured header that cannot be sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadHeader<'a> {
    /// This name is not a valid header name.
    Name(&'a str),
    /// The value of the header of this name has characters a header cannot carry.
    Value(&'a str),
}

/// Configured headers as one map, each value marked sensitive (it may hold a credential: hyper
/// then keeps it out of `Debug`); the first that cannot be a header is named.
pub fn sensitive_headers(headers: &[(String, String)]) -> Result<HeaderMap, BadHeader<'_>> {
    let mut map = HeaderMap::new();
    for (k, v) in headers {
        let name = HeaderName::from_bytes(k.as_bytes()).map_err(|_| BadHeader::Name(k))?;
        let mut value = HeaderValue::from_str(v).map_err(|_| BadHeader::Value(k))?;
        value.set_sensitive(true);
        map.insert(name, value);
    }
    Ok(map)
}

/// A URL fit for logs and stored reasons: the password and the values of query parameters that
/// look like credentials are replaced by `***`.
pub fn shown_url(url: &Url) -> String {
    let mut u = url.clone();
    if u.password().is_some() {
        let _ = u.set_password(Some("***"));
    }
    let secret = |k: &str| {
        let k = k.to_ascii_lowercase();
        ["pass", "token", "key", "secret", "auth", "sig"]
            .iter()
            .any(|w| k.contains(w))
            || k == "p"
    };
    if u.query_pairs().any(|(k, _)| secret(&k)) {
        let pairs: Vec<(String, String)> = u
            .query_pairs()
            .map(|(k, v)| {
                let v = if secret(&k) {
                    "***".into()
                } else {
                    v.into_owned()
                };
                (k.into_owned(), v)
            })
            .collect();
        u.query_pairs_mut().clear().extend_pairs(pairs);
    }
    u.to_string()
}

/// An error and its causes on one line: reqwest's own message alone says little ("error sending
/// request"); the cause says "connection refused" or "invalid peer certificate: UnknownIssuer".
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_in_logs_hide_passwords_and_secret_query_values() {
        let u: Url =
            "https://user:hunter2@db.example:8086/write?db=plant&u=user&p=hunter2&precision=s"
                .parse()
                .unwrap();
        let shown = shown_url(&u);
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(
            shown.contains("db=plant") && shown.contains("precision=s"),
            "{shown}"
        );
        let plain: Url = "http://127.0.0.1:8428/write".parse().unwrap();
        assert_eq!(shown_url(&plain), "http://127.0.0.1:8428/write");
    }
}
