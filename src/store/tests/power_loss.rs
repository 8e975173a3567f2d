//! Power loss: crash images built from what was synced plus a torn subset of what was not; a
//! committed transaction survives, an uncommitted one leaves no trace.

use super::*;

// One run of the workload on a `PowerBackend` records every write, length change and sync with its
// call number, and the call count at which each commit returned Ok. The disk at a power cut before
// call `c` is then: everything up to the last sync before `c` (durable) plus the changes after it
// (unsynced); what was acknowledged is every commit that returned before `c`. A sample of cut
// points is also run for real (the backend fails call `c` and every later one) and must give the
// same disk and the same acknowledgements, which checks the shortcut and the store's error path.

/// A write or length change that reached the OS but not (yet) the disk.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Unsynced {
    Write(u64, Vec<u8>),
    SetLen(u64),
}

fn apply(buf: &mut Vec<u8>, op: &Unsynced) {
    match op {
        Unsynced::Write(off, data) => {
            let at = *off as usize;
            if buf.len() < at + data.len() {
                buf.resize(at + data.len(), 0);
            }
            buf[at..at + data.len()].copy_from_slice(data);
        }
        Unsynced::SetLen(len) => buf.resize(*len as usize, 0),
    }
}

/// A change to the disk, as recorded for replay.
#[derive(Debug, Clone)]
enum Logged {
    Change(Unsynced),
    Sync,
}

/// What the disk holds when the power goes: the synced bytes and the changes since.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct DiskAtCut {
    durable: Vec<u8>,
    unsynced: Vec<Unsynced>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Image {
    /// Only what was synced.
    Durable,
    /// Every unsynced change reached the disk whole.
    Everything,
    /// A random subset of the unsynced writes, each torn to a random prefix of its 512-byte
    /// sectors, and any length the file had since the last sync.
    Random,
}

const SECTOR: u64 = 512;

impl DiskAtCut {
    fn sync(&mut self) {
        for op in std::mem::take(&mut self.unsynced) {
            apply(&mut self.durable, &op);
        }
    }

    fn crash_image(&self, kind: Image, rng: &mut fastrand::Rng) -> Vec<u8> {
        let mut img = self.durable.clone();
        let mut lens = vec![self.durable.len()];
        let mut len = self.durable.len();
        for op in &self.unsynced {
            match op {
                Unsynced::SetLen(l) => len = *l as usize,
                Unsynced::Write(off, d) => len = len.max(*off as usize + d.len()),
            }
            lens.push(len);
        }
        for op in &self.unsynced {
            let Unsynced::Write(off, data) = op else {
                continue;
            };
            let keep = match kind {
                Image::Durable => 0,
                Image::Everything => data.len(),
                Image::Random if rng.bool() => 0,
                Image::Random if rng.bool() => data.len(),
                Image::Random => {
                    // Sectors are aligned on the disk: keep the first k sectors the write touches.
                    let end = off + data.len() as u64;
                    let mut cuts = Vec::new();
                    let mut b = (off / SECTOR + 1) * SECTOR;
                    while b < end {
                        cuts.push((b - off) as usize);
                        b += SECTOR;
                    }
                    cuts.push(data.len());
                    cuts[rng.usize(..cuts.len())]
                }
            };
            if keep > 0 {
                apply(&mut img, &Unsynced::Write(*off, data[..keep].to_vec()));
            }
        }
        let len = match kind {
            Image::Durable => lens[0],
            Image::Everything => *lens.last().unwrap(),
            Image::Random => lens[rng.usize(..lens.len())],
        };
        img.resize(len, 0);
        img
    }
}

#[derive(Debug, Default)]
struct PowerState {
    /// What reads see (the OS page cache).
    live: Vec<u8>,
    disk: DiskAtCut,
    log: Vec<(u64, Logged)>,
    calls: u64,
    /// The call (1-based) at which power goes: it and every later call fail.
    cut_at: Option<u64>,
    /// A lying disk: `sync_data` reports success and makes nothing durable.
    lying_sync: bool,
}

/// A disk that loses power at a chosen call, and records what reached it.
#[derive(Debug, Clone, Default)]
struct PowerBackend(Arc<Mutex<PowerState>>);

