//! `log.file`: a bounded queue of formatted lines between the `tracing` writer (any thread) and one
//! thread that owns the file: it appends, rotates by size (`<file>.1` newest ... `<file>.N`
//! oldest) and fdatasyncs on request. A thread that logs never touches the file; it copies its line
//! into the queue, where WARN and ERROR wait for room and less severe lines are dropped (and
//! counted) while the queue is full. A file that cannot be written, rotated or synced never stops
//! colibri: the trouble is reported once on stderr, the lines are counted as lost and every later
//! line tries again. Started by `logging::init` when `log.file` is set; `logging::flush` talks to it.

use std::cell::Cell;
use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tracing::level_filters::LevelFilter;
use tracing::{Dispatch, Level, Metadata};
use tracing_subscriber::fmt::MakeWriter;

use super::LogFormat;

/// Lines the queue holds before INFO and below are dropped and WARN and ERROR wait: at a few
/// hundred bytes a line, a few MB at most (twice that while the writer works through a full
/// batch), and only while the disk falls behind. The queue grows on demand; an idle one holds
/// nothing.
pub const CAPACITY: usize = 16384;

/// Mode of a log file colibri creates: the group (e.g. `adm`) may read it, nobody else.
const MODE: u32 = 0o640;

/// A log file and its rotation, as compiled from `log:`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogFile {
    pub path: PathBuf,
    /// The current file is rotated when the next line would take it past this many bytes.
    pub max_size: u64,
    /// Rotated files kept: `<path>.1` (newest) to `<path>.<max_files>` (oldest).
    pub max_files: u32,
}

thread_local! {
    /// Set on writer threads: an event logged there (a panic) must never wait for its own queue.
    static ON_WRITER: Cell<bool> = const { Cell::new(false) };
}

fn on_writer() -> bool {
    ON_WRITER.with(Cell::get)
}

/// Opens the file (so a bad path or permission stops the start) and starts the writer thread.
/// `format` renders the writer's own notices like every other line; `capacity` is [`CAPACITY`]
/// except in tests.
pub fn start(spec: LogFile, format: LogFormat, capacity: usize) -> io::Result<FileWriter> {
    start_gated(spec, format, capacity, None)
}

/// [`start`], with a writer thread that takes nothing from the queue until `gate` yields (or is
/// dropped): lets a test fill the queue deterministically.
fn start_gated(
    spec: LogFile,
    format: LogFormat,
    capacity: usize,
    gate: Option<std::sync::mpsc::Receiver<()>>,
) -> io::Result<FileWriter> {
    let file = open(&spec.path).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("cannot open {}: {e}", spec.path.display()),
        )
    })?;
    let len = file.metadata()?.len();
    let queue = Arc::new(Queue {
        state: Mutex::new(State::default()),
        work: Condvar::new(),
        room: Condvar::new(),
        flushed: Condvar::new(),
        capacity: capacity.max(1),
    });
    let output = Output {
        spec,
        file: Some(file),
        len,
        lost: 0,
        reported: Reported::default(),
        notices: Notices::new(format),
    };
    let for_thread = Arc::clone(&queue);
    std::thread::Builder::new()
        .name("log-writer".into())
        .spawn(move || {
            if let Some(gate) = gate {
                let _ = gate.recv();
            }
            write_loop(&for_thread, output)
        })
        .map_err(|e| {
            io::Error::new(e.kind(), format!("cannot start the log writer thread: {e}"))
        })?;
    Ok(FileWriter { queue })
}

fn open(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(MODE)
        .open(path)
}

/// The `MakeWriter` of the subscriber: each event becomes one line in the queue.
#[derive(Clone)]
pub struct FileWriter {
    queue: Arc<Queue>,
}

impl<'a> MakeWriter<'a> for FileWriter {
    type Writer = LineWriter<'a>;

    /// Without the event's level the line is treated as important: it waits rather than be lost.
    fn make_writer(&'a self) -> Self::Writer {
        LineWriter {
            queue: &self.queue,
            urgent: true,
            line: Vec::new(),
        }
    }

    fn make_writer_for(&'a self, meta: &Metadata<'_>) -> Self::Writer {
        LineWriter {
            queue: &self.queue,
            urgent: *meta.level() <= Level::WARN,
            line: Vec::new(),
        }
    }
}

impl FileWriter {
    /// Waits, for at most `limit`, until everything queued before the call is written and the file
    /// fdatasynced. False when the limit passed, or when called on the writer thread itself (a
    /// panic there), which must not wait for itself.
    pub fn flush(&self, limit: Duration) -> bool {
        if on_writer() {
            return false;
        }
        let deadline = Instant::now() + limit;
        let q = &self.queue;
        let mut s = q.lock();
        if s.writer_gone {
            return false;
        }
        s.flush_asked += 1;
        let ticket = s.flush_asked;
        q.wake_writer(&mut s);
        while s.flush_done < ticket && !s.writer_gone {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            s = q
                .flushed
                .wait_timeout(s, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        s.flush_done >= ticket
    }
}

/// One event's bytes; the fmt layer writes a whole event at once, and the line is queued when the
/// writer is dropped.
pub struct LineWriter<'a> {
    queue: &'a Queue,
    urgent: bool,
    line: Vec<u8>,
}

impl Write for LineWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.line.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for LineWriter<'_> {
    fn drop(&mut self) {
        if !self.line.is_empty() {
            self.queue
                .push(std::mem::take(&mut self.line), self.urgent && !on_writer());
        }
    }
}

