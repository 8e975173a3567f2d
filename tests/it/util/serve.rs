//! A tiny HTTP/1.1 endpoint for scrape tests: answers every GET with what a closure makes of the
//! path and the number of GETs so far, one connection at a time, `Connection: close`. Records when
//! each GET was answered, so a test can match stored samples to the moment they were measured.

#![allow(dead_code, reason = "each includer uses its own part")]

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

/// (status, content type, body) for a GET of `path`, the `n`th GET of it (from 1).
pub type Answer = Box<dyn Fn(&str, u64) -> (u16, &'static str, String) + Send>;

pub struct Endpoint {
    addr: SocketAddr,
    /// Per path: the GETs answered 200, (path, n, Unix ms), in order.
    served: Arc<Mutex<Vec<(String, u64, u64)>>>,
    /// While set, every GET is answered 503 (and not counted).
    frozen: Arc<AtomicBool>,
}

impl Endpoint {
    pub fn start(answer: Answer) -> Endpoint {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let served: Arc<Mutex<Vec<(String, u64, u64)>>> = Arc::default();
        let frozen = Arc::new(AtomicBool::new(false));
        let (s, f) = (Arc::clone(&served), Arc::clone(&frozen));
        std::thread::spawn(move || {
            let mut gets: std::collections::HashMap<String, u64> = Default::default();
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                let mut reader = BufReader::new(conn.try_clone().expect("clone"));
                let mut request = String::new();
                if reader.read_line(&mut request).is_err() {
                    continue;
                }
                // Headers, up to the blank line.
                loop {
                    let mut h = String::new();
                    match reader.read_line(&mut h) {
                        Ok(0) | Err(_) => break,
                        Ok(_) if h == "\r\n" || h == "\n" => break,
                        Ok(_) => {}
                    }
                }
                let path = request.split_whitespace().nth(1).unwrap_or("/").to_string();
                let (status, ctype, body) = if f.load(Ordering::SeqCst) {
                    (503, "text/plain", "frozen\n".to_string())
                } else {
                    let mut served = s.lock().unwrap();
                    let n = gets.entry(path.clone()).or_default();
                    *n += 1;
                    let n = *n;
                    let at = SystemTime::now()
                        .duration_since(SystemTime::UNIX_EPOCH)
                        .unwrap()
                        .as_millis() as u64;
                    let answer = answer(&path, n);
                    if answer.0 == 200 {
                        served.push((path.clone(), n, at));
                    }
                    answer
                };
                let _ = write!(
                    conn,
                    "HTTP/1.1 {status} X\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        Endpoint {
            addr,
            served,
            frozen,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Answers 503 from now on; returns what was served of each path: (n, Unix ms).
    pub fn freeze(&self) -> Vec<(String, u64, u64)> {
        self.frozen.store(true, Ordering::SeqCst);
        self.served.lock().unwrap().clone()
    }

    pub fn served(&self, path: &str) -> Vec<(u64, u64)> {
        self.served
            .lock()
            .unwrap()
            .iter()
            .filter(|(p, _, _)| p == path)
            .map(|(_, n, at)| (*n, *at))
            .collect()
    }
}
