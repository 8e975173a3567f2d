//! This machine's host name: what a tail source's records carry as `host` and what default MQTT
//! and NATS client names are made of. Read each time it is asked (a rename shows at the next
//! start of what asks).

/// The machine's host name.
pub fn hostname() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: a writable buffer of the length given.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return None;
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    Some(String::from_utf8_lossy(&buf[..end]).into_owned())
}
