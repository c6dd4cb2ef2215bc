//! A fault-injecting store for tests: a small HTTP/1.1 server on `127.0.0.1:0` that keeps
//! objects in memory (`GET`, `HEAD`, `PUT` of any path, as bazel-remote or nginx with WebDAV
//! does) and, on request, answers the next requests with a fault instead.
//!
//! | fault | what the client sees |
//! | --- | --- |
//! | `Status(500)` | that status, with a short body |
//! | `DropMidBody` | `200`, the full `Content-Length`, half the body, then the connection closes |
//! | `WrongBytes` | `200` and a body of the right length whose bytes are not the object's |
//! | `Slow(d)` | nothing for `d`, then the normal answer (past any shorter client timeout) |
//!
//! Loopback only, one thread per connection, and bounded: it serves at most
//! [`MAX_CONNECTIONS`] connections, a `Slow` fault sleeps at most 5 s, and dropping the
//! server stops it. Shared by the `prebuilt`, `bundler` and `release` tests.

use std::collections::{BTreeMap, VecDeque};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Connections served before the server stops by itself.
pub const MAX_CONNECTIONS: usize = 2_000;

/// How to answer one request instead of normally.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Answer with this status.
    Status(u16),
    /// Send the headers and half the body of a `GET`, then close.
    DropMidBody,
    /// Send `200` with the object's length of other bytes.
    WrongBytes,
    /// Wait this long, then answer normally.
    Slow(Duration),
}

#[derive(Default)]
struct State {
    objects: BTreeMap<String, Vec<u8>>,
    /// Faults for the next requests, one each, in order.
    next: VecDeque<Fault>,
    /// A fault for every request once `next` is empty.
    always: Option<Fault>,
    /// `METHOD /path` of every request, in order.
    requests: Vec<String>,
}

/// The running server; stops when dropped.
pub struct LoopbackStore {
    address: String,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl LoopbackStore {
    /// Starts a server on a free loopback port.
    pub fn start() -> LoopbackStore {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let address = listener.local_addr().unwrap().to_string();
        let state = Arc::new(Mutex::new(State::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let state = Arc::clone(&state);
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                for stream in listener.incoming().take(MAX_CONNECTIONS) {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(stream) = stream else { continue };
                    let state = Arc::clone(&state);
                    std::thread::spawn(move || {
                        let _ = serve(stream, &state);
                    });
                }
            })
        };
        LoopbackStore {
            address,
            state,
            stop,
            thread: Some(thread),
        }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    /// Stores `bytes` at `path` (`/cas/<sha256>`).
    pub fn insert(&self, path: &str, bytes: &[u8]) {
        self.state
            .lock()
            .unwrap()
            .objects
            .insert(path.to_owned(), bytes.to_vec());
    }

    /// The object at `path`.
    pub fn object(&self, path: &str) -> Option<Vec<u8>> {
        self.state.lock().unwrap().objects.get(path).cloned()
    }

    /// Every stored path.
    pub fn paths(&self) -> Vec<String> {
        self.state.lock().unwrap().objects.keys().cloned().collect()
    }

    /// Answers the next requests with these faults, one each.
    pub fn fail_next(&self, faults: impl IntoIterator<Item = Fault>) {
        self.state.lock().unwrap().next.extend(faults);
    }

    /// Answers every request (after the queued ones) with `fault`; `None` stops.
    pub fn fail_always(&self, fault: Option<Fault>) {
        self.state.lock().unwrap().always = fault;
    }

    /// `METHOD /path` of every request so far.
    pub fn requests(&self) -> Vec<String> {
        self.state.lock().unwrap().requests.clone()
    }
}

impl Drop for LoopbackStore {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so that it sees the flag.
        let _ = TcpStream::connect(&self.address);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn serve(stream: TcpStream, state: &Mutex<State>) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let (Some(method), Some(target)) = (parts.next(), parts.next()) else {
        return Ok(());
    };
    let (method, path) = (method.to_owned(), target.to_owned());
    let mut length = 0usize;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header)? == 0 || header == "\r\n" || header == "\n" {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().unwrap_or(0);
            }
        }
    }
    let mut body = vec![0; length.min(256 << 20)];
    reader.read_exact(&mut body)?;

    let (fault, object) = {
        let mut state = state.lock().unwrap();
        state.requests.push(format!("{method} {path}"));
        let fault = state.next.pop_front().or_else(|| state.always.clone());
        (fault, state.objects.get(&path).cloned())
    };
    let mut stream = stream;
    match fault {
        Some(Fault::Status(status)) => {
            return respond(&mut stream, status, b"injected fault\n", method != "HEAD")
        }
        Some(Fault::Slow(wait)) => std::thread::sleep(wait.min(Duration::from_secs(5))),
        Some(Fault::DropMidBody) => {
            if let Some(object) = object.as_ref().filter(|_| method == "GET") {
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    object.len()
                );
                stream.write_all(head.as_bytes())?;
                stream.write_all(&object[..object.len() / 2])?;
                stream.flush()?;
            }
            return stream.shutdown(Shutdown::Both);
        }
        Some(Fault::WrongBytes) => {
            if let Some(object) = object.as_ref().filter(|_| method == "GET") {
                let wrong: Vec<u8> = object.iter().map(|byte| byte ^ 0x5a).collect();
                return respond(&mut stream, 200, &wrong, true);
            }
        }
        None => {}
    }
    match (method.as_str(), object) {
        ("GET", Some(object)) => respond(&mut stream, 200, &object, true),
        ("HEAD", Some(object)) => respond(&mut stream, 200, &object, false),
        ("PUT", _) => {
            state.lock().unwrap().objects.insert(path, body);
            respond(&mut stream, 201, b"", true)
        }
        ("GET" | "HEAD", None) => respond(&mut stream, 404, b"not found\n", method == "GET"),
        _ => respond(&mut stream, 405, b"", true),
    }
}

fn respond(
    stream: &mut TcpStream,
    status: u16,
    body: &[u8],
    with_body: bool,
) -> std::io::Result<()> {
    let reason = match status {
        200 => "OK",
        201 => "Created",
        404 => "Not Found",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        507 => "Insufficient Storage",
        _ => "Status",
    };
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    if with_body {
        stream.write_all(body)?;
    }
    stream.flush()
}
