//! The walk of a damaged file: which intact jobs it holds, in which stream and table, and which
//! copy of each to keep. It does not write anything (that is `Store::salvage_from`).
//!
//! 1. The live tree: the newest commit slot's table tree (table name -> root page) is walked, then
//!    each colibri table from its root; every leaf reached is *live* and owned by its table. A
//!    table whose walk read every page and every value is *complete*.
//! 2. The scan: every 4 KiB-aligned page of the file, in order, read in bounded windows. Branch
//!    pages give child -> parent edges; table-tree leaves (live or freed copies) give root page ->
//!    table name; leaves of `u64` or `(u64, u64)` keys whose values decode as jobs are job leaves.
//! 3. Attribution of each job leaf: its live owner; else up its parents to a root whose table is
//!    known (one table only); else, when the target store has exactly one stream, that stream.
//! 4. Selection. Copy-on-write leaves old versions of a leaf in freed pages, and a freed page may
//!    hold jobs long delivered. A copy outside the live tree of a *complete* table is never taken:
//!    the live tree says what the table held at the last commit. Only where the live tree is
//!    damaged or missing are freed copies taken, and then a delivered job can come back: sent
//!    twice rather than lost (at-least-once). For one (stream, job id) the live copy wins, else
//!    the copy furthest along (settled offset, attempts, last failure).
//!
//! Memory: a window per page, one leaf at a time (a leaf is at most its largest value plus its
//! tables), and an index of small entries per page and per job found; job values are not kept
//! (`Store::salvage_from` reads them again by offset). Never panics on any bytes.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;

use super::page::{self, Entry, Geometry, PAGE};
use super::source::{ReadAt, Reader};
use crate::store::counters::Counters;
use crate::store::format::{self, Codec};

/// Which of a stream's tables a job was in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Ready,
    Retry,
    Dead,
}

impl Kind {
    fn key_width(self) -> usize {
        match self {
            Kind::Retry => 16,
            _ => 8,
        }
    }
}

/// An intact job found in the file, chosen as its stream's copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundJob {
    pub stream: String,
    pub kind: Kind,
    /// Its id in the damaged file.
    pub id: u64,
    /// Its retry due time (retry table only).
    pub due: u64,
    /// Where its value lies in the file.
    pub at: u64,
    pub len: usize,
    pub records: u64,
    /// Found in the live tree (else in a freed or unreachable page).
    pub live: bool,
    /// The offset of its leaf page.
    pub leaf: u64,
    /// Another live value was found under the same id (a damaged key): which of them really had
    /// it cannot be told, so neither keeps the old key.
    pub twin: bool,
}

/// What the walk found.
#[derive(Debug, Default)]
pub struct Found {
    /// Intact record jobs of streams the target store has, one per (stream, id) (two where a
    /// damaged key gave a live job another's id), by stream, id and place in the file.
    pub jobs: Vec<FoundJob>,
    /// Source checkpoints from the live tree (name, value).
    pub checkpoints: Vec<(String, Vec<u8>)>,
    /// The old file's store id, when its META was readable.
    pub store_id: Option<u64>,
    /// The old file's counters by stream, when its live COUNTERS table was read whole (else
    /// empty: partial counters would not balance).
    pub counters: BTreeMap<String, Counters>,
    /// Jobs (distinct ids) whose values look like jobs but fail their checks, with no intact copy.
    pub damaged: u64,
    /// Intact jobs whose stream could not be told.
    pub unattributable: u64,
    /// Intact jobs of streams the target store does not have, by stream.
    pub unknown_streams: BTreeMap<String, u64>,
    /// Intact file jobs (spooled files): not restored, the `file_move` task re-queues its spool.
    pub file_jobs: u64,
    /// Whether anything says data may be missing: no readable live tree, a live table that could
    /// not be read whole, damaged or unattributable jobs. Checkpoints are not restored then.
    pub in_doubt: bool,
    pub bytes_read: u64,
}

