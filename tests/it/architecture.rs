//! ARCHITECTURE.md's code map against `src/`: every path the map names exists, and every module
//! of `src/` (test modules aside) is in the map, by its own path or a folder's. A map that
//! drifted from the code fails here, not in a reader's head.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The paths the code map's rows name in their first cell: `src/a/b.rs`, a folder `src/a/`,
/// `src/a/{b,c}.rs`, and bare names (`c.rs`, `sub/{d,e}.rs`) relative to the folder of the path
/// before them in the cell.
fn mapped(doc: &str) -> Vec<String> {
    let mut out = Vec::new();
    for row in doc.lines().filter(|l| l.starts_with("| `src/")) {
        let cell = row[1..].split(" | ").next().unwrap_or("");
        let mut dir = String::new();
        for (i, part) in cell.split('`').enumerate() {
            // Words in backticks that are not paths (`exec`, a type) are prose.
            let is_path = part.ends_with(".rs") || part.ends_with('/');
            if i % 2 == 0 || !is_path {
                continue;
            }
            let path = if part.starts_with("src/") {
                part.to_string()
            } else {
                format!("{dir}{part}")
            };
            dir = match path.rfind('/') {
                Some(at) if !path.ends_with('/') => path[..=at].to_string(),
                _ => path.clone(),
            };
            out.extend(braces(&path));
        }
    }
    out
}

/// `a/{b,c}.rs` as `a/b.rs` and `a/c.rs`.
fn braces(path: &str) -> Vec<String> {
    match (path.find('{'), path.find('}')) {
        (Some(open), Some(close)) if open < close => path[open + 1..close]
            .split(',')
            .map(|alt| format!("{}{alt}{}", &path[..open], &path[close + 1..]))
            .collect(),
        _ => vec![path.to_string()],
    }
}

/// Every `.rs` file under `dir`, as `src/...` paths, test modules left out.
fn modules(root: &Path, dir: &Path, out: &mut BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path: PathBuf = entry.expect("dir entry").path();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if path.is_dir() {
            if name != "tests" {
                modules(root, &path, out);
            }
        } else if name.ends_with(".rs") && name != "tests.rs" && !name.ends_with("_tests.rs") {
            let rel = path.strip_prefix(root).expect("under the root");
            out.insert(rel.to_string_lossy().into_owned());
        }
    }
}

#[test]
fn the_code_map_names_every_module_and_only_modules_that_exist() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let map = mapped(&doc);
    let mut faults = Vec::new();
    for path in &map {
        if !root.join(path).exists() {
            faults.push(format!("the map names {path}, which does not exist"));
        }
    }
    let mut files = BTreeSet::new();
    modules(root, &root.join("src"), &mut files);
    for file in &files {
        let covered = map
            .iter()
            .any(|m| m == file || (m.ends_with('/') && file.starts_with(m.as_str())));
        if !covered {
            faults.push(format!("{file} is not in the map"));
        }
    }
    assert!(
        faults.is_empty(),
        "ARCHITECTURE.md's code map:\n{}",
        faults.join("\n")
    );
}

#[test]
fn the_map_reader_expands_what_rows_write() {
    let doc = "| `src/a/b.rs`, `c.rs`, `src/d/{e,f}.rs` (+ `g/{h,i}.rs`) | x |\n| `src/j/` | y |";
    assert_eq!(
        mapped(doc),
        [
            "src/a/b.rs",
            "src/a/c.rs",
            "src/d/e.rs",
            "src/d/f.rs",
            "src/d/g/h.rs",
            "src/d/g/i.rs",
            "src/j/"
        ]
    );
}
