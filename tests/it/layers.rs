//! The layer rule of ARCHITECTURE.md, read from the source: every `crate::` path in `src/` names a
//! module on the same layer or a lower one, no two top-level modules import each other, only
//! `store` names redb and only `config` names the YAML library (it parses the file; the components'
//! file shapes read their entries as JSON values with serde); and within the edges (`sink/`,
//! `source/`, `task/`) no component imports another: what two share lives below both. This reads text, not the compiler's
//! view, so a path built by a macro would escape it; none is.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// ARCHITECTURE.md's table "Layers", bottom up. A module missing here fails the test, so a new
/// module is placed on purpose.
const LAYERS: &[(u8, &[&str])] = &[
    (
        1,
        &[
            "units", "clock", "files", "backoff", "metrics", "counters", "notify", "zone", "net",
            "logging", "scrape", "memory", "record", "setting", "timesync",
        ],
    ),
    (2, &["store", "schedule", "shape"]),
    (3, &["sink", "source", "task"]),
    (4, &["config"]),
    (
        5,
        &[
            "link",
            "delivery",
            "paused",
            "clock_hold",
            "scheduler",
            "reload",
            "admin",
        ],
    ),
    (6, &["agent"]),
    (7, &["cli"]),
];

fn layer_of(module: &str) -> Option<u8> {
    LAYERS
        .iter()
        .find(|(_, modules)| modules.contains(&module))
        .map(|(layer, _)| *layer)
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file of `src/` belongs to (`src/store/tx/mod.rs` -> `store`).
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).expect("under src");
    let first = rel.components().next().expect("a component");
    let name = first.as_os_str().to_string_lossy();
    name.trim_end_matches(".rs").to_string()
}

/// The code of a file without its comments and its unit tests (`#[cfg(test)]` modules may reach
/// anywhere), line by line.
fn code_lines(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("#[cfg(test)]") {
            break;
        }
        if trimmed.starts_with("//") {
            continue;
        }
        let code = match line.find("//") {
            Some(i) if !line[..i].contains('"') => &line[..i],
            _ => line,
        };
        out.push((n + 1, code.to_string()));
    }
    out
}

fn ident(text: &str) -> String {
    text.chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

/// Every `crate::<module>` named in `code`.
fn crate_paths(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        let after = &rest[i + "crate::".len()..];
        if let Some(group) = after.strip_prefix('{') {
            // `crate::{a, b::c}`: the first name of each part at the group's top level.
            let mut depth = 0;
            let mut at_start = true;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => at_start = true,
                    c if at_start && (c.is_ascii_alphanumeric() || c == '_') => {
                        at_start = false;
                        out.push(ident(&group[j..]));
                    }
                    _ => {}
                }
            }
        } else {
            let name = ident(after);
            if !name.is_empty() {
                out.push(name);
            }
        }
        rest = after;
    }
    out
}

#[test]
fn imports_point_down_the_layers_and_never_in_a_loop() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    files.sort();
    let mut faults = Vec::new();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let module = module_of(&src, file);
        if module == "main" || module == "lib" {
            continue;
        }
        let Some(own) = layer_of(&module) else {
            faults.push(format!(
                "src/{module}: not on any layer of the test's table"
            ));
            continue;
        };
        let text = std::fs::read_to_string(file).expect("read source");
        let shown = file.strip_prefix(&src).expect("under src").display();
        for (line, code) in code_lines(&text) {
            for target in crate_paths(&code) {
                if target == module {
                    continue;
                }
                match layer_of(&target) {
                    Some(layer) if layer > own => faults.push(format!(
                        "src/{shown}:{line}: {module} (layer {own}) imports {target} (layer {layer})"
                    )),
                    Some(_) => {
                        edges.entry(module.clone()).or_default().insert(target);
                    }
                    None => faults.push(format!("src/{shown}:{line}: unknown module {target}")),
                }
            }
            if module != "store" && (code.contains("redb::") || code.contains("use redb")) {
                faults.push(format!("src/{shown}:{line}: names redb outside store"));
            }
            if module != "config" && code.contains("serde_saphyr") {
                faults.push(format!(
                    "src/{shown}:{line}: names the YAML library outside config"
                ));
            }
        }
    }
    for (from, targets) in &edges {
        for to in targets {
            if edges.get(to).is_some_and(|back| back.contains(from)) && from < to {
                faults.push(format!("{from} and {to} import each other"));
            }
        }
    }
    assert!(faults.is_empty(), "layer faults:\n{}", faults.join("\n"));
}

/// The edges' kinds, and per kind the modules its components share (below them all); every other
/// module of a kind is a component (a folder, or a file), which imports only itself and these.
const EDGES: &[(&str, &[&str])] = &[
    (
        "sink",
        &[
            "mod",
            "deliver",
            "kind",
            "config",
            "template",
            "local",
            "file_body",
        ],
    ),
    ("source", &["mod", "kind", "config"]),
    ("task", &["mod", "kind"]),
];