/// What a table name says (`ready/<stream>`, `retry/<stream>`, `dead/<stream>`, ...).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Named {
    Job(String, Kind),
    Checkpoints,
    Counters,
    Meta,
    Other,
}

fn named(name: &str) -> Named {
    let job = |kind, s: &str| Named::Job(s.to_string(), kind);
    if let Some(s) = name.strip_prefix("ready/") {
        job(Kind::Ready, s)
    } else if let Some(s) = name.strip_prefix("retry/") {
        job(Kind::Retry, s)
    } else if let Some(s) = name.strip_prefix("dead/") {
        job(Kind::Dead, s)
    } else if name == "checkpoints" {
        Named::Checkpoints
    } else if name == "counters" {
        Named::Counters
    } else if name == "meta" {
        Named::Meta
    } else {
        Named::Other
    }
}

/// A value that decoded: its version, records, progress (settled offset, attempts, last
/// failure) and whether it carries an error.
type Checked = (u8, u64, (u32, u32, u64), bool);

/// One job-like value in a job leaf.
#[derive(Debug, Clone)]
struct Cand {
    id: u64,
    due: u64,
    at: u64,
    len: usize,
    /// Decoded (and decompressed): (version, records, (offset, attempts, last failure), has an error).
    ok: Option<Checked>,
}

/// A leaf whose values look like jobs.
#[derive(Debug)]
struct JobLeaf {
    at: u64,
    /// Key width when value 0 told it (8: ready/dead, 16: retry); else attribution must.
    width: Option<usize>,
    cands: Vec<Cand>,
}

struct Walker<'a, R: ReadAt + ?Sized> {
    rd: Reader<'a, R>,
    geo: Geometry,
}

/// A leaf read whole: its bytes and entries.
type Leaf = (Vec<u8>, Vec<Entry>);

impl<R: ReadAt + ?Sized> Walker<'_, R> {
    /// The leaf at `start` in `key_w`/`value_w` layout, at most `max` bytes long.
    fn leaf(
        &mut self,
        start: u64,
        max: u64,
        key_w: Option<usize>,
        value_w: Option<usize>,
    ) -> io::Result<Option<Leaf>> {
        let max = max
            .min(page::MAX_LEAF)
            .min(self.rd.len().saturating_sub(start));
        let cap = |n: usize| n as u64 <= max;
        // Read the first page, and the rest only when the leaf says it is longer.
        let mut b = self.rd.read(start, PAGE as usize)?;
        let Some(tables) = page::leaf_tables_len(&b, key_w, value_w) else {
            return Ok(None);
        };
        if tables > b.len() {
            if !cap(tables) {
                return Ok(None);
            }
            b = self.rd.read(start, tables)?;
        }
        let Some(len) = page::leaf_len(&b, key_w, value_w) else {
            return Ok(None);
        };
        if !cap(len) || !page::plausible_len(&b, len, key_w, value_w) {
            return Ok(None);
        }
        if len > b.len() {
            b = self.rd.read(start, len)?;
        }
        b.truncate(len);
        Ok(page::leaf_entries(&b, key_w, value_w).map(|e| (b, e)))
    }

    /// Walks the tree under `root` (a page number), calling `visit` with each leaf (its start and
    /// bytes); returns whether every page was read as a tree page.
    fn walk(
        &mut self,
        root: u64,
        key_w: Option<usize>,
        value_w: Option<usize>,
        mut visit: impl FnMut(u64, &[u8], &[Entry]),
    ) -> io::Result<bool> {
        let mut complete = true;
        let mut seen = HashSet::new();
        let mut stack = vec![(root, 0usize)];
        while let Some((raw, depth)) = stack.pop() {
            let Some(range) = self.geo.range(raw) else {
                complete = false;
                continue;
            };
            if depth > page::MAX_DEPTH || !seen.insert(range.start) {
                complete = false;
                continue;
            }
            let first = self.rd.read(range.start, PAGE as usize)?;
            match first.first() {
                Some(&page::LEAF) => {
                    match self.leaf(range.start, range.end - range.start, key_w, value_w)? {
                        Some((b, entries)) => visit(range.start, &b, &entries),
                        None => complete = false,
                    }
                }
                Some(&page::BRANCH) => match self.branch(range.start, range.end - range.start)? {
                    Some(children) => stack.extend(children.into_iter().map(|c| (c, depth + 1))),
                    None => complete = false,
                },
                _ => complete = false,
            }
        }
        Ok(complete)
    }

    fn branch(&mut self, start: u64, max: u64) -> io::Result<Option<Vec<u64>>> {
        let first = self.rd.read(start, PAGE as usize)?;
        let Some(need) = page::branch_need(&first) else {
            return Ok(None);
        };
        if need as u64 > max {
            return Ok(None);
        }
        let b = self.rd.read(start, need)?;
        Ok(page::branch_children(&b))
    }
}

