//! systemd's notification protocol (sd_notify(3)), without libsystemd: one datagram per message
//! to the socket named by `$NOTIFY_SOCKET` (a path, or `@name` in the abstract namespace). `READY=1`
//! once colibri serves, `RELOADING=1` + `MONOTONIC_USEC` then `READY=1` around a reload,
//! `STOPPING=1` when the stop begins, `WATCHDOG=1` every half `$WATCHDOG_USEC` while healthy, and a
//! `STATUS=` line. Outside systemd (no variable) every call does nothing. Called by `agent`.

use std::os::unix::net::UnixDatagram;
use std::time::Duration;

/// Sends `state` (newline-separated `KEY=value` lines). Errors are logged once per kind and
/// otherwise ignored: a missing supervisor must not stop colibri.
pub fn notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    if let Err(e) = send(&path, state) {
        tracing::debug!(error = %e, "cannot notify systemd");
    }
}

fn send(path: &std::ffi::OsStr, state: &str) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let sock = UnixDatagram::unbound()?;
    let bytes = path.as_bytes();
    match bytes.strip_prefix(b"@") {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
            sock.send_to_addr(state.as_bytes(), &addr)?;
        }
        None => {
            sock.send_to(state.as_bytes(), path)?;
        }
    }
    Ok(())
}

/// `RELOADING=1` with the monotonic time systemd wants alongside it.
pub fn reloading() {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec it is given, which lives on this frame.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    let usec = (ts.tv_sec as u64) * 1_000_000 + (ts.tv_nsec as u64) / 1_000;
    notify(&format!("RELOADING=1\nMONOTONIC_USEC={usec}"));
}

/// How often to send `WATCHDOG=1`: half of `$WATCHDOG_USEC` (when it is meant for this process).
pub fn watchdog_interval() -> Option<Duration> {
    if let Some(pid) = std::env::var("WATCHDOG_PID").ok()
        && pid.parse::<u32>().ok() != Some(std::process::id())
    {
        return None;
    }
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
    (usec > 0).then(|| Duration::from_micros(usec / 2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_datagram_reaches_a_path_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let rx = UnixDatagram::bind(&path).unwrap();
        send(path.as_os_str(), "READY=1\nSTATUS=serving").unwrap();
        let mut buf = [0u8; 256];
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1\nSTATUS=serving");
    }
}
