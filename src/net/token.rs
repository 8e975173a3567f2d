//! The bearer token that guards both listeners (`ingest.token`, `admin.token`): kept out of every
//! log and `Debug` output, and compared in time that does not depend on where a guess goes wrong.
//! Reading the `Authorization` header is each listener's business (`ingest::api`, `admin`);
//! `config` makes the token from the file.

/// The bearer token: never printed, compared in constant time.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl Token {
    pub fn new(token: String) -> Self {
        Token(token)
    }

    /// The token itself, to send it (`colibri task` and the other commands that ask a running
    /// agent); never for a log.
    pub fn secret(&self) -> &str {
        &self.0
    }

    /// Whether `given` is the token, in time that depends on the token's length only.
    pub fn matches(&self, given: &[u8]) -> bool {
        let want = self.0.as_bytes();
        let mut diff = want.len() ^ given.len();
        for (i, w) in want.iter().enumerate() {
            let g = given.get(i).copied().unwrap_or(0);
            diff |= usize::from(w ^ g);
        }
        std::hint::black_box(diff) == 0
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}