struct Queue {
    state: Mutex<State>,
    /// The writer thread waits here for lines or a flush request.
    work: Condvar,
    /// WARN and ERROR lines wait here while the queue is full.
    room: Condvar,
    /// `flush` callers wait here for their request to be done.
    flushed: Condvar,
    capacity: usize,
}

#[derive(Default)]
struct State {
    lines: VecDeque<Vec<u8>>,
    /// Lines dropped since the writer last took the queue. Lines are only dropped while it is
    /// full, so they all come after the lines queued now: the writer's notice goes right after them.
    dropped: u64,
    /// Flush requests, numbered; `flush_done` is the newest one completed.
    flush_asked: u64,
    flush_done: u64,
    writer_waiting: bool,
    waiting_for_room: usize,
    /// The writer thread ended (it only does by panicking): lines go to stderr instead.
    writer_gone: bool,
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding the lock; a poisoned one is still consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn wake_writer(&self, s: &mut State) {
        if s.writer_waiting {
            s.writer_waiting = false;
            self.work.notify_one();
        }
    }

    fn push(&self, line: Vec<u8>, wait: bool) {
        let mut s = self.lock();
        if s.lines.len() >= self.capacity && !s.writer_gone {
            if !wait {
                s.dropped += 1;
                return;
            }
            s.waiting_for_room += 1;
            while s.lines.len() >= self.capacity && !s.writer_gone {
                s = self.room.wait(s).unwrap_or_else(PoisonError::into_inner);
            }
            s.waiting_for_room -= 1;
        }
        if s.writer_gone {
            drop(s);
            let _ = io::stderr().write_all(&line);
            return;
        }
        s.lines.push_back(line);
        self.wake_writer(&mut s);
    }
}

/// Marks the queue when the writer thread ends, so nobody waits for it any more.
struct Gone<'a>(&'a Queue);

impl Drop for Gone<'_> {
    fn drop(&mut self) {
        let mut s = self.0.lock();
        s.writer_gone = true;
        drop(s);
        self.0.room.notify_all();
        self.0.flushed.notify_all();
    }
}

/// The writer thread: takes everything queued at once, writes it, then answers flush requests.
fn write_loop(queue: &Queue, mut out: Output) {
    ON_WRITER.with(|w| w.set(true));
    let _gone = Gone(queue);
    let mut s = queue.lock();
    loop {
        while s.lines.is_empty() && s.dropped == 0 && s.flush_asked == s.flush_done {
            s.writer_waiting = true;
            s = queue.work.wait(s).unwrap_or_else(PoisonError::into_inner);
        }
        s.writer_waiting = false;
        let batch = std::mem::take(&mut s.lines);
        let dropped = std::mem::take(&mut s.dropped);
        let flush = s.flush_asked;
        let room_waiters = s.waiting_for_room > 0;
        drop(s);
        if room_waiters {
            queue.room.notify_all();
        }
        for line in &batch {
            out.write(line);
        }
        drop(batch);
        if dropped > 0 {
            out.dropped(dropped);
        }
        s = queue.lock();
        if flush > s.flush_done {
            drop(s);
            out.sync();
            s = queue.lock();
            s.flush_done = flush;
            queue.flushed.notify_all();
        }
    }
}

/// Which troubles were already reported on stderr (once each, until they clear).
#[derive(Default)]
struct Reported {
    write: bool,
    rotate: bool,
    sync: bool,
}

/// The file side, owned by the writer thread.
struct Output {
    spec: LogFile,
    /// `None` after a failed open: the next line tries again.
    file: Option<File>,
    /// Bytes in the current file, as far as this thread knows (re-read before rotating).
    len: u64,
    /// Lines that could not be written since the last success.
    lost: u64,
    reported: Reported,
    notices: Notices,
}

impl Output {
    /// One line; a failure is counted and reported, never returned.
    fn write(&mut self, line: &[u8]) {
        if self.lost > 0 {
            let notice = self.notices.render(|| {
                tracing::warn!(
                    lost = self.lost,
                    "the log file could not be written; events were lost"
                )
            });
            if self.put(&notice).is_err() {
                self.lost += 1;
                return;
            }
            self.lost = 0;
        }
        match self.put(line) {
            Ok(()) => self.reported.write = false,
            Err(e) => {
                self.lost += 1;
                if !std::mem::replace(&mut self.reported.write, true) {
                    self.report("cannot write the log file; events are lost until it works again (tried at each event)", &e);
                }
            }
        }
    }

    /// The notice for lines dropped while the queue was full.
    fn dropped(&mut self, n: u64) {
        let notice = self.notices.render(|| {
            tracing::warn!(
                dropped = n,
                "log queue full: events below WARN were dropped"
            )
        });
        self.write(&notice);
    }

