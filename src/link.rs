//! The link monitor: one per sink, it decides whether the sink's destination is reachable. The link is
//! `up` until `down_after` consecutive transport failures (no answer at all) are reported by the
//! delivery workers; then it is `down`, every worker of the sink waits (no request, no attempt
//! spent), and the monitor probes with jittered exponential backoff from `backoff_base` to
//! `backoff_cap`. The cap is what bounds how late a link's return is noticed, whatever the outage
//! length: a cheap probe (a TCP connect, by default) keeps a short one (2 s) and runs every few
//! seconds forever, spending nothing (on a path that drops packets a connect itself lasts until
//! its SYN retry gets through, within the sink's `timeout`); an expensive one (an HTTP GET) backs off to 60 s. A
//! successful probe only opens a *trial*: workers send again, and the first answer confirms the
//! link `up`; a request without an answer during the trial closes it at once and the probing goes
//! on where its backoff was, the next try waiting at least the trial backoff (to `trial_cap`, 60 s
//! by default), since each trial costs real requests. So a fault above the probe's reach (a TCP
//! probe cannot see a TLS, credentials or timeout problem) is one long outage with trials growing
//! apart, not a flapping link, while a probe that fails again (the destination unreachable once
//! more) makes the next passing probe news worth a trial at once. Each outage is logged once: WARN
//! when down (with the reason and what is queued), INFO when confirmed up (with how long it was
//! down); when it went down and when the next probe runs are read by the metrics endpoint. It does
//! not deliver, retry or pace anything: `delivery` reports to it and waits on it; `agent` starts
//! one monitor task per sink.

use std::future::Future;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;
// tokio's clock, so that the monitor's schedule can be tested with a paused clock; outside tests it
// is the monotonic clock.
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::sink::{LinkConfig, Sink};
use crate::store::writer::StoreHandle;
use crate::units::fmt_duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Up,
    /// A probe succeeded; requests go out, and the first answer confirms the link.
    Trial,
    Down,
}

/// The state of one sink's link, shared by its workers and its monitor.
pub struct Link {
    sink: String,
    config: LinkConfig,
    state: watch::Sender<State>,
    /// Consecutive transport failures since the last answer.
    failures: AtomicU32,
    /// Since when and why the link is down.
    down: Mutex<Option<Outage>>,
    /// When the monitor probes next, while the link is down (none while up or on trial).
    next_probe: Mutex<Option<Instant>>,
    /// Up/down transitions so far (for the metrics endpoint).
    pub transitions: AtomicU64,
    /// How long a trial may pass without an answer or a failure before the probe alone is trusted
    /// (the queue may have emptied meanwhile, e.g. by TTL, and nothing would ever confirm it).
    trial_quiet: Duration,
}

/// The outage in progress.
struct Outage {
    since: Instant,
    /// `since` on the wall clock, for the metrics.
    at: SystemTime,
    reason: String,
}

impl Link {
    pub fn new(sink: &str, config: LinkConfig, trial_quiet: Duration) -> Link {
        Link {
            sink: sink.to_string(),
            config,
            state: watch::Sender::new(State::Up),
            failures: AtomicU32::new(0),
            down: Mutex::new(None),
            next_probe: Mutex::new(None),
            transitions: AtomicU64::new(0),
            trial_quiet,
        }
    }

    /// Whether workers may send (up, or on trial).
    pub fn is_up(&self) -> bool {
        *self.state.borrow() != State::Down
    }

    /// Returns once workers may send (at once when they may).
    pub async fn wait_up(&self) {
        self.wait_for(|s| s != State::Down).await;
    }

    async fn wait_for(&self, f: impl Fn(State) -> bool) {
        let mut rx = self.state.subscribe();
        // The sender lives as long as `self`, so the wait cannot end with an error while borrowed.
        let _ = rx.wait_for(|s| f(*s)).await;
    }

    /// The destination answered (whatever it said): the failure streak ends, a trial succeeds.
    pub fn answered(&self) {
        self.failures.store(0, Ordering::Relaxed);
        if *self.state.borrow() == State::Trial {
            self.state.send_if_modified(|s| {
                let trial = *s == State::Trial;
                if trial {
                    *s = State::Up;
                }
                trial
            });
        }
    }

