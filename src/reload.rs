//! What a reload changes: [`plan`] compares the running config with a newly loaded one, entry by
//! entry (by what the file said for each task, sink, stream and source, after `${VAR}`
//! expansion), and says what to start, restart and stop, and which settings need a restart of the
//! process (they shape storage or listeners: `data_dir`, `storage`, `streams`, `ingest`, `admin`,
//! `log`, `workers`, `shutdown_grace`); those keep their running values, so the config the plan
//! hands back (`effective`) is the new file with them put back. Pure: the agent applies the plan.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::config::{Config, Fingerprint};
use crate::task::TaskDef;

/// Top-level settings a running process cannot change.
const RESTART_ONLY: &[&str] = &[
    "data_dir",
    "storage",
    "ingest",
    "admin",
    "log",
    "workers",
    "shutdown_grace",
];

#[derive(Debug, Default)]
pub struct Changes<T> {
    pub added: Vec<T>,
    pub changed: Vec<T>,
    pub removed: Vec<String>,
}

impl<T> Changes<T> {
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.changed.is_empty() && self.removed.is_empty()
    }
}

pub struct Plan {
    pub tasks: Changes<Arc<TaskDef>>,
    /// Sink names (their config is in `effective`).
    pub sinks: Changes<String>,
    pub sources: Changes<String>,
    /// Settings that changed in the file but keep their running value until a restart.
    pub needs_restart: Vec<String>,
    pub effective: Config,
}

impl Plan {
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
            && self.sinks.is_empty()
            && self.sources.is_empty()
            && self.needs_restart.is_empty()
    }
}

fn diff(
    old: &BTreeMap<String, String>,
    new: &BTreeMap<String, String>,
) -> (Vec<String>, Vec<String>, Vec<String>) {
    let mut added = Vec::new();
    let mut changed = Vec::new();
    for (k, v) in new {
        match old.get(k) {
            None => added.push(k.clone()),
            Some(o) if o != v => changed.push(k.clone()),
            Some(_) => {}
        }
    }
    let removed = old
        .keys()
        .filter(|k| !new.contains_key(*k))
        .cloned()
        .collect();
    (added, changed, removed)
}

/// Compares `old` (running) with `new` (just loaded and valid).
pub fn plan(old: &Config, mut new: Config) -> Plan {
    let mut needs_restart = restart_only_changes(&old.fingerprint, &new.fingerprint);
    let (sinks, held_sinks) = plan_sinks(old, &mut new, &mut needs_restart);
    let tasks = plan_tasks(old, &mut new, &sinks, &held_sinks, &mut needs_restart);
    let sources = plan_sources(old, &mut new, &held_sinks, &mut needs_restart);
    keep_restart_only(old, &mut new);
    Plan {
        tasks,
        sinks,
        sources,
        needs_restart,
        effective: new,
    }
}

/// The restart-only top-level settings and the streams that changed.
fn restart_only_changes(of: &Fingerprint, nf: &Fingerprint) -> Vec<String> {
    let mut needs_restart: Vec<String> = Vec::new();
    let keys: BTreeSet<&String> = of.top.keys().chain(nf.top.keys()).collect();
    for k in keys {
        if of.top.get(k) != nf.top.get(k) && RESTART_ONLY.contains(&k.as_str()) {
            needs_restart.push(k.clone());
        }
    }
    let (sa, sc, sr) = diff(&of.streams, &nf.streams);
    needs_restart.extend(
        sa.iter()
            .chain(&sc)
            .chain(&sr)
            .map(|s| format!("streams.{s}")),
    );
    needs_restart
}

/// The sinks to start, restart and stop, and those held for the restart (put back as they run
/// in `new`).
fn plan_sinks(
    old: &Config,
    new: &mut Config,
    needs_restart: &mut Vec<String>,
) -> (Changes<String>, BTreeSet<String>) {
    // Sinks: only those a running stream delivers to matter (streams keep their running shape).
    let used: BTreeSet<&str> = old
        .streams
        .iter()
        .filter_map(|s| s.sink.as_deref())
        .collect();
    let (ka, kc, kr) = diff(&old.fingerprint.sinks, &new.fingerprint.sinks);
    // A sink whose records change kind (JSON, line protocol, any line) waits for the restart, and
    // so does what feeds its streams: records checked for one kind must not be sent as the other,
    // and the ingest API (restart-only) checks bodies against what it started with, stamping
    // line-protocol points in the precision it started with (so a precision change waits too
    // while it runs).
    let carried = |c: &Config, name: &str| {
        c.sinks
            .iter()
            .find(|k| k.name == name)
            .map(|k| k.record_format())
    };
    let mut held_sinks: BTreeSet<String> = BTreeSet::new();
    for name in kc.iter().filter(|s| used.contains(s.as_str())) {
        let (Some(was), Some(now)) = (carried(old, name), carried(new, name)) else {
            continue;
        };
        let kind_changed = std::mem::discriminant(&was) != std::mem::discriminant(&now);
        if kind_changed || (was != now && old.ingest.is_some()) {
            needs_restart.push(format!(
                "sinks.{name} (its streams' records change from {} to {}{})",
                was.describe(),
                now.describe(),
                if kind_changed {
                    ""
                } else {
                    " in another precision"
                }
            ));
            held_sinks.insert(name.clone());
        }
    }
    for name in &held_sinks {
        keep_running(&old.sinks, &mut new.sinks, name, |k| &k.name);
        keep_print(&old.fingerprint.sinks, &mut new.fingerprint.sinks, name);
    }
    let sinks = Changes {
        added: ka
            .into_iter()
            .filter(|s| used.contains(s.as_str()))
            .collect(),
        changed: kc
            .into_iter()
            .filter(|s| used.contains(s.as_str()) && !held_sinks.contains(s))
            .collect(),
        removed: kr,
    };
    (sinks, held_sinks)
}