impl PowerBackend {
    fn cutting_at(call: u64) -> PowerBackend {
        let b = PowerBackend::default();
        b.0.lock().unwrap().cut_at = Some(call);
        b
    }

    fn call(&self) -> std::io::Result<MutexGuard<'_, PowerState>> {
        let mut s = self.0.lock().unwrap();
        s.calls += 1;
        if s.cut_at.is_some_and(|c| s.calls >= c) {
            return Err(std::io::Error::other("power cut"));
        }
        Ok(s)
    }

    fn calls(&self) -> u64 {
        self.0.lock().unwrap().calls
    }

    fn change(&self, op: Unsynced) -> std::io::Result<()> {
        let mut s = self.call()?;
        apply(&mut s.live, &op);
        let n = s.calls;
        s.log.push((n, Logged::Change(op.clone())));
        s.disk.unsynced.push(op);
        Ok(())
    }
}

impl StorageBackend for PowerBackend {
    fn len(&self) -> std::io::Result<u64> {
        Ok(self.call()?.live.len() as u64)
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        let s = self.call()?;
        let at = offset as usize;
        let src = s
            .live
            .get(at..at + out.len())
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::UnexpectedEof))?;
        out.copy_from_slice(src);
        Ok(())
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.change(Unsynced::SetLen(len))
    }
    fn sync_data(&self) -> std::io::Result<()> {
        let mut s = self.call()?;
        if !s.lying_sync {
            s.disk.sync();
            let n = s.calls;
            s.log.push((n, Logged::Sync));
        }
        Ok(())
    }
    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.change(Unsynced::Write(offset, data.to_vec()))
    }
    fn close(&self) -> std::io::Result<()> {
        self.call().map(drop)
    }
    no_op_locks!();
}

const P: &str = "p";

/// Every job compressed: the power-loss runs prove compressed jobs as durable as plain ones.
fn power_stream() -> StreamConfig {
    StreamConfig {
        compression: AtRest::Always,
        ..stream(P)
    }
}

/// One committed transaction of the power-loss workload.
#[derive(Debug, Clone)]
enum Step {
    /// One job (the batch limit is above 20 records), with the source checkpoint `step <i>`.
    Append(Vec<Vec<u8>>),
    /// Take the oldest jobs and acknowledge them in the same transaction.
    Deliver(usize),
}

/// 60 appends of 1-20 small records, and a delivery after every fourth (so pages get freed and
/// reused).
fn power_steps(seed: u64) -> Vec<Step> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut steps = Vec::new();
    for a in 0..60 {
        let n = rng.usize(1..=20);
        let records = (0..n)
            .map(|r| {
                let mut v = format!("a{a:02}r{r:02}:").into_bytes();
                v.resize(v.len() + rng.usize(0..60), b'~');
                v
            })
            .collect();
        steps.push(Step::Append(records));
        if a % 4 == 3 {
            steps.push(Step::Deliver(rng.usize(1..4)));
        }
    }
    steps
}

fn step_checkpoint(i: usize) -> Vec<u8> {
    format!("step {i}").into_bytes()
}

/// The flaw a control run plants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flaw {
    None,
    /// `Store::unsafe_no_fsync`: commits with `Durability::None`.
    NoFsync,
    /// The disk acknowledges `sync_data` without making anything durable.
    LyingDisk,
}

/// What a run acknowledged before the power went.
#[derive(Debug, Default, PartialEq, Eq)]
struct RunOutcome {
    opened: bool,
    /// Steps whose commit returned Ok.
    acked: Vec<usize>,
    /// The step under way when the power went: its commit may or may not have reached the disk.
    in_doubt: Option<usize>,
}

/// Call counts when the store had opened and when each step's commit had returned.
#[derive(Debug, Default)]
struct Timeline {
    opened_at: Option<u64>,
    done_at: Vec<u64>,
}