    /// A request got no answer. Returns the length of the failure streak; at `down_after` the link
    /// goes down, and on trial at once.
    pub fn transport_failed(&self, reason: &str) -> u32 {
        let n = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        let changed = self.state.send_if_modified(|s| match *s {
            State::Trial => {
                *s = State::Down;
                true
            }
            State::Up if n >= self.config.down_after => {
                *s = State::Down;
                true
            }
            _ => false,
        });
        if changed {
            let mut down = self
                .down
                .lock()
                .expect("never poisoned: no panics while held");
            match down.as_mut() {
                // A failed trial: the same outage goes on.
                Some(outage) => outage.reason = reason.to_string(),
                None => {
                    *down = Some(Outage {
                        since: Instant::now(),
                        at: SystemTime::now(),
                        reason: reason.to_string(),
                    });
                    self.transitions.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        n
    }

    /// A probe succeeded: workers may try again.
    fn open_trial(&self) {
        self.plan_probe(None);
        self.failures.store(0, Ordering::Relaxed);
        self.state.send_replace(State::Trial);
    }

    /// The outage is over; returns since when and why the link was down.
    fn confirm_up(&self) -> Option<(Instant, String)> {
        self.plan_probe(None);
        self.state.send_replace(State::Up);
        let was = self
            .down
            .lock()
            .expect("never poisoned: no panics while held")
            .take();
        if was.is_some() {
            self.transitions.fetch_add(1, Ordering::Relaxed);
        }
        was.map(|o| (o.since, o.reason))
    }

    fn plan_probe(&self, at: Option<Instant>) {
        *self
            .next_probe
            .lock()
            .expect("never poisoned: no panics while held") = at;
    }

    /// When the outage in progress began, Unix milliseconds; 0 while up. A trial is still part
    /// of the outage: it ends when the trial is confirmed.
    pub fn down_since_ms(&self) -> u64 {
        let down = self
            .down
            .lock()
            .expect("never poisoned: no panics while held");
        down.as_ref().map_or(0, |o| unix_ms(o.at))
    }

    /// Why the outage in progress began (the failure that took the link down); none while up.
    pub fn down_reason(&self) -> Option<String> {
        self.down
            .lock()
            .expect("never poisoned: no panics while held")
            .as_ref()
            .map(|o| o.reason.clone())
    }

    /// Whether the link is on trial: a probe passed and requests are tried.
    pub fn on_trial(&self) -> bool {
        *self.state.borrow() == State::Trial
    }

    /// When the monitor probes next, Unix milliseconds, while the link is down; 0 while up or on
    /// trial. A time past means that probe is running.
    pub fn next_probe_ms(&self) -> u64 {
        let Some(at) = *self
            .next_probe
            .lock()
            .expect("never poisoned: no panics while held")
        else {
            return 0;
        };
        // The plan is monotonic; on the wall clock it is where it falls from now.
        let (now, wall) = (Instant::now(), SystemTime::now());
        let when = if at >= now {
            wall.checked_add(at - now)
        } else {
            wall.checked_sub(now - at)
        };
        when.map_or(0, unix_ms)
    }

    /// The pause before trying again after `failures` consecutive transport failures while the link
    /// is still up (fewer than `down_after`).
    pub fn pause_after(&self, failures: u32) -> Duration {
        crate::backoff::jittered(
            failures.saturating_sub(1),
            self.config.backoff_base,
            self.config.backoff_cap,
        )
    }
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Watches one sink's link until `stopping`: on every turn down, logs it, probes with backoff until
/// the destination answers, and turns the link up. `streams` are the streams delivered to this sink
/// (for the queued amounts in the log).
pub async fn monitor(
    link: std::sync::Arc<Link>,
    sink: std::sync::Arc<Sink>,
    store: StoreHandle,
    streams: Vec<String>,
    stopping: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = link.wait_for(|s| s == State::Down) => {}
            _ = stopping.cancelled() => return,
        }
        let reason = link
            .down
            .lock()
            .expect("never poisoned: no panics while held")
            .as_ref()
            .map(|o| o.reason.clone())
            .unwrap_or_default();
        let (records, bytes) = queued(&store, &streams).await;
        tracing::warn!(
            sink = link.sink,
            reason,
            queued_records = records,
            queued_bytes = bytes,
            "link down: deliveries paused, no attempts spent; probing until it answers"
        );
        if !probe_until_up(&link, || sink.probe(), &stopping).await {
            return;
        }
        let down_for = link
            .confirm_up()
            .map_or(Duration::ZERO, |(since, _)| since.elapsed());
        let (records, bytes) = queued(&store, &streams).await;
        tracing::info!(
            sink = link.sink,
            down_for = %fmt_duration(down_for),
            down_for_ms = u64::try_from(down_for.as_millis()).unwrap_or(u64::MAX),
            queued_records = records,
            queued_bytes = bytes,
            "link up: deliveries resumed, the backlog replayed in its streams' replay order"
        );
    }
}

/// Probes a down `link` with `probe` until one passes and the trial it opens is confirmed (true),
/// or until `stopping` (false). The waits between probes grow from `backoff_base` to
/// `backoff_cap`, with jitter; after a failed trial the next wait is at least the trial backoff,
/// which grows to `trial_cap` over the trials that fail in a row and starts over once a probe
/// fails (the destination was unreachable since, so its return is news again).
async fn probe_until_up<F, Fut>(link: &Link, mut probe: F, stopping: &CancellationToken) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let cfg = &link.config;
    let probe_wait =
        |tries: u32| crate::backoff::jittered(tries, cfg.backoff_base, cfg.backoff_cap);
    let mut tries = 0u32;
    let mut failed_trials = 0u32;
    let mut wait = probe_wait(tries);
    loop {
        link.plan_probe(Some(Instant::now() + wait));
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stopping.cancelled() => return false,
        }
        tries = tries.saturating_add(1);
        let probed = tokio::select! {
            r = probe() => r,
            _ = stopping.cancelled() => return false,
        };
        if let Err(e) = probed {
            tracing::debug!(sink = link.sink, tries, error = %e, "probe failed");
            failed_trials = 0;
            wait = probe_wait(tries);
            continue;
        }
        link.open_trial();
        tokio::select! {
            // A failure that lands with the quiet timer still means down.
            biased;
            _ = link.wait_for(|s| s == State::Up) => return true,
            _ = link.wait_for(|s| s == State::Down) => {
                tracing::debug!(sink = link.sink, tries, "the probe passed but requests still get no answer");
            }
            _ = stopping.cancelled() => return false,
            _ = tokio::time::sleep(link.trial_quiet) => return true,
        }
        let trial_wait = crate::backoff::jittered(failed_trials, cfg.backoff_base, cfg.trial_cap);
        failed_trials = failed_trials.saturating_add(1);
        wait = probe_wait(tries).max(trial_wait);
    }
}