/// The sink a running stream delivers to.
fn sink_of<'a>(old: &'a Config, stream: &str) -> Option<&'a str> {
    old.streams
        .iter()
        .find(|s| s.name == stream)
        .and_then(|s| s.sink.as_deref())
}

/// The tasks to add, re-make and forget; those held for the restart are put back as they run in
/// `new`.
fn plan_tasks(
    old: &Config,
    new: &mut Config,
    sinks: &Changes<String>,
    held_sinks: &BTreeSet<String>,
    needs_restart: &mut Vec<String>,
) -> Changes<Arc<TaskDef>> {
    // A sink that comes back changed may say something its scrapes depend on (the precision
    // their timestamps are written in): those tasks are re-made too.
    let touched: BTreeSet<&str> = sinks
        .added
        .iter()
        .chain(&sinks.changed)
        .map(String::as_str)
        .collect();
    let (ta, tc, tr) = diff(&old.fingerprint.tasks, &new.fingerprint.tasks);
    let mut tasks = Changes {
        added: Vec::new(),
        changed: Vec::new(),
        removed: tr,
    };
    // A task compiled against settings that need a restart (a stream that is not running, a
    // spool under a new data_dir or new storage bounds) waits for the restart too: run now, it
    // would spool or store where nothing delivers.
    let storage_changed = needs_restart
        .iter()
        .any(|k| k == "data_dir" || k == "storage");
    let mut held: Vec<String> = Vec::new();
    for def in &new.tasks {
        let needs = def.action.needs();
        let stream = needs.stream;
        let depends = stream
            .and_then(|st| sink_of(old, st))
            .is_some_and(|k| touched.contains(k))
            && needs.sink_settings;
        let is_new = ta.contains(&def.name);
        if !(is_new || tc.contains(&def.name) || depends) {
            continue;
        }
        let waits = match stream {
            Some(st) if !old.streams.iter().any(|s| s.name == st) => {
                Some(format!("its stream {st:?} is not running"))
            }
            Some(st) if sink_of(old, st).is_some_and(|k| held_sinks.contains(k)) => Some(format!(
                "its stream {st:?} is delivered by a sink that waits for the restart"
            )),
            Some(_) if needs.spool.is_some() && storage_changed => {
                Some("it spools under data_dir, whose settings changed".to_string())
            }
            _ => None,
        };
        if let Some(why) = waits {
            needs_restart.push(format!("tasks.{} ({why})", def.name));
            held.push(def.name.clone());
        } else if is_new {
            tasks.added.push(Arc::clone(def));
        } else {
            tasks.changed.push(Arc::clone(def));
        }
    }
    // Held tasks keep running as they are (or stay absent), so the next reload sees them again.
    for name in &held {
        keep_running(&old.tasks, &mut new.tasks, name, |t| &t.name);
        keep_print(&old.fingerprint.tasks, &mut new.fingerprint.tasks, name);
    }
    tasks
}

/// The sources to start, restart and stop; those feeding a held sink's streams wait with it (put
/// back as they run in `new`).
fn plan_sources(
    old: &Config,
    new: &mut Config,
    held_sinks: &BTreeSet<String>,
    needs_restart: &mut Vec<String>,
) -> Changes<String> {
    let (mut ca, mut cc, cr) = diff(&old.fingerprint.sources, &new.fingerprint.sources);
    let mut held_sources: Vec<String> = Vec::new();
    for src in &new.sources {
        let name = src.name().to_string();
        let touched = ca.contains(&name) || cc.contains(&name);
        let held = src
            .streams()
            .into_iter()
            .find(|s| sink_of(old, s).is_some_and(|k| held_sinks.contains(k)));
        if let (true, Some(stream)) = (touched, held) {
            needs_restart.push(format!(
                "sources.{name} (its stream {stream:?} is delivered by a sink that waits for the restart)"
            ));
            held_sources.push(name);
        }
    }
    ca.retain(|n| !held_sources.contains(n));
    cc.retain(|n| !held_sources.contains(n));
    for name in &held_sources {
        keep_running(&old.sources, &mut new.sources, name, |s| s.name());
        keep_print(&old.fingerprint.sources, &mut new.fingerprint.sources, name);
    }
    Changes {
        added: ca,
        changed: cc,
        removed: cr,
    }
}