/// The module path of a file of `src/` (`src/sink/mqtt/v5.rs` -> `sink::mqtt::v5`, a `mod.rs`
/// the folder's).
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).expect("under src");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| {
            c.as_os_str()
                .to_string_lossy()
                .trim_end_matches(".rs")
                .to_string()
        })
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

/// Every module path `code` names, absolute (`crate::a::b`) or relative (`super::b`, resolved
/// from `here`), as far as its lower-case segments go.
fn module_paths(code: &str, here: &[String]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for start in ["crate::", "super::"] {
        let mut rest = code;
        while let Some(i) = rest.find(start) {
            let before = rest[..i].chars().last();
            rest = &rest[i..];
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
                rest = &rest[start.len()..];
                continue;
            }
            let mut path: Vec<String> = if start == "crate::" {
                rest = &rest["crate::".len()..];
                Vec::new()
            } else {
                let mut base = here.to_vec();
                while let Some(r) = rest.strip_prefix("super::") {
                    base.pop();
                    rest = r;
                }
                base
            };
            loop {
                let name = ident(rest);
                if name.is_empty() || !name.starts_with(|c: char| c.is_ascii_lowercase()) {
                    break;
                }
                rest = &rest[name.len()..];
                path.push(name);
                match rest.strip_prefix("::") {
                    Some(r) => rest = r,
                    None => break,
                }
            }
            out.push(path);
        }
    }
    out
}

/// An edge's kind and component a module path lies in (`None` outside the components: a name
/// with no file or folder of its own under the kind is an item of the kind's `mod.rs`).
fn component(path: &[String]) -> Option<(&str, &str)> {
    let (kind, shared) = EDGES
        .iter()
        .find(|(k, _)| path.first().is_some_and(|p| p == k))?;
    let name = path.get(1)?;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(kind);
    let exists = dir.join(format!("{name}.rs")).exists() || dir.join(name).is_dir();
    (exists && !shared.contains(&name.as_str())).then_some((*kind, name.as_str()))
}

#[test]
fn no_edge_imports_another_edge() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    files.sort();
    let mut faults = Vec::new();
    for file in &files {
        let here = module_path(&src, file);
        let Some((kind, own)) = component(&here) else {
            continue;
        };
        let text = std::fs::read_to_string(file).expect("read source");
        for (line, code) in code_lines(&text) {
            for path in module_paths(&code, &here) {
                let other = match component(&path) {
                    Some(c) if c != (kind, own) => format!("{}::{}", c.0, c.1),
                    // Another kind's shared modules are another edge's too.
                    None if path.first().is_some_and(|p| p != kind)
                        && EDGES
                            .iter()
                            .any(|(k, _)| path.first().is_some_and(|p| p == k)) =>
                    {
                        path.join("::")
                    }
                    _ => continue,
                };
                let shown = file.strip_prefix(&src).expect("under src").display();
                faults.push(format!("src/{shown}:{line}: {kind}::{own} imports {other}"));
            }
        }
    }
    assert!(
        faults.is_empty(),
        "edges importing edges:\n{}",
        faults.join("\n")
    );
}

#[test]
fn the_edge_rule_finds_what_it_must_refuse() {
    let here: Vec<String> = ["sink", "remote_write"].map(String::from).to_vec();
    let paths = module_paths(
        "use super::http::{HttpSink}; use crate::source::tail::x;",
        &here,
    );
    assert_eq!(component(&paths[0]), Some(("source", "tail")));
    assert_eq!(component(&paths[1]), Some(("sink", "http")));
    let nested: Vec<String> = ["sink", "mqtt", "v5"].map(String::from).to_vec();
    let paths = module_paths(
        "use super::common::Polled; use super::super::template;",
        &nested,
    );
    assert_eq!(component(&paths[0]), Some(("sink", "mqtt")));
    assert_eq!(component(&paths[1]), None, "shared below the sinks");
}

#[test]
fn the_layer_table_finds_what_it_must_refuse() {
    let upward = "use crate::config::units::fmt_duration; // a comment naming crate::agent";
    assert_eq!(crate_paths(&code_lines(upward)[0].1), vec!["config"]);
    let grouped = "use crate::{clock::Clock, store::{Store, Tx}, config};";
    assert_eq!(crate_paths(grouped), vec!["clock", "store", "config"]);
    assert_eq!(layer_of("config"), Some(4));
    assert!(layer_of("store") < layer_of("config"));
    let with_tests = "use crate::clock;\n#[cfg(test)]\nmod tests { use crate::agent; }";
    let lines = code_lines(with_tests);
    assert_eq!(lines.len(), 1);
}
