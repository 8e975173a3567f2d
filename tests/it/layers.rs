//! The layer rule of ARCHITECTURE.md, read from the source: every `crate::` path in `src/` names a
//! module on the same layer or a lower one, no two top-level modules import each other, only
//! `store` names redb and only `config` names the YAML library. This reads text, not the compiler's
//! view, so a path built by a macro would escape it; none is.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// ARCHITECTURE.md's table "Layers", bottom up. A module missing here fails the test, so a new
/// module is placed on purpose.
const LAYERS: &[(u8, &[&str])] = &[
    (
        1,
        &[
            "units", "clock", "files", "backoff", "metrics", "notify", "zone", "net", "logging",
            "scrape", "memory", "record",
        ],
    ),
    (2, &["store", "schedule"]),
    (3, &["sink", "source", "task"]),
    (4, &["config"]),
    (
        5,
        &["link", "delivery", "paused", "scheduler", "reload", "admin"],
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