fn power_run(
    backend: &PowerBackend,
    steps: &[Step],
    flaw: Flaw,
    opts: OpenOptions,
) -> (RunOutcome, Timeline) {
    // The store id is random (fastrand's thread-local generator); every run must write the same
    // bytes for the replay to be compared with a real run.
    fastrand::seed(0x1d);
    let mut out = RunOutcome::default();
    let mut timeline = Timeline::default();
    let opened = Store::open_backend(backend.clone(), unbounded(), &[power_stream()], opts);
    let Ok(mut store) = opened else {
        return (out, timeline);
    };
    out.opened = true;
    timeline.opened_at = Some(backend.calls());
    match flaw {
        Flaw::None => {}
        Flaw::NoFsync => store.unsafe_no_fsync = true,
        Flaw::LyingDisk => backend.0.lock().unwrap().lying_sync = true,
    }
    for (i, step) in steps.iter().enumerate() {
        let r = (|| -> Result<(), StoreError> {
            let mut tx = store.transaction()?;
            match step {
                Step::Append(records) => {
                    let cp = step_checkpoint(i);
                    tx.append_list(P, records, Some(("src", &cp)), T0)
                        .map_err(|e| match e {
                            AppendError::Store(e) => e,
                            other => panic!("unexpected {other}"),
                        })?;
                }
                Step::Deliver(n) => {
                    for j in tx.take(P, *n, u64::MAX, T0)? {
                        tx.ack(&j.lease)?;
                    }
                }
            }
            tx.commit()
        })();
        match r {
            Ok(()) => {
                out.acked.push(i);
                timeline.done_at.push(backend.calls());
            }
            Err(_) => {
                out.in_doubt = Some(i);
                break;
            }
        }
    }
    // After a cut every call fails: closing must still not panic.
    drop(store);
    (out, timeline)
}

/// What a run that lost power at call `cut` acknowledged, from the uncut run's timeline.
fn outcome_at(timeline: &Timeline, steps: usize, cut: u64) -> RunOutcome {
    let opened = timeline.opened_at.is_some_and(|c| c < cut);
    if !opened {
        return RunOutcome::default();
    }
    let acked: Vec<usize> = (0..timeline.done_at.len())
        .filter(|&i| timeline.done_at[i] < cut)
        .collect();
    let in_doubt = (acked.len() < steps).then_some(acked.len());
    RunOutcome {
        opened,
        acked,
        in_doubt,
    }
}

/// The queue (jobs of records), checkpoint, appended and delivered records after `applied`.
type Expected = (Vec<Vec<Vec<u8>>>, Option<Vec<u8>>, u64, u64);

fn simulate(steps: &[Step], applied: impl Iterator<Item = usize>) -> Expected {
    let mut q: VecDeque<Vec<Vec<u8>>> = VecDeque::new();
    let (mut cp, mut appended, mut delivered) = (None, 0, 0);
    for i in applied {
        match &steps[i] {
            Step::Append(records) => {
                q.push_back(records.clone());
                cp = Some(step_checkpoint(i));
                appended += records.len() as u64;
            }
            Step::Deliver(n) => {
                for _ in 0..*n {
                    if let Some(j) = q.pop_front() {
                        delivered += j.len() as u64;
                    }
                }
            }
        }
    }
    (q.into(), cp, appended, delivered)
}

/// Opens a crash image on a plain in-memory backend and checks that it holds exactly the
/// acknowledged state, or that plus the in-doubt step whole: every acknowledged record, in order,
/// once, with its checkpoint and counters; nothing quarantined.
fn check_image(
    img: &[u8],
    steps: &[Step],
    run: &RunOutcome,
    opts: OpenOptions,
) -> Result<(), String> {
    let mut store = Store::open_backend(
        Locked::with_bytes(img),
        unbounded(),
        &[power_stream()],
        opts,
    )
    .map_err(|e| format!("the crash image does not open: {e}"))?;
    let c = counters(&store, P);
    if !c.balanced() {
        return Err(format!("unbalanced after the crash: {c:?}"));
    }
    let jobs = take_all(&mut store, P, T0);
    if c.ready_jobs != jobs.len() as u64 {
        return Err(format!(
            "ready_jobs {} but {} jobs",
            c.ready_jobs,
            jobs.len()
        ));
    }
    if store.quarantined().map_err(|e| e.to_string())? != 0 {
        return Err("a job was quarantined after the crash".into());
    }
    let got = (
        jobs.into_iter().map(|j| owned(&j)).collect::<Vec<_>>(),
        store.checkpoint("src").map_err(|e| e.to_string())?,
        c.appended_records,
        c.delivered_records,
    );
    let without = simulate(steps, run.acked.iter().copied());
    if got == without {
        return Ok(());
    }
    if let Some(d) = run.in_doubt
        && got == simulate(steps, run.acked.iter().copied().chain([d]))
    {
        return Ok(());
    }
    let want: Vec<&Vec<u8>> = without.0.iter().flatten().collect();
    let have: BTreeSet<&Vec<u8>> = got.0.iter().flatten().collect();
    let missing = want.iter().filter(|r| !have.contains(*r)).count();
    let text = |c: &Option<Vec<u8>>| c.as_ref().map(|c| String::from_utf8_lossy(c).into_owned());
    Err(format!(
        "acknowledged steps {}, in doubt {:?}: {} records expected, {} found, {missing} \
         acknowledged records missing; checkpoint {:?} (expected {:?}); appended {} delivered {} \
         (expected {} {})",
        run.acked.len(),
        run.in_doubt,
        want.len(),
        got.0.iter().flatten().count(),
        text(&got.1),
        text(&without.1),
        got.2,
        got.3,
        without.2,
        without.3,
    ))
}

