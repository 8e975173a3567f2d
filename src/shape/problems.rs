//! The one way every check of the file reports a problem ([`Problems`]: the list being collected
//! and the path of the part being checked) and what a problem is ([`Problem`]). It does not decide
//! what is a problem (each entry's own checks do) nor how problems are shown to the operator
//! (`config` redacts and prints them). Used by `config` and by each component's file shape.

use std::fmt;

/// One problem in the file: where, and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub path: String,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// The one way every check in config reports a problem: the list being collected, and the path of
/// the part being checked, so each section names paths relative to itself and the problem still
/// carries its full path in the file.
pub struct Problems<'p> {
    list: &'p mut Vec<Problem>,
    /// The part's own path; empty at the top of the file.
    at: String,
    /// Between `at` and a path below it: `.` in a mapping (`sinks.out.url`), `: ` after a task
    /// (`tasks[3] "rotate": timeout`), whose name is quoted.
    sep: &'static str,
    /// Whether the listeners' TLS files are read (`config::Unset::Warn` says when not).
    read_keys: bool,
    /// The tree paths of the values `${VAR}` expansion wrote (see [`super::de_all`]).
    expanded: &'p [String],
}

impl<'p> Problems<'p> {
    /// Reports into `list`, paths as given (the top of the file).
    pub fn new(list: &'p mut Vec<Problem>) -> Self {
        Problems {
            list,
            at: String::new(),
            sep: ".",
            read_keys: true,
            expanded: &[],
        }
    }

    /// Reports into `list` for a file whose `${VAR}` expansions wrote the values at `expanded`
    /// (tree paths), reading the listeners' TLS files or not (`read_keys`).
    pub fn of_file(list: &'p mut Vec<Problem>, expanded: &'p [String], read_keys: bool) -> Self {
        Problems {
            expanded,
            read_keys,
            ..Problems::new(list)
        }
    }

    /// Whether the value at `path`, relative to this part, came from `${VAR}` expansion.
    pub fn expanded(&self, path: &str) -> bool {
        let at = tree_path(&self.join(path));
        self.expanded.contains(&at)
    }

    /// Whether a listener's `tls` files are read, or only named (a command that serves nothing).
    pub fn read_keys(&self) -> bool {
        self.read_keys
    }

    /// How many problems the whole list holds so far (a check that wants to know whether its own
    /// part added any compares two counts).
    pub fn count(&self) -> usize {
        self.list.len()
    }

    /// One problem at `path`, relative to this part; `""` is the part itself.
    pub fn add(&mut self, path: &str, message: String) {
        let path = self.join(path);
        self.list.push(Problem { path, message });
    }

    /// A reporter for the mapping entry at `path` (`sinks.out`): paths below it follow a `.`.
    pub fn under(&mut self, path: &str) -> Problems<'_> {
        let at = self.join(path);
        Problems {
            list: &mut *self.list,
            at,
            sep: ".",
            read_keys: self.read_keys,
            expanded: self.expanded,
        }
    }

    /// A reporter for the task shown as `at` (`tasks[3] "rotate"`): paths below it follow a `: `.
    pub fn under_task(&mut self, at: &str) -> Problems<'_> {
        let at = self.join(at);
        Problems {
            list: &mut *self.list,
            at,
            sep: ": ",
            read_keys: self.read_keys,
            expanded: self.expanded,
        }
    }

    fn join(&self, path: &str) -> String {
        match (self.at.is_empty(), path.is_empty()) {
            (true, _) => path.to_string(),
            (false, true) => self.at.clone(),
            (false, false) => format!("{}{}{path}", self.at, self.sep),
        }
    }
}

/// The tree path (as `env` records them) of a problem's path: task problems are shown as
/// `tasks[3] "rotate": schedule`, everything else is shown as its tree path already.
pub fn tree_path(shown: &str) -> String {
    let Some(rest) = shown.strip_prefix("tasks[") else {
        return shown.to_string();
    };
    let Some(close) = rest.find(']') else {
        return shown.to_string();
    };
    let (index, mut rest) = (&rest[..close], &rest[close + 1..]);
    // The name, Debug-quoted: skip to its closing quote.
    if let Some(quoted) = rest.strip_prefix(" \"") {
        let mut escaped = false;
        let end = quoted.char_indices().find_map(|(i, c)| {
            let close = c == '"' && !escaped;
            escaped = c == '\\' && !escaped;
            close.then_some(i)
        });
        rest = end.map_or("", |i| &quoted[i + 1..]);
    }
    match rest.strip_prefix(": ") {
        Some(field) if !field.is_empty() => format!("tasks[{index}].{field}"),
        _ => format!("tasks[{index}]"),
    }
}