    /// Appends a whole line, rotating first when it would take the file past `max_size`.
    fn put(&mut self, line: &[u8]) -> io::Result<()> {
        let n = line.len() as u64;
        if self.file.is_some() && self.len > 0 && self.len + n > self.spec.max_size {
            self.rotate(n);
        }
        if self.file.is_none() {
            let file = open(&self.spec.path)?;
            self.len = file.metadata()?.len();
            self.file = Some(file);
        }
        let Some(file) = self.file.as_mut() else {
            return Err(io::Error::other("no log file open"));
        };
        match file.write_all(line) {
            Ok(()) => {
                self.len += n;
                Ok(())
            }
            Err(e) => {
                // Cut a partly written line off so the next one starts a line of its own; only
                // when the file did grow (another program may have truncated it meanwhile).
                if file.metadata().is_ok_and(|m| m.len() > self.len) {
                    let _ = file.set_len(self.len);
                }
                // Opened again at the next line: the file may have been replaced or its disk
                // remounted.
                self.file = None;
                Err(e)
            }
        }
    }

    /// Shifts the rotated files up by one and starts a new current file. On a failure the
    /// current file stays in use, and the next line tries again.
    fn rotate(&mut self, next: u64) {
        let Some(file) = &self.file else { return };
        // Someone (logrotate's copytruncate) may have emptied the file.
        if let Ok(m) = file.metadata() {
            self.len = m.len();
        }
        if self.len == 0 || self.len + next <= self.spec.max_size {
            return;
        }
        // The rotated file is complete on disk before it gets its final name.
        let _ = file.sync_data();
        let path = &self.spec.path;
        let shifted = shift(path, self.spec.max_files).and_then(|()| {
            match std::fs::rename(path, numbered(path, 1)) {
                // Moved away or deleted by someone else: a new file is started all the same.
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
                other => other,
            }
        });
        match shifted {
            Ok(()) => {
                self.reported.rotate = false;
                self.file = None;
                self.len = 0;
            }
            Err(e) => {
                if !std::mem::replace(&mut self.reported.rotate, true) {
                    self.report(
                        "cannot rotate the log file; it grows past max_size until rotation works (tried at each event)",
                        &e,
                    );
                }
            }
        }
    }

    fn sync(&mut self) {
        let Some(file) = &self.file else { return };
        match file.sync_data() {
            Ok(()) => self.reported.sync = false,
            Err(e) => {
                if !std::mem::replace(&mut self.reported.sync, true) {
                    self.report("cannot sync the log file", &e);
                }
            }
        }
    }

    /// Reports a trouble on stderr (the one place left), formatted like the log itself.
    fn report(&self, what: &str, e: &io::Error) {
        let path = self.spec.path.display();
        let line = self
            .notices
            .render(|| tracing::error!(file = %path, error = %e, "{what}"));
        let _ = io::stderr().write_all(&line);
    }
}

/// Shifts `<path>.1` ... to `.2` ..., the oldest beyond `max_files` dropped, so `.1` is free.
/// Rotated files are consecutive; only those present are touched.
fn shift(path: &Path, max_files: u32) -> io::Result<()> {
    let max_files = max_files.max(1);
    let mut top = 0;
    while top < max_files && std::fs::symlink_metadata(numbered(path, top + 1)).is_ok() {
        top += 1;
    }
    if top == max_files {
        match std::fs::remove_file(numbered(path, top)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        top -= 1;
    }
    for n in (1..=top).rev() {
        std::fs::rename(numbered(path, n), numbered(path, n + 1))?;
    }
    Ok(())
}

/// `<path>.<n>`.
pub fn numbered(path: &Path, n: u32) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".{n}"));
    PathBuf::from(name)
}

/// The writer's own lines (dropped and lost counts, troubles), formatted by a subscriber of their
/// own with the same format as every other line. Not through the global one: its writer is this
/// very thread's queue.
struct Notices {
    dispatch: Dispatch,
    captured: Arc<Mutex<Vec<u8>>>,
}

impl Notices {
    fn new(format: LogFormat) -> Self {
        let captured = Arc::new(Mutex::new(Vec::new()));
        // WARN, not TRACE: a dispatcher's level raises the global maximum that every disabled
        // `debug!` is checked against first.
        let dispatch = super::dispatch(
            LevelFilter::WARN,
            format,
            false,
            Capture(Arc::clone(&captured)),
        );
        Notices { dispatch, captured }
    }

    fn render(&self, event: impl FnOnce()) -> Vec<u8> {
        tracing::dispatcher::with_default(&self.dispatch, event);
        std::mem::take(&mut *self.captured.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

struct Capture(Arc<Mutex<Vec<u8>>>);

impl<'a> MakeWriter<'a> for Capture {
    type Writer = CaptureWriter<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        CaptureWriter(&self.0)
    }
}

struct CaptureWriter<'a>(&'a Mutex<Vec<u8>>);

impl Write for CaptureWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests;