#[derive(Debug, Default)]
struct PowerReport {
    total_calls: u64,
    cut_points: u64,
    /// Cut points at which the store had not finished opening (nothing acknowledged).
    before_open: u64,
    /// Cut points also run for real, with the same result as the replay.
    real_runs: u64,
    images: u64,
    /// Images that failed the check (losses and panics).
    failures: u64,
    /// Images on which redb panicked.
    panics: u64,
    /// Images that opened and lacked acknowledged state (or held it wrong).
    losses: u64,
    first_loss: Option<String>,
    first_failures: Vec<String>,
}

/// Cuts the power before every `stride`-th storage call of the whole run (opens, reads, writes,
/// syncs and closes alike), `target_cuts` cut points in all, and checks two fixed and
/// `random_images` random crash images at each. Every `real_every`-th cut point is also run for
/// real. Stops at the first cut point that lost acknowledged state when `stop_at_first` is set.
fn power_loss_campaign(
    seed: u64,
    flaw: Flaw,
    opts: OpenOptions,
    target_cuts: u64,
    random_images: usize,
    real_every: u64,
    stop_at_first: bool,
) -> PowerReport {
    let steps = power_steps(seed);
    let mut rng = fastrand::Rng::with_seed(seed ^ 0x5eed);
    let mut report = PowerReport::default();
    let recorder = PowerBackend::default();
    let (run, timeline) = power_run(&recorder, &steps, flaw, opts);
    assert_eq!(
        run.acked.len(),
        steps.len(),
        "the workload must run to completion without a power cut ({flaw:?}): {run:?}"
    );
    report.total_calls = recorder.calls();
    let log = std::mem::take(&mut recorder.0.lock().unwrap().log);
    let stride = (report.total_calls / target_cuts).max(1);
    let mut disk = DiskAtCut::default();
    let mut next = 0;
    let mut cut = 1 + seed % stride;
    while cut <= report.total_calls + 1 {
        while next < log.len() && log[next].0 < cut {
            match &log[next].1 {
                Logged::Sync => disk.sync(),
                Logged::Change(op) => disk.unsynced.push(op.clone()),
            }
            next += 1;
        }
        let run = outcome_at(&timeline, steps.len(), cut);
        if report.cut_points % real_every == 0 {
            let real = PowerBackend::cutting_at(cut);
            let (real_run, _) = power_run(&real, &steps, flaw, opts);
            assert_eq!(real_run, run, "cut at call {cut}: real run vs replay");
            assert!(
                real.0.lock().unwrap().disk == disk,
                "cut at call {cut}: the real run left another disk than the replay"
            );
            report.real_runs += 1;
        }
        report.cut_points += 1;
        if !run.opened {
            report.before_open += 1;
        }
        let mut lost_here = false;
        let kinds = [Image::Durable, Image::Everything]
            .into_iter()
            .chain(std::iter::repeat_n(Image::Random, random_images));
        for kind in kinds {
            let img = disk.crash_image(kind, &mut rng);
            report.images += 1;
            // redb may panic on a file that is no state it ever wrote (a lying disk): that is a
            // failed image too, not a crashed test.
            let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                check_image(&img, &steps, &run, opts)
            }))
            .unwrap_or_else(|p| {
                report.panics += 1;
                let msg = p
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                Err(format!("opening or reading the image panicked: {msg}"))
            });
            let r = match checked {
                // Nothing was acknowledged: the image need not even open, but if it does it must
                // be empty.
                Err(e) if !run.opened && e.starts_with("the crash image does not open") => Ok(()),
                other => other,
            };
            if let Err(e) = r {
                let e = format!("cut at call {cut} ({kind:?} image): {e}");
                report.failures += 1;
                if !e.contains("panicked") {
                    report.losses += 1;
                    lost_here = true;
                    report.first_loss.get_or_insert_with(|| e.clone());
                }
                if report.first_failures.len() < 5 {
                    report.first_failures.push(e);
                }
            }
        }
        if lost_here && stop_at_first {
            break;
        }
        cut += stride;
    }
    report
}

