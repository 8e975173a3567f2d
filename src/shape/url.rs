//! URLs as settings: an `http://`/`https://` URL ([`http`]), and a broker's URL of two schemes
//! ([`broker`]: a host and a port, no path, no credentials). Each error names the value and what is
//! wrong with it; the caller reports it under its field.

pub fn http(s: &str) -> Result<reqwest::Url, String> {
    let url = reqwest::Url::parse(s).map_err(|e| format!("{s:?} is not a valid URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!(
            "{s:?}: the scheme must be http or https, not {}",
            url.scheme()
        ));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(format!("{s:?} has no host"));
    }
    Ok(url)
}

#[cfg(any(feature = "mqtt", feature = "nats"))]
/// The host, port and whether TLS is used, from a broker URL of the `plain` or `tls` scheme (each
/// with its default port): a host and a port, no path, no credentials (they have settings of their
/// own, which are never logged).
pub fn broker(
    s: &str,
    plain: (&str, u16),
    tls: (&str, u16),
) -> Result<(String, u16, bool), String> {
    let url = reqwest::Url::parse(s).map_err(|e| format!("{s:?} is not a valid URL: {e}"))?;
    let (tls, default_port) = match url.scheme() {
        scheme if scheme == plain.0 => (false, plain.1),
        scheme if scheme == tls.0 => (true, tls.1),
        other => {
            return Err(format!(
                "{s:?}: the scheme must be {} or {}, not {other}",
                plain.0, tls.0
            ));
        }
    };
    if !url.username().is_empty() || url.password().is_some() {
        return Err(format!(
            "{s:?} holds credentials: set them in their own settings instead (they are never logged)"
        ));
    }
    if !matches!(url.path(), "" | "/") || url.query().is_some() {
        return Err(format!("{s:?}: a broker URL is a host and a port, no path"));
    }
    let host = url
        .host_str()
        .filter(|h| !h.is_empty())
        .ok_or_else(|| format!("{s:?} has no host"))?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    Ok((host, url.port().unwrap_or(default_port), tls))
}