/// Decodes a job value: its version, records, progress and whether it carries an error; `None`
/// when it fails its checks (a compressed area must decompress too).
fn check_job(v: &[u8]) -> Option<Checked> {
    let d = format::decode(v).ok()?;
    if d.area.codec == Codec::Zstd {
        d.area.plain().ok()?;
    }
    Some((
        d.header.version,
        u64::from(d.header.records),
        (d.offset, d.attempts, d.last_failed_ms),
        d.last_error.is_some(),
    ))
}

fn looks_like_job(v: &[u8]) -> bool {
    matches!(v.first(), Some(1..=3)) && v.len() >= format::HEADER_LEN
}

/// The job values of a leaf read with `width`-byte keys.
fn cands(at: u64, b: &[u8], entries: &[Entry], width: usize) -> Vec<Cand> {
    entries
        .iter()
        .filter_map(|e| {
            let key = b.get(e.key.clone())?;
            let v = b.get(e.value.clone())?;
            if key.len() != width || !looks_like_job(v) {
                return None;
            }
            let (due, id) = match width {
                16 => (page::u64_at(key, 0)?, page::u64_at(key, 8)?),
                _ => (0, page::u64_at(key, 0)?),
            };
            Some(Cand {
                id,
                due,
                at: at + e.value.start as u64,
                len: v.len(),
                ok: check_job(v),
            })
        })
        .collect()
}

/// A COUNTERS key, `(stream, counter name)` as redb lays out a tuple of two strings: the first's
/// length (one byte below 254, else 254 and a u16 LE, or 255 and a u32 LE), the first, the second.
fn counter_key(k: &[u8]) -> Option<(&str, &str)> {
    let (len, at): (usize, usize) = match *k.first()? {
        254 => (
            usize::from(u16::from_le_bytes(k.get(1..3)?.try_into().ok()?)),
            3,
        ),
        255 => (
            usize::try_from(u32::from_le_bytes(k.get(1..5)?.try_into().ok()?)).ok()?,
            5,
        ),
        n => (usize::from(n), 1),
    };
    let end = at.checked_add(len)?;
    let stream = std::str::from_utf8(k.get(at..end)?).ok()?;
    let name = std::str::from_utf8(k.get(end..)?).ok()?;
    Some((stream, name))
}

/// What the scan gathers as it goes, phase after phase.
struct Scan<'a, R: ReadAt + ?Sized> {
    w: Walker<'a, R>,
    found: Found,
    /// Every table name met, and its index in `names`.
    names: Vec<Named>,
    index: HashMap<Named, usize>,
    /// The live tree's table definitions (name, root page), and whether the tree was whole.
    live_defs: Vec<(String, Option<u64>)>,
    tree_whole: bool,
    /// Leaf page -> table, for the leaves the live tree leads to.
    live_owner: HashMap<u64, usize>,
    /// Tables whose live tree was read whole.
    complete: HashSet<usize>,
    /// Page -> the branch pages naming it, of every branch page found.
    parents: HashMap<u64, Vec<u64>>,
    /// Root page -> (table, entries its definition says it held) of every definition found.
    roots: HashMap<u64, Vec<(usize, u64, u64)>>,
    /// Entries under a root read as a table of a key width (`None`: not whole).
    counts: HashMap<(u64, usize), Option<u64>>,
}