/// With redb's allocator state written at every commit (quick repair, as a file past
/// QUICK_REPAIR_FROM is), and without (a smaller file, walked after a crash).
#[test]
fn power_loss_never_loses_an_acknowledged_record() {
    for quick_repair_from in [0, u64::MAX] {
        power_loss_holds(OpenOptions {
            quick_repair_from,
            ..OpenOptions::default()
        });
    }
}

fn power_loss_holds(opts: OpenOptions) {
    let started = Instant::now();
    // About 400 cut points (every third storage call) keep this near 7 s in a debug build;
    // COLIBRI_POWER_LOSS_EXHAUSTIVE=1 cuts at every call with five random images each.
    let exhaustive = std::env::var_os("COLIBRI_POWER_LOSS_EXHAUSTIVE").is_some();
    let report = if exhaustive {
        power_loss_campaign(1, Flaw::None, opts, u64::MAX, 5, 30, false)
    } else {
        power_loss_campaign(1, Flaw::None, opts, 400, 3, 20, false)
    };
    eprintln!(
        "power loss (quick repair from {} bytes): {} storage calls in the run, {} cut points ({} before the store opened, {} \
         also run for real), {} crash images checked, {} failed ({} panics), in {:?}",
        opts.quick_repair_from,
        report.total_calls,
        report.cut_points,
        report.before_open,
        report.real_runs,
        report.images,
        report.failures,
        report.panics,
        started.elapsed()
    );
    assert!(report.cut_points >= 300, "{report:?}");
    assert_eq!(
        report.failures, 0,
        "acknowledged records lost: {:#?}",
        report.first_failures
    );
}

/// Runs a control campaign and asserts the checker saw acknowledged records go missing.
fn control_catches(flaw: Flaw) {
    let started = Instant::now();
    let report = power_loss_campaign(1, flaw, OpenOptions::default(), 400, 3, 20, true);
    eprintln!(
        "{flaw:?} control: {} cut points, {} images, {} losses, {} panics, in {:?}; first loss: \
         {:?}",
        report.cut_points,
        report.images,
        report.losses,
        report.panics,
        started.elapsed(),
        report.first_loss
    );
    assert!(
        report
            .first_loss
            .as_deref()
            .is_some_and(|l| l.contains("acknowledged records missing")),
        "the checker missed acknowledged records that never reached the disk ({flaw:?}): \
         {report:?}"
    );
}

#[test]
fn power_loss_checker_catches_a_lying_disk() {
    // The same workload on a disk whose fsync reports success and does nothing: acknowledged
    // records must go missing at some cut point, or the checker above proves nothing.
    control_catches(Flaw::LyingDisk);
}

#[test]
fn power_loss_checker_catches_the_planted_no_fsync_bug() {
    control_catches(Flaw::NoFsync);
}

#[test]
fn open_backend_works_on_a_backend_without_locks() {
    let mut store = Store::open_backend(
        InMemoryBackend::new(),
        unbounded(),
        &[stream(S)],
        OpenOptions::default(),
    )
    .expect("open_backend says it opens a store on any redb backend");
    append(&mut store, S, &recs("a", 1), T0).unwrap();
}

