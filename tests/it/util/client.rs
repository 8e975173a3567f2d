//! A small blocking HTTP/1.1 client over a std `TcpStream`, for the ingest tests and benchmark: it
//! keeps one connection alive across requests, sends exactly the bytes it is given when asked
//! (headers without a body, half a body, a chunked body), and reads answers that carry a
//! `Content-Length` (every answer colibri's ingest API gives does).
//!
//! Standalone (std and serde_json only) so both `tests/ingest.rs` and `benches/ingest.rs` include
//! it with `#[path]`.

#![allow(dead_code, reason = "each includer uses its own part")]

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// One answer.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    /// Names in lower case, in the order received.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON; panics (showing it) when it is not.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("answer {} is not JSON ({e}): {}", self.status, self.text()))
    }

    /// The `error` of a JSON error body, or "".
    pub fn error(&self) -> String {
        serde_json::from_slice::<serde_json::Value>(&self.body)
            .ok()
            .and_then(|v| v["error"].as_str().map(str::to_string))
            .unwrap_or_default()
    }
}

/// A client of one server address, with one kept-alive connection.
pub struct Client {
    addr: SocketAddr,
    conn: Option<BufReader<TcpStream>>,
    /// For connecting, and for each read and write.
    pub timeout: Duration,
}

impl Client {
    pub fn new(addr: SocketAddr) -> Self {
        Client {
            addr,
            conn: None,
            timeout: Duration::from_secs(30),
        }
    }

    fn conn(&mut self) -> io::Result<&mut BufReader<TcpStream>> {
        if self.conn.is_none() {
            let s = TcpStream::connect_timeout(&self.addr, self.timeout)?;
            s.set_nodelay(true)?;
            s.set_read_timeout(Some(self.timeout))?;
            s.set_write_timeout(Some(self.timeout))?;
            self.conn = Some(BufReader::new(s));
        }
        Ok(self.conn.as_mut().expect("just set"))
    }

    /// Whether a connection is open (it may have been closed by the peer since).
    pub fn connected(&self) -> bool {
        self.conn.is_some()
    }

    /// Drops the connection; the next request opens a new one.
    pub fn close(&mut self) {
        self.conn = None;
    }

    /// Writes raw bytes on the connection (opening it if needed).
    pub fn send_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        let r = self.conn()?.get_mut().write_all(bytes);
        if r.is_err() {
            self.conn = None;
        }
        r
    }

    /// A request with these headers and, when `body` is given, a `Content-Length` and the body.
    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
    ) -> io::Result<Answer> {
        let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {}\r\n", self.addr);
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        if let Some(b) = body {
            head.push_str(&format!("Content-Length: {}\r\n", b.len()));
        }
        head.push_str("\r\n");
        let mut bytes = head.into_bytes();
        if let Some(b) = body {
            bytes.extend_from_slice(b);
        }
        self.send_raw(&bytes)?;
        self.read_answer()
    }

    /// `POST path` with this content type, extra headers and body.
    pub fn post(
        &mut self,
        path: &str,
        content_type: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> io::Result<Answer> {
        let mut all = vec![("Content-Type", content_type)];
        all.extend_from_slice(headers);
        self.request("POST", path, &all, Some(body))
    }

    /// Reads one answer; the connection is dropped after it when the server says
    /// `Connection: close`, and on any error.
    pub fn read_answer(&mut self) -> io::Result<Answer> {
        let r = read_answer(self.conn()?);
        match &r {
            Ok(a)
                if !a
                    .header("connection")
                    .is_some_and(|v| v.eq_ignore_ascii_case("close")) => {}
            _ => self.conn = None,
        }
        r
    }

    /// Waits up to `limit` for the server to close the connection (reads EOF or a reset); any
    /// bytes that arrive first are an error.
    pub fn wait_closed(&mut self, limit: Duration) -> io::Result<bool> {
        let deadline = Instant::now() + limit;
        let Some(conn) = self.conn.as_mut() else {
            return Ok(true);
        };
        let mut buf = [0u8; 256];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            conn.get_ref().set_read_timeout(Some(left))?;
            match conn.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    return Err(io::Error::other(format!(
                        "unexpected bytes: {:?}",
                        String::from_utf8_lossy(&buf[..n])
                    )));
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Ok(false);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        self.conn = None;
        Ok(true)
    }
}

fn bad(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// Reads one answer from any connection (a TLS one too).
pub fn read_answer(r: &mut impl BufRead) -> io::Result<Answer> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the connection closed before an answer",
        ));
    }
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad(format!("not a status line: {line:?}")))?;
    let mut headers = Vec::new();
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the connection closed inside the headers",
            ));
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        let (k, v) = l
            .split_once(':')
            .ok_or_else(|| bad(format!("not a header: {l:?}")))?;
        headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
    }
    let len: usize = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .ok_or_else(|| bad("an answer without Content-Length".into()))?;
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    Ok(Answer {
        status,
        headers,
        body,
    })
}