/// A candidate job attributed to a table: (stream, kind, live, leaf page, the candidate).
type Attributed = (String, Kind, bool, u64, Cand);

/// Reads the whole of `src` as a damaged colibri store. `streams`: the target store's streams.
pub fn scan<R: ReadAt + ?Sized>(src: &R, streams: &[&str]) -> io::Result<Found> {
    let mut w = Walker {
        rd: Reader::new(src),
        geo: Geometry::default(),
    };
    let header = w.rd.read(0, PAGE as usize)?;
    w.geo = Geometry::from_header(&header);
    let mut s = Scan {
        w,
        found: Found::default(),
        names: Vec::new(),
        index: HashMap::new(),
        live_defs: Vec::new(),
        tree_whole: false,
        live_owner: HashMap::new(),
        complete: HashSet::new(),
        parents: HashMap::new(),
        roots: HashMap::new(),
        counts: HashMap::new(),
    };
    s.live_tree(&header)?;
    let leaves = s.pages()?;
    let (attributed, unattributed) = s.attribute(leaves, streams)?;
    let complete_tables = s.select(attributed, streams);
    let tables_whole = s
        .live_defs
        .iter()
        .filter_map(|(n, _)| match named(n) {
            Named::Job(s, k) => Some((s, k)),
            _ => None,
        })
        .all(|t| complete_tables.contains(&t));
    let whole = !s.live_defs.is_empty() && s.tree_whole && tables_whole;
    let mut found = s.found;
    // With the live tree whole, a page it does not lead to is an old one: nothing in it is lost.
    if !whole {
        found.unattributable = unattributed.len() as u64;
    }
    found.in_doubt = !whole || found.damaged > 0 || found.unattributable > 0;
    found.bytes_read = s.w.rd.bytes_read;
    Ok(found)
}