/// A power cut during a salvage (issue 17): whatever reached the disk, torn last write included,
/// the store opens balanced and holds a whole number of the salvage's transactions (256 jobs
/// each, the last 88), every job intact and in its old order; never half a chunk, never a damaged
/// job. The next salvage of the file goes on from the last chunk that reached the disk (its
/// progress is in the same transaction): every job once, in order, the counters carried on once.
#[test]
fn a_power_cut_during_a_salvage_keeps_whole_chunks_and_the_next_salvage_goes_on_from_there() {
    const JOBS: usize = 600;
    let dir = tempfile::tempdir().unwrap();
    let cfg = power_stream();
    {
        let mut s = Store::open(
            dir.path(),
            unbounded(),
            std::slice::from_ref(&cfg),
            OpenOptions::default(),
        )
        .unwrap();
        for i in 0..JOBS {
            append(&mut s, P, &recs(&format!("j{i}"), 2), T0).unwrap();
        }
    }
    let damaged = dir.path().join(DB_FILE);
    let mut bytes = std::fs::read(&damaged).unwrap();
    bytes[0] ^= 0x01;
    std::fs::write(&damaged, &bytes).unwrap();

    // The uncut salvage, for the number of calls it makes.
    let open = |b: &PowerBackend| {
        fastrand::seed(0x1d);
        Store::open_backend(
            b.clone(),
            unbounded(),
            std::slice::from_ref(&cfg),
            OpenOptions::default(),
        )
    };
    let full = PowerBackend::default();
    let mut store = open(&full).unwrap();
    let opened_at = full.calls();
    assert_eq!(store.salvage_from(&damaged).unwrap().jobs, JOBS as u64);
    let calls = full.calls();
    drop(store);

    let whole = [0, 256, 512, JOBS];
    let mut rng = fastrand::Rng::with_seed(17);
    let mut seen = BTreeSet::new();
    for k in 1..=60u64 {
        let cut = 1 + (calls - 1) * k / 60;
        let b = PowerBackend::cutting_at(cut);
        if let Ok(mut s) = open(&b) {
            let _ = s.salvage_from(&damaged);
        }
        let disk = b.0.lock().unwrap().disk.clone();
        for kind in [Image::Durable, Image::Everything, Image::Random] {
            let img = disk.crash_image(kind, &mut rng);
            let opened = Store::open_backend(
                Locked::with_bytes(&img),
                unbounded(),
                std::slice::from_ref(&cfg),
                OpenOptions::default(),
            );
            let mut s = match opened {
                Ok(s) => s,
                // Cut while the file was first made: nothing of the salvage was there yet.
                Err(e) if cut <= opened_at => {
                    eprintln!("cut {cut} before the store was made ({e})");
                    continue;
                }
                Err(e) => panic!("cut {cut}, {kind:?}: the image does not open: {e}"),
            };
            check(&s);
            let back = counters(&s, P).ready_jobs as usize;
            assert!(
                whole.contains(&back),
                "cut {cut}, {kind:?}: {back} jobs, not a whole number of chunks"
            );
            seen.insert(back);
            // The next start goes on where the cut salvage stopped: every job once, in order,
            // and the old file's counters carried on once.
            let again = s.salvage_from(&damaged).unwrap();
            assert_eq!(
                (again.put_back_before, again.jobs),
                if again.ended_before {
                    (0, 0)
                } else {
                    (back as u64, (JOBS - back) as u64)
                },
                "cut {cut}, {kind:?}: {again}"
            );
            check(&s);
            let jobs = take_all(&mut s, P, T0);
            assert_eq!(jobs.len(), JOBS, "cut {cut}, {kind:?}");
            for (i, j) in jobs.iter().enumerate() {
                assert_eq!(owned(j), recs(&format!("j{i}"), 2), "cut {cut}, {kind:?}");
            }
            let c = counters(&s, P);
            assert_eq!(
                (
                    c.appended_records,
                    c.salvaging_records,
                    c.lost_to_damage_records
                ),
                (2 * JOBS as u64, 0, 0),
                "cut {cut}, {kind:?}"
            );
        }
    }
    eprintln!("salvaged jobs found after the cuts: {seen:?}");
    assert!(seen.len() >= 3, "the cuts fell between chunks: {seen:?}");
}
