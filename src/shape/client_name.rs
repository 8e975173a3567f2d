//! The names a broker connection has unless the file gives one: stable across restarts,
//! different for each machine, entry and store. Used by the broker sinks' and the mqtt source's
//! file shapes.

#[cfg(feature = "mqtt")]
use std::path::Path;

/// The name a connection has unless the file gives one: stable across restarts, different for
/// each machine and sink (two sinks with one MQTT client id would throw each other off).
pub fn default_client_name(sink: &str) -> String {
    let host = crate::net::hostname().unwrap_or_else(|| "unknown".into());
    format!("colibri-{host}-{sink}")
}

/// An MQTT client id unless the file gives one: the default name (`name`: the sink's, or
/// `source-<name>` for a source) and a key of the store (`colibri-<host>-<name>-<8 hex digits>`).
/// Two agents on one host (each its own `data_dir`) with an entry of one name must not share it:
/// a source would resume the other's session and take the messages meant for it, and two sinks
/// would throw each other off the broker at every reconnect. The key is of the store's place, not
/// of its store id, which changes when a damaged store is salvaged: a source's session must
/// outlive that.
#[cfg(feature = "mqtt")]
pub fn default_mqtt_client_id(name: &str, data_dir: &Path) -> String {
    format!("{}-{:08x}", default_client_name(name), store_key(data_dir))
}

/// 32 bits of the FNV-1a hash of `data_dir`'s canonical path: the same for every spelling of one
/// directory (relative, through a symlink, with `..`), before the directory exists as after.
#[cfg(feature = "mqtt")]
fn store_key(data_dir: &Path) -> u32 {
    use std::os::unix::ffi::OsStrExt as _;
    let hash = crate::files::fnv1a(canonical(data_dir).as_os_str().as_bytes());
    (hash ^ (hash >> 32)) as u32
}

/// `path` made absolute with its symlinks resolved, as far as it exists: the part that does not
/// exist yet (a data_dir made at the first run) is appended as written, which is what it resolves
/// to once made.
#[cfg(feature = "mqtt")]
fn canonical(path: &Path) -> std::path::PathBuf {
    let mut rest = Vec::new();
    let mut at = path;
    loop {
        if let Ok(real) = std::fs::canonicalize(at) {
            return rest.iter().rev().fold(real, |p, c| p.join(c));
        }
        match (at.parent(), at.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_os_string());
                at = parent;
            }
            // Nothing of it exists (a relative path's first component, `..`): as written.
            _ => return std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf()),
        }
    }
}