/// What cannot change now keeps its running value.
fn keep_restart_only(old: &Config, new: &mut Config) {
    new.data_dir = old.data_dir.clone();
    new.workers = old.workers;
    new.shutdown_grace = old.shutdown_grace;
    new.log_level = old.log_level;
    new.log_format = old.log_format;
    new.log_file = old.log_file.clone();
    new.storage = old.storage;
    new.streams = old.streams.clone();
    new.ingest = old.ingest.clone();
    new.admin = old.admin.clone();
    for k in RESTART_ONLY {
        keep_print(&old.fingerprint.top, &mut new.fingerprint.top, k);
    }
    new.fingerprint.streams = old.fingerprint.streams.clone();
}

/// Puts the running entry `name` back in place of the new one (or leaves it absent, as it is
/// while running), so it goes on as it is until the restart.
fn keep_running<T: Clone>(old: &[T], new: &mut Vec<T>, name: &str, name_of: fn(&T) -> &str) {
    new.retain(|e| name_of(e) != name);
    if let Some(e) = old.iter().find(|e| name_of(e) == name) {
        new.push(e.clone());
    }
}

/// Puts the running fingerprint of `name` back (or its absence), so the next reload sees the
/// same change again.
fn keep_print(old: &BTreeMap<String, String>, new: &mut BTreeMap<String, String>, name: &str) {
    match old.get(name) {
        Some(v) => new.insert(name.to_string(), v.clone()),
        None => new.remove(name),
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn load(dir: &Path, yaml: &str) -> Config {
        crate::config::load_str(yaml, &dir.join("c.yaml"), &|_| None).expect("valid")
    }

    const BASE: &str = r#"
data_dir: data
sinks:
  a: { type: http, url: "http://127.0.0.1:1/a" }
  tsdb: { type: http, url: "http://127.0.0.1:1/write", encoding: influx_line, precision: ms }
streams: { logs: { sink: a }, metrics: { sink: tsdb } }
tasks:
  - { name: keep, type: exec, every: 1m, command: ["/bin/true"] }
  - { name: edit, type: exec, every: 1m, command: ["/bin/true"] }
  - { name: drop, type: exec, every: 1m, command: ["/bin/true"] }
  - { name: scrape, type: http_scrape, every: 1m, url: "http://127.0.0.1:1/m", format: prometheus, stream: metrics }
"#;

    #[test]
    fn only_what_changed_is_touched_and_storage_waits_for_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let old = load(dir.path(), BASE);
        let edited = BASE
            .replace(
                "{ name: edit, type: exec, every: 1m,",
                "{ name: edit, type: exec, every: 5m,",
            )
            .replace(
                "  - { name: drop, type: exec, every: 1m, command: [\"/bin/true\"] }\n",
                "  - { name: new, type: exec, every: 1m, command: [\"/bin/true\"] }\n",
            )
            .replace("data_dir: data", "data_dir: elsewhere\nworkers: 3")
            .replace("precision: ms", "precision: s")
            .replace("logs: { sink: a }", "logs: { sink: a, max_jobs: 5 }");
        let p = plan(&old, load(dir.path(), &edited));
        let names = |v: &[Arc<TaskDef>]| v.iter().map(|d| d.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(&p.tasks.added), ["new"]);
        // The scrape's own entry is the same, but its sink's precision is not.
        assert_eq!(names(&p.tasks.changed), ["edit", "scrape"]);
        assert_eq!(p.tasks.removed, ["drop"]);
        assert_eq!(p.sinks.changed, ["tsdb"]);
        assert!(p.sinks.added.is_empty() && p.sinks.removed.is_empty());
        assert_eq!(p.needs_restart, ["data_dir", "workers", "streams.logs"]);
        // Those keep their running values.
        assert_eq!(p.effective.data_dir, old.data_dir);
        assert_eq!(p.effective.workers, old.workers);
        assert_eq!(p.effective.streams, old.streams);
        // A second reload of the same file finds only the same restart-only settings changed.
        let again = plan(&p.effective, load(dir.path(), &edited));
        assert!(again.tasks.is_empty() && again.sinks.is_empty());
        assert_eq!(again.needs_restart, ["data_dir", "workers", "streams.logs"]);
        // And the unchanged file changes nothing at all.
        assert!(plan(&old, load(dir.path(), BASE)).is_empty());
    }

    #[test]
    fn a_task_on_a_stream_that_is_not_running_waits_for_the_restart() {
        let dir = tempfile::tempdir().unwrap();
        let old = load(dir.path(), BASE);
        let edited = BASE.replace(
            "streams: { logs: { sink: a }, metrics: { sink: tsdb } }",
            "streams: { logs: { sink: a }, metrics: { sink: tsdb }, more: {} }",
        ) + "  - { name: late, type: http_scrape, every: 1m, url: \"http://127.0.0.1:1/m\", format: raw, stream: more }\n";
        let p = plan(&old, load(dir.path(), &edited));
        assert!(p.tasks.is_empty(), "nothing applied: {:?}", p.tasks.added);
        assert_eq!(
            p.needs_restart,
            [
                "streams.more",
                "tasks.late (its stream \"more\" is not running)"
            ]
        );
        assert!(p.effective.tasks.iter().all(|t| t.name != "late"));
        // The next reload of the same file holds it again (until the restart).
        let again = plan(&p.effective, load(dir.path(), &edited));
        assert!(again.tasks.is_empty());
        assert_eq!(again.needs_restart.len(), 2);
    }

    /// A sink whose records change kind waits for the restart with whatever feeds its streams;
    /// with the ingest API on, a precision change waits too (ingest stamps points in the
    /// precision it started with).
    #[test]
    fn a_sink_whose_records_change_kind_waits_for_the_restart_with_its_producers() {
        use crate::record::RecordFormat;
        let dir = tempfile::tempdir().unwrap();
        let base = format!(
            "{BASE}sources:\n  app: {{ type: tail, paths: [/var/log/a.log], stream: logs }}\n"
        );
        let old = load(dir.path(), &base);
        let edited = base
            .replace(
                "a: { type: http, url: \"http://127.0.0.1:1/a\" }",
                "a: { type: http, url: \"http://127.0.0.1:1/a\", encoding: influx_line }",
            )
            .replace(
                "sources:\n  app: { type: tail, paths: [/var/log/a.log], stream: logs }\n",
                "",
            )
            + "  - { name: lp, type: http_scrape, every: 1m, url: \"http://127.0.0.1:1/m\", format: prometheus, stream: logs }\n";
        let p = plan(&old, load(dir.path(), &edited));
        assert!(p.sinks.is_empty(), "{:?}", p.sinks.changed);
        assert!(p.tasks.added.is_empty(), "nothing applied");
        assert_eq!(
            p.needs_restart,
            [
                "sinks.a (its streams' records change from JSON records to influx line protocol)",
                "tasks.lp (its stream \"logs\" is delivered by a sink that waits for the restart)",
            ]
        );
        // The tail source is removed (removing is always safe); the sink keeps running as it was.
        assert_eq!(p.sources.removed, ["app"]);
        assert_eq!(p.effective.record_format("logs"), RecordFormat::Json);
        assert!(p.effective.tasks.iter().all(|t| t.name != "lp"));
        let again = plan(&p.effective, load(dir.path(), &edited));
        assert!(again.sinks.is_empty() && again.tasks.is_empty());
        assert_eq!(again.needs_restart.len(), 2);

        // A changed tail source on a held sink's stream waits as well.
        let edited = base
            .replace(
                "a: { type: http, url: \"http://127.0.0.1:1/a\" }",
                "a: { type: file, path: /tmp }",
            )
            .replace("/var/log/a.log", "/var/log/b.log");
        let p = plan(&old, load(dir.path(), &edited));
        assert!(p.sources.is_empty());
        assert_eq!(
            p.needs_restart,
            [
                "sinks.a (its streams' records change from JSON records to lines)",
                "sources.app (its stream \"logs\" is delivered by a sink that waits for the restart)",
            ]
        );
        assert!(
            matches!(&p.effective.sources[0], crate::source::Source::Tail(t) if t.paths == ["/var/log/a.log"]),
            "the running source is kept"
        );

        // With the ingest API on, a precision change waits; without it, it applies (see above).
        let with_ingest = format!("{BASE}ingest: {{ listen: \"127.0.0.1:9465\" }}\n");
        let old = load(dir.path(), &with_ingest);
        let p = plan(
            &old,
            load(
                dir.path(),
                &with_ingest.replace("precision: ms", "precision: s"),
            ),
        );
        assert!(p.sinks.is_empty() && p.tasks.is_empty());
        assert_eq!(
            p.needs_restart,
            [
                "sinks.tsdb (its streams' records change from influx line protocol to influx line protocol in another precision)"
            ]
        );
    }
}