impl<R: ReadAt + ?Sized> Scan<'_, R> {
    fn intern(&mut self, n: Named) -> usize {
        let names = &mut self.names;
        *self.index.entry(n.clone()).or_insert_with(|| {
            names.push(n);
            names.len() - 1
        })
    }

    /// Phase 1, the live tree: the first header slot whose tree names tables, and every table it names
    /// read (checkpoints, counters and the store id taken as they are read).
    fn live_tree(&mut self, header: &[u8]) -> io::Result<()> {
        for slot in page::slots(header) {
            let mut defs = Vec::new();
            let whole = self.w.walk(slot.user_root, None, None, |_, b, entries| {
                for e in entries {
                    let name = b
                        .get(e.key.clone())
                        .and_then(|k| std::str::from_utf8(k).ok());
                    let def = b.get(e.value.clone()).and_then(page::table_root);
                    if let (Some(name), Some(root)) = (name, def) {
                        defs.push((name.to_string(), root));
                    }
                }
            })?;
            if !defs.is_empty() {
                self.live_defs = defs;
                self.tree_whole = whole;
                break;
            }
        }
        for (name, root) in self.live_defs.clone() {
            self.live_table(&name, root)?;
        }
        Ok(())
    }

    /// One table of the live tree, read from `root`.
    fn live_table(&mut self, name: &str, root: Option<u64>) -> io::Result<()> {
        let n = named(name);
        let (key_w, value_w) = match &n {
            Named::Job(_, kind) => (Some(kind.key_width()), None),
            Named::Checkpoints => (None, None),
            Named::Counters | Named::Meta => (None, Some(8)),
            Named::Other => return Ok(()),
        };
        let t = self.intern(n.clone());
        let Some(root) = root else {
            self.complete.insert(t);
            return Ok(());
        };
        let mut leaves = Vec::new();
        let mut counters = BTreeMap::new();
        let found = &mut self.found;
        let whole = self.w.walk(root, key_w, value_w, |at, b, entries| {
            leaves.push(at);
            for e in entries {
                let (Some(k), Some(v)) = (b.get(e.key.clone()), b.get(e.value.clone())) else {
                    continue;
                };
                match &n {
                    Named::Checkpoints => {
                        if let Ok(k) = std::str::from_utf8(k) {
                            found.checkpoints.push((k.to_string(), v.to_vec()));
                        }
                    }
                    Named::Meta if k == b"store_id" => found.store_id = page::u64_at(v, 0),
                    Named::Counters => {
                        if let (Some((stream, name)), Some(v)) =
                            (counter_key(k), page::u64_at(v, 0))
                        {
                            counters
                                .entry(stream.to_string())
                                .or_insert_with(Counters::default)
                                .set(name, v);
                        }
                    }
                    _ => {}
                }
            }
        })?;
        if whole {
            self.found.counters.append(&mut counters);
            self.complete.insert(t);
        }
        for at in leaves {
            self.live_owner.insert(at, t);
        }
        Ok(())
    }

    /// Phase 2, every page of the file: branch pages (who names whom), job leaves (each width tried),
    /// and table-tree leaves, live or old copies (root page -> table).
    fn pages(&mut self) -> io::Result<Vec<JobLeaf>> {
        let mut leaves: Vec<JobLeaf> = Vec::new();
        let len = self.w.rd.len();
        let mut at = PAGE;
        while at < len {
            let first = self.w.rd.read(at, PAGE as usize)?;
            let mut next = at + PAGE;
            match first.first() {
                Some(&page::BRANCH) => {
                    if let Some(children) = self.w.branch(at, 16 * PAGE)? {
                        for c in children {
                            if let Some(r) = self.w.geo.range(c) {
                                self.parents.entry(r.start).or_default().push(at);
                            }
                        }
                    }
                }
                Some(&page::LEAF) => match self.job_leaf(at, &mut next)? {
                    Some(j) => leaves.push(j),
                    None => self.table_leaf(at)?,
                },
                _ => {}
            }
            at = next;
        }
        Ok(leaves)
    }

    /// The leaf at `at` read as a job table's (8- and 16-byte keys tried), moving `next` past it.
    fn job_leaf(&mut self, at: u64, next: &mut u64) -> io::Result<Option<JobLeaf>> {
        let mut job = None;
        for width in [8, 16] {
            if let Some((b, entries)) = self.w.leaf(at, u64::MAX, Some(width), None)? {
                let c = cands(at, &b, &entries, width);
                let first_ok = entries
                    .first()
                    .and_then(|e| b.get(e.value.clone()))
                    .and_then(check_job)
                    .is_some();
                if c.iter().any(|c| c.ok.is_some()) && (first_ok || job.is_none()) {
                    // The right width decodes value 0; a wrong one never can (its value 0 would
                    // start inside the keys).
                    let whole = (b.len() as u64).div_ceil(PAGE) * PAGE;
                    *next = (*next).max(at + whole);
                    job = Some(JobLeaf {
                        at,
                        width: first_ok.then_some(width),
                        cands: c,
                    });
                    if first_ok {
                        break;
                    }
                }
            }
        }
        Ok(job)
    }

    /// The leaf at `at` read as a table tree's, live or an old copy: root page -> table.
    fn table_leaf(&mut self, at: u64) -> io::Result<()> {
        let Some((b, entries)) = self.w.leaf(at, PAGE * 16, None, None)? else {
            return Ok(());
        };
        for e in &entries {
            let name = b
                .get(e.key.clone())
                .and_then(|k| std::str::from_utf8(k).ok());
            let value = b.get(e.value.clone()).unwrap_or_default();
            let def = page::table_root(value);
            if let (Some(name), Some(Some(root))) = (name, def) {
                let n = named(name);
                if matches!(n, Named::Job(..)) {
                    let t = self.intern(n);
                    let claim = (t, page::table_len(value).unwrap_or(u64::MAX), root);
                    if let Some(r) = self.w.geo.range(root) {
                        let ts = self.roots.entry(r.start).or_default();
                        if !ts.contains(&claim) {
                            ts.push(claim);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// The table a job leaf belongs to. A page freed and used again may be named as the root of
    /// several tables by definitions of different ages. Only claims that fit the leaf's key width
    /// count, and of those, when they still disagree, the ones whose entry count is what the tree
    /// under that root holds now.
    fn owner(&mut self, leaf: u64, width: Option<usize>) -> io::Result<Option<usize>> {
        if let Some(t) = self.live_owner.get(&leaf) {
            return Ok(Some(*t));
        }
        // (root page number, table, entries claimed, key width)
        let mut claims: Vec<(u64, usize, u64, usize)> = Vec::new();
        let mut seen = HashSet::new();
        let mut frontier = vec![leaf];
        while let Some(p) = frontier.pop() {
            if seen.len() > 1 << 16 || !seen.insert(p) {
                continue;
            }
            for &(t, len, raw) in self.roots.get(&p).map(Vec::as_slice).unwrap_or_default() {
                if let Some(Named::Job(_, k)) = self.names.get(t)
                    && width.is_none_or(|w| w == k.key_width())
                {
                    claims.push((raw, t, len, k.key_width()));
                }
            }
            if let Some(ps) = self.parents.get(&p) {
                frontier.extend(ps.iter().copied());
            }
        }
        let one = |claims: &[(u64, usize, u64, usize)]| {
            let mut ts = claims.iter().map(|c| c.1);
            let first = ts.next()?;
            ts.all(|t| t == first).then_some(first)
        };
        if claims.len() <= 1 || one(&claims).is_some() {
            return Ok(one(&claims));
        }
        let mut fitting = Vec::new();
        for c in &claims {
            let (root, _, len, key_w) = *c;
            let n = match self.counts.get(&(root, key_w)) {
                Some(n) => *n,
                None => {
                    let mut n = 0u64;
                    let whole = self
                        .w
                        .walk(root, Some(key_w), None, |_, _, e| n += e.len() as u64)?;
                    let n = whole.then_some(n);
                    self.counts.insert((root, key_w), n);
                    n
                }
            };
            if n == Some(len) {
                fitting.push(*c);
            }
        }
        Ok(one(&fitting))
    }

    /// Phase 3, attribution: each job leaf's candidates to a stream and kind (by the tree that leads to
    /// it, or, with one stream only, by what they are); the ids of intact jobs that could not be.
    fn attribute(
        &mut self,
        leaves: Vec<JobLeaf>,
        streams: &[&str],
    ) -> io::Result<(Vec<Attributed>, HashSet<u64>)> {
        let single = match streams {
            [s] => Some(s.to_string()),
            _ => None,
        };
        let mut attributed: Vec<Attributed> = Vec::new();
        let mut unattributed: HashSet<u64> = HashSet::new();
        for leaf in leaves {
            let live = self.live_owner.contains_key(&leaf.at);
            let by_tree = self
                .owner(leaf.at, leaf.width)?
                .and_then(|t| match self.names.get(t) {
                    Some(Named::Job(s, k)) => Some((t, s.clone(), *k)),
                    _ => None,
                });
            let mut found_cands = leaf.cands;
            let (stream, fixed_kind) = match &by_tree {
                Some((t, s, k)) => {
                    if leaf.width != Some(k.key_width()) {
                        // Value 0 was damaged, or told another width: read the keys as the
                        // table's.
                        found_cands =
                            match self.w.leaf(leaf.at, u64::MAX, Some(k.key_width()), None)? {
                                Some((b, entries)) => cands(leaf.at, &b, &entries, k.key_width()),
                                None => Vec::new(),
                            };
                    }
                    if live && found_cands.iter().any(|c| c.ok.is_none()) {
                        self.complete.remove(t);
                    }
                    (s.clone(), Some(*k))
                }
                None => match (&single, leaf.width) {
                    (Some(s), Some(_)) => (s.clone(), None),
                    _ => {
                        unattributed
                            .extend(found_cands.iter().filter(|c| c.ok.is_some()).map(|c| c.id));
                        continue;
                    }
                },
            };
            for c in found_cands {
                let kind = fixed_kind.unwrap_or(match (leaf.width, c.ok) {
                    (Some(16), _) => Kind::Retry,
                    (_, Some((_, _, _, true))) => Kind::Dead,
                    _ => Kind::Ready,
                });
                attributed.push((stream.clone(), kind, live, leaf.at, c));
            }
        }
        Ok((attributed, unattributed))
    }

    /// Phase 4, selection: per (stream, id) the best copy (live first, then the furthest progress),
    /// both of two live twins, the damaged ones counted; into `found`. Returns the tables read
    /// whole.
    fn select(&mut self, attributed: Vec<Attributed>, streams: &[&str]) -> HashSet<(String, Kind)> {
        let complete_tables: HashSet<(String, Kind)> = self
            .complete
            .iter()
            .filter_map(|t| match self.names.get(*t) {
                Some(Named::Job(s, k)) => Some((s.clone(), *k)),
                _ => None,
            })
            .collect();
        type Best = (bool, (u32, u32, u64), FoundJob, u8);
        let mut best: HashMap<(String, u64), Best> = HashMap::new();
        let mut damaged: HashSet<(String, u64)> = HashSet::new();
        // Two live values under one id: a sound tree has one per key, so a damaged key made one
        // job look like another. Both are kept (each is a job that was queued), marked as twins
        // below.
        let mut live_twins: Vec<(FoundJob, u8)> = Vec::new();
        for (stream, kind, live, leaf, c) in attributed {
            if !live && complete_tables.contains(&(stream.clone(), kind)) {
                continue;
            }
            let Some((version, records, progress, _)) = c.ok else {
                damaged.insert((stream, c.id));
                continue;
            };
            let job = FoundJob {
                stream: stream.clone(),
                kind,
                id: c.id,
                due: c.due,
                at: c.at,
                len: c.len,
                records,
                live,
                leaf,
                twin: false,
            };
            let key = (stream, c.id);
            if let Some((true, _, twin, _)) = best.get(&key)
                && live
                && twin.at != job.at
            {
                live_twins.push((job, version));
                continue;
            }
            let better = match best.get(&key) {
                None => true,
                Some((l, p, _, _)) => (live, progress) > (*l, *p),
            };
            if better {
                best.insert(key, (live, progress, job, version));
            }
        }
        let found = &mut self.found;
        found.damaged = damaged.iter().filter(|k| !best.contains_key(*k)).count() as u64;
        let known: HashSet<&str> = streams.iter().copied().collect();
        let mut jobs = Vec::new();
        let found_jobs = best
            .into_values()
            .map(|(_, _, job, version)| (job, version))
            .chain(live_twins);
        for (job, version) in found_jobs {
            if !known.contains(job.stream.as_str()) {
                *found.unknown_streams.entry(job.stream).or_default() += 1;
            } else if version == format::VERSION_FILE {
                found.file_jobs += 1;
            } else {
                jobs.push(job);
            }
        }
        jobs.sort_by(|a, b| (&a.stream, a.id, a.at).cmp(&(&b.stream, b.id, b.at)));
        for i in 1..jobs.len() {
            if (&jobs[i - 1].stream, jobs[i - 1].id) == (&jobs[i].stream, jobs[i].id) {
                jobs[i - 1].twin = true;
                jobs[i].twin = true;
            }
        }
        found.jobs = jobs;
        complete_tables
    }
}
