//! What both MQTT protocol versions of the `mqtt` sink share: the words their packets and errors
//! are translated into ([`Polled`] for the event loop, [`Refusal`] for an acknowledgement that did
//! not come), the client's bounds, and the sizes and messages both compute alike. Used by `v5`,
//! `v311`, `client` and `conn`; it knows neither version.

/// Requests the client queues before a publish waits: bounds what a dropped connection holds.
pub const REQUEST_CAPACITY: usize = 256;
/// Messages awaiting their acknowledgement at once (fewer if the broker's Receive Maximum says so).
pub const MAX_IN_FLIGHT: u16 = 128;

/// What one poll of the event loop saw.
pub enum Polled {
    /// A CONNACK that accepted the connection; the broker's maximum packet size if it set one.
    Connected {
        max_packet: Option<u32>,
        session_present: bool,
    },
    /// A message on a topic colibri subscribed to (Sparkplug's commands and host STATE).
    Message {
        topic: String,
        payload: bytes::Bytes,
    },
    /// Any other packet in or out.
    Other,
    /// The connection failed or was refused: why, in words for the link's log line.
    Failed(String),
}

/// Why a message was not acknowledged.
#[derive(Debug)]
pub enum Refusal {
    /// The broker does not let colibri publish to the topic (an ACL: the sink's setting).
    NotAuthorized(String),
    /// The message can never be taken (its topic, or its payload's format).
    Invalid(String),
    /// Another refusal, which may pass.
    Other(String),
    /// The connection or the session ended before the answer.
    Lost(String),
}

/// The MQTT remaining-length bytes for `n`.
pub fn varint_len(n: usize) -> usize {
    match n {
        0..=127 => 1,
        128..=16_383 => 2,
        16_384..=2_097_151 => 3,
        _ => 4,
    }
}