/// Records and bytes waiting in `streams` (ready and retry).
async fn queued(store: &StoreHandle, streams: &[String]) -> (u64, u64) {
    let Ok(snap) = store.snapshot().await else {
        return (0, 0);
    };
    snap.streams
        .iter()
        .filter(|(cfg, _)| streams.contains(&cfg.name))
        .fold((0, 0), |(r, b), (_, c)| {
            (r + c.pending_records(), b + c.ready_bytes + c.retry_bytes)
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use crate::sink::{CHEAP_PROBE_CAP, EXPENSIVE_PROBE_CAP};

    fn link(down_after: u32) -> Link {
        Link::new(
            "s",
            LinkConfig {
                down_after,
                ..LinkConfig::default()
            },
            Duration::from_secs(30),
        )
    }

    #[test]
    fn down_after_consecutive_failures_only() {
        let l = link(3);
        assert_eq!(l.transport_failed("refused"), 1);
        assert_eq!(l.transport_failed("refused"), 2);
        l.answered();
        assert_eq!(l.transport_failed("refused"), 1);
        assert!(l.is_up());
        l.transport_failed("refused");
        l.transport_failed("refused");
        assert!(!l.is_up());
        assert_eq!(l.transitions.load(Ordering::Relaxed), 1);
        // More failures while down are not new transitions.
        l.transport_failed("refused");
        assert_eq!(l.transitions.load(Ordering::Relaxed), 1);
        // A probe passes; the trial's first request fails: down again at once, same outage.
        l.open_trial();
        assert!(l.is_up());
        l.transport_failed("certificate unknown");
        assert!(!l.is_up());
        assert_eq!(l.transitions.load(Ordering::Relaxed), 1);
        // The next trial gets an answer: up for good.
        l.open_trial();
        l.answered();
        assert_eq!(*l.state.borrow(), State::Up);
        let (_, reason) = l.confirm_up().unwrap();
        assert_eq!(reason, "certificate unknown");
        assert!(l.is_up());
        assert_eq!(l.transitions.load(Ordering::Relaxed), 2);
        assert_eq!(l.transport_failed("x"), 1, "the streak starts over");
        assert!(l.is_up(), "up again: down_after applies");
    }

    #[tokio::test(start_paused = true)]
    async fn workers_wait_while_down_and_resume_when_up() {
        let l = std::sync::Arc::new(link(1));
        l.wait_up().await;
        l.transport_failed("refused");
        let waiter = tokio::spawn({
            let l = std::sync::Arc::clone(&l);
            async move { l.wait_up().await }
        });
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert!(!waiter.is_finished(), "a worker must not run while down");
        l.open_trial();
        tokio::time::timeout(Duration::from_secs(1), waiter)
            .await
            .unwrap()
            .unwrap();
    }

    /// The sink `up` of a config file whose `link:` is `link` (nothing else set), at `url`: what
    /// a file gets by default.
    fn sink(url: &str, link: &str) -> Arc<Sink> {
        let dir = tempfile::tempdir().unwrap();
        let yaml = format!(
            "sinks:\n  up: {{ type: http, url: \"{url}\", link: {{ {link} }} }}\n\
             streams:\n  s: {{ sink: up }}\n"
        );
        let c = crate::config::load_str(&yaml, &dir.path().join("c.yaml"), &|_| None).unwrap();
        let cfg = c.sinks.into_iter().find(|s| s.name == "up").unwrap();
        Arc::new(Sink::new(cfg).unwrap())
    }

    /// A port on 127.0.0.1 that nothing listens on (bound, then closed).
    fn closed_port() -> u16 {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    }

    /// When each probe started, filled by [`probing`].
    type Probes = Arc<Mutex<Vec<Instant>>>;

    /// Takes `link` down and runs its probing in a task with `sink`'s real probe, noting when
    /// each one starts.
    fn probing(link: &Arc<Link>, sink: &Arc<Sink>) -> (Probes, tokio::task::JoinHandle<bool>) {
        for _ in 0..link.config.down_after {
            link.transport_failed("refused");
        }
        assert!(!link.is_up());
        let probes = Probes::default();
        let task = tokio::spawn({
            let (link, sink, probes) = (Arc::clone(link), Arc::clone(sink), Arc::clone(&probes));
            async move {
                let probe = || {
                    probes.lock().unwrap().push(Instant::now());
                    sink.probe()
                };
                probe_until_up(&link, probe, &CancellationToken::new()).await
            }
        });
        (probes, task)
    }

    fn gaps(probes: &Probes) -> Vec<Duration> {
        let p = probes.lock().unwrap();
        p.windows(2).map(|w| w[1] - w[0]).collect()
    }

    /// The default probe (a TCP connect) against a real closed port on 127.0.0.1: however long the
    /// outage (10 s, 10 min, 2 h of failing probes, on tokio's paused clock), probes never grow
    /// more than `CHEAP_PROBE_CAP` (2 s) apart, so once something listens again the link is on
    /// trial within 2 s. The metrics' view follows: down since the outage began, the next probe
    /// at most 2 s ahead, both 0 once up.
    #[tokio::test(start_paused = true)]
    async fn a_cheap_probe_notices_the_return_within_its_cap_after_any_outage() {
        for outage in [10, 600, 7200].map(Duration::from_secs) {
            let port = closed_port();
            let sink = sink(&format!("http://127.0.0.1:{port}/in"), "");
            assert_eq!(sink.config.link.backoff_cap, CHEAP_PROBE_CAP);
            let link = Arc::new(Link::new(
                "up",
                sink.config.link.clone(),
                Duration::from_secs(30),
            ));
            let wall_down = crate::clock::now_ms();
            let (probes, task) = probing(&link, &sink);
            tokio::time::sleep(outage).await;
            assert!(
                !link.is_up(),
                "nothing listens on {port}: every probe fails"
            );
            let n = probes.lock().unwrap().len() as u64;
            assert!(
                n >= outage.as_secs() / CHEAP_PROBE_CAP.as_secs(),
                "{n} probes in {outage:?}"
            );
            let worst = gaps(&probes).into_iter().max().unwrap();
            assert!(
                worst <= CHEAP_PROBE_CAP,
                "probes {worst:?} apart in {outage:?}"
            );
            let since = link.down_since_ms();
            assert!(
                since >= wall_down && since <= crate::clock::now_ms(),
                "{since}"
            );
            // The next probe is planned on the paused clock and shown on the wall clock, which
            // runs on: read between two readings of the wall clock, it is at most 2 s ahead.
            let before = crate::clock::now_ms();
            let next = link.next_probe_ms();
            let after = crate::clock::now_ms();
            assert!(
                next >= before && next <= after + CHEAP_PROBE_CAP.as_millis() as u64,
                "the next probe at {next}, now {before}..{after}"
            );

            let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
                .await
                .unwrap();
            let back = Instant::now();
            tokio::time::timeout(CHEAP_PROBE_CAP, link.wait_up())
                .await
                .unwrap_or_else(|_| panic!("still down {CHEAP_PROBE_CAP:?} after the return"));
            assert!(back.elapsed() <= CHEAP_PROBE_CAP, "{:?}", back.elapsed());
            assert_eq!(link.next_probe_ms(), 0, "no probe planned on trial");
            link.answered();
            assert!(task.await.unwrap(), "the trial confirmed");
            assert!(link.confirm_up().is_some());
            assert_eq!((link.down_since_ms(), link.next_probe_ms()), (0, 0));
            drop(listener);
        }
    }

    /// `probe: http` (a GET: a request at the receiver each time) against a real closed port keeps
    /// the long backoff: from about a second, doubling, to `EXPENSIVE_PROBE_CAP` (60 s), where it
    /// stays however long the outage.
    #[tokio::test(start_paused = true)]
    async fn an_http_probe_backs_off_to_its_cap() {
        let port = closed_port();
        let sink = sink(&format!("http://127.0.0.1:{port}/in"), "probe: http");
        assert_eq!(sink.config.link.backoff_cap, EXPENSIVE_PROBE_CAP);
        let link = Arc::new(Link::new(
            "up",
            sink.config.link.clone(),
            Duration::from_secs(30),
        ));
        let (probes, task) = probing(&link, &sink);
        tokio::time::sleep(Duration::from_secs(30 * 60)).await;
        assert!(!link.is_up());
        let gaps = gaps(&probes);
        assert!(gaps[0] < Duration::from_secs(4), "{gaps:?}");
        assert!(gaps.iter().all(|g| *g <= EXPENSIVE_PROBE_CAP), "{gaps:?}");
        // gaps[k] is the wait after k + 1 failed probes, 2^(k+1) s x 0.5..1.5: from k = 6 on
        // (2^7 x 0.5 s > 60 s) it is the cap.
        assert!(
            gaps[6..].iter().all(|g| *g == EXPENSIVE_PROBE_CAP),
            "at the cap for the rest of the outage: {gaps:?}"
        );
        assert!(gaps.len() < 40, "{} probes in 30 min", gaps.len() + 1);
        task.abort();
    }

    /// A probe that passes while the requests it lets through still get no answer (a TLS or
    /// credentials problem behind a TCP probe): the probes stay cheap and frequent, but each trial
    /// costs requests, so trials back off to `trial_cap` (60 s by default). Once a probe fails (the
    /// destination unreachable again), the next one that passes opens a trial within the probe
    /// cap.
    #[tokio::test(start_paused = true)]
    async fn failed_trials_back_off_while_probes_stay_cheap() {
        let link = Arc::new(link(1));
        assert_eq!(link.config.trial_cap, EXPENSIVE_PROBE_CAP);
        link.transport_failed("refused");
        let reachable = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let task = tokio::spawn({
            let (link, reachable) = (Arc::clone(&link), Arc::clone(&reachable));
            async move {
                let probe = || {
                    let ok = reachable.load(Ordering::Relaxed);
                    async move {
                        if ok {
                            Ok(())
                        } else {
                            Err("refused".to_string())
                        }
                    }
                };
                probe_until_up(&link, probe, &CancellationToken::new()).await
            }
        });
        // A worker whose every request during a trial gets no answer.
        let mut trials = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(15 * 60);
        while Instant::now() < deadline {
            tokio::select! {
                _ = link.wait_up() => {}
                _ = tokio::time::sleep_until(deadline) => break,
            }
            trials.push(Instant::now());
            link.transport_failed("certificate unknown");
        }
        let gaps: Vec<Duration> = trials.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(gaps[0] < Duration::from_secs(4), "{gaps:?}");
        assert!(gaps.iter().all(|g| *g <= EXPENSIVE_PROBE_CAP), "{gaps:?}");
        // gaps[k] is the trial backoff after k + 1 failed trials, 2^k s x 0.5..1.5: from k = 7
        // on (2^7 x 0.5 s > 60 s) it is the cap.
        assert!(
            gaps[7..].iter().all(|g| *g >= EXPENSIVE_PROBE_CAP),
            "trials a minute apart once backed off: {gaps:?}"
        );
        // Unreachable for a while, then back: a trial within the probe cap of its return.
        reachable.store(false, Ordering::Relaxed);
        tokio::time::sleep(EXPENSIVE_PROBE_CAP + CHEAP_PROBE_CAP).await;
        assert!(!link.is_up());
        reachable.store(true, Ordering::Relaxed);
        let back = Instant::now();
        link.wait_up().await;
        assert!(back.elapsed() <= CHEAP_PROBE_CAP, "{:?}", back.elapsed());
        link.answered();
        assert!(task.await.unwrap());
    }
}
