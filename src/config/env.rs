//! `${VAR}` and `${VAR:-default}` expansion in the string values of the config file, so a secret or a
//! tuning value can come from the unit file's environment. It runs on the parsed YAML tree (string
//! scalars only, never keys or comments), so a commented-out `${UNSET}` is not an error and an expanded
//! value can never change the file's structure. `$$` writes a literal `$`; a `$` not followed by `{`
//! or `$` is kept as it is. Called by `config::load` before the typed structs are built.
//!
//! Every string that held a reference is recorded as an [`Expansion`] (its path, what the file
//! says, what it became, and which variables were unset), so that `config` can name the variable
//! instead of printing its value in a problem, and report unset variables as warnings where the
//! command can do without them.

use serde_json::Value;

/// One string of the file that held at least one `${VAR}` reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expansion {
    /// Where it is: `sinks.up.headers.Authorization`, `tasks[0].command[1]`.
    pub path: String,
    /// What the file says, e.g. `Bearer ${TOKEN}`: safe to show, it is in the file.
    pub template: String,
    /// What it became: never shown.
    pub value: String,
    /// Variables that were unset (without a default) and tolerated: they expanded to nothing.
    pub unset: Vec<String>,
    /// Variables that were unset or empty and took the default the file writes after `:-`.
    pub defaulted: Vec<String>,
}

impl Expansion {
    /// How a message names this value without showing it: `the value of ${TOKEN}` when the file
    /// holds one reference and nothing else, `the value of "Bearer ${TOKEN}"` otherwise.
    pub fn shown(&self) -> String {
        let t = self.template.as_str();
        let single = t
            .strip_prefix("${")
            .and_then(|r| r.strip_suffix('}'))
            .is_some_and(|body| !body.contains('}') && !body.contains("${"));
        if single {
            let name = t[2..t.len() - 1]
                .split_once(":-")
                .map_or(&t[2..t.len() - 1], |(n, _)| n);
            format!("the value of ${{{name}}}")
        } else {
            format!("the value of {t:?}")
        }
    }
}

/// What expanding a tree found.
#[derive(Debug, Default)]
pub struct Expanded {
    /// `(path, message)`: malformed references and unset variables that are errors.
    pub problems: Vec<(String, String)>,
    /// Every string that held a reference, in file order.
    pub expansions: Vec<Expansion>,
}

/// Expands every string in `value` in place. An unset variable without a default is a problem
/// unless `tolerate_unset(path)` says the command can go on without it: then it expands to nothing
/// and is listed in its [`Expansion`]'s `unset`. Problems are collected, not returned at the first
/// one.
pub fn expand_tree(
    value: &mut Value,
    lookup: &dyn Fn(&str) -> Option<String>,
    tolerate_unset: &dyn Fn(&str) -> bool,
) -> Expanded {
    let mut out = Expanded::default();
    walk(value, &mut String::new(), lookup, tolerate_unset, &mut out);
    out
}

fn walk(
    value: &mut Value,
    path: &mut String,
    lookup: &dyn Fn(&str) -> Option<String>,
    tolerate_unset: &dyn Fn(&str) -> bool,
    out: &mut Expanded,
) {
    match value {
        Value::String(s) => {
            if s.contains('$') {
                match expand_refs(s, lookup, tolerate_unset(path)) {
                    Ok(r) => {
                        if r.references {
                            out.expansions.push(Expansion {
                                path: path.clone(),
                                template: s.clone(),
                                value: r.text.clone(),
                                unset: r.unset,
                                defaulted: r.defaulted,
                            });
                        }
                        *s = r.text;
                    }
                    Err(e) => out.problems.push((path.clone(), e)),
                }
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                let len = path.len();
                path.push_str(&format!("[{i}]"));
                walk(item, path, lookup, tolerate_unset, out);
                path.truncate(len);
            }
        }
        Value::Object(map) => {
            for (k, v) in map.iter_mut() {
                let len = path.len();
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(k);
                walk(v, path, lookup, tolerate_unset, out);
                path.truncate(len);
            }
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

/// Expands one string. Variable names are `[A-Za-z_][A-Za-z0-9_]*`.
pub fn expand(s: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    expand_refs(s, lookup, false).map(|r| r.text)
}

struct Refs {
    text: String,
    /// At least one `${...}` was there (`$$` alone is not a reference).
    references: bool,
    unset: Vec<String>,
    defaulted: Vec<String>,
}

fn expand_refs(
    s: &str,
    lookup: &dyn Fn(&str) -> Option<String>,
    tolerate_unset: bool,
) -> Result<Refs, String> {
    let mut out = String::with_capacity(s.len());
    let mut references = false;
    let mut unset = Vec::new();
    let mut defaulted = Vec::new();
    let mut rest = s;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(body_start) = after.strip_prefix('{') {
            let end = body_start
                .find('}')
                .ok_or_else(|| format!("unterminated ${{ in {s:?} (write $$ for a literal $)"))?;
            let body = &body_start[..end];
            let (name, default) = match body.split_once(":-") {
                Some((n, d)) => (n, Some(d)),
                None => (body, None),
            };
            let valid = name
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !valid {
                return Err(format!(
                    "invalid variable name {name:?} in ${{{body}}} (letters, digits and _ only)"
                ));
            }
            references = true;
            match (lookup(name), default) {
                // `:-` means "unset or empty", as in the shell.
                (Some(v), _) if !v.is_empty() || default.is_none() => out.push_str(&v),
                (_, Some(d)) => {
                    out.push_str(d);
                    defaulted.push(name.to_string());
                }
                (None, None) if tolerate_unset => unset.push(name.to_string()),
                (None, None) => return Err(unset_message(name)),
                (Some(_), None) => unreachable!("matched by the first arm"),
            }
            rest = &body_start[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(Refs {
        text: out,
        references,
        unset,
        defaulted,
    })
}

/// The problem an unset variable without a default is where the command needs it.
pub fn unset_message(name: &str) -> String {
    format!("environment variable {name} is not set (write ${{{name}:-default}} to give a default)")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "TOKEN" => Some("s3cret".into()),
            "EMPTY" => Some(String::new()),
            "N" => Some("4".into()),
            _ => None,
        }
    }

    #[test]
    fn expands_set_unset_and_defaults() {
        assert_eq!(expand("Bearer ${TOKEN}", &env).unwrap(), "Bearer s3cret");
        assert_eq!(expand("${MISSING:-fallback}", &env).unwrap(), "fallback");
        assert_eq!(expand("${TOKEN:-fallback}", &env).unwrap(), "s3cret");
        assert_eq!(expand("${EMPTY:-fallback}", &env).unwrap(), "fallback");
        assert_eq!(expand("${EMPTY}", &env).unwrap(), "");
        assert_eq!(expand("${MISSING:-}", &env).unwrap(), "");
        assert_eq!(expand("a${N}b${N}c", &env).unwrap(), "a4b4c");
        assert_eq!(
            expand("cost: $$5 and $HOME", &env).unwrap(),
            "cost: $5 and $HOME"
        );
        assert_eq!(expand("no dollars", &env).unwrap(), "no dollars");
    }

    #[test]
    fn unset_without_default_is_an_error() {
        let e = expand("x ${MISSING} y", &env).unwrap_err();
        assert!(e.contains("environment variable MISSING is not set"), "{e}");
    }

    #[test]
    fn malformed_references_are_errors() {
        assert!(
            expand("${TOKEN", &env)
                .unwrap_err()
                .contains("unterminated")
        );
        assert!(
            expand("${1X}", &env)
                .unwrap_err()
                .contains("invalid variable name")
        );
        assert!(
            expand("${}", &env)
                .unwrap_err()
                .contains("invalid variable name")
        );
    }

    #[test]
    fn tree_expansion_collects_every_problem_with_its_path() {
        let mut v: Value = serde_json::json!({
            "a": "${TOKEN}",
            "tasks": [ { "command": ["${MISSING}", "${N}"] }, { "x": "${ALSO_MISSING}" } ],
            "n": 3
        });
        let found = expand_tree(&mut v, &env, &|_| false);
        assert_eq!(v["a"], "s3cret");
        assert_eq!(v["tasks"][0]["command"][1], "4");
        let paths: Vec<&str> = found.problems.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(paths, ["tasks[0].command[0]", "tasks[1].x"]);
        let expanded: Vec<&str> = found.expansions.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(expanded, ["a", "tasks[0].command[1]"]);
    }

    #[test]
    fn expansions_record_what_the_file_says_and_what_was_unset() {
        let mut v: Value = serde_json::json!({
            "h": "Bearer ${TOKEN}",
            "n": "${N:-2}",
            "u": "x${MISSING}y",
            "lit": "$$5",
        });
        let found = expand_tree(&mut v, &env, &|path| path == "u");
        assert!(found.problems.is_empty(), "{:?}", found.problems);
        assert_eq!(v["u"], "xy");
        let e: Vec<(&str, String, &[String])> = found
            .expansions
            .iter()
            .map(|e| (e.path.as_str(), e.shown(), &e.unset[..]))
            .collect();
        assert_eq!(
            e,
            [
                ("h", "the value of \"Bearer ${TOKEN}\"".to_string(), &[][..]),
                ("n", "the value of ${N}".to_string(), &[][..]),
                (
                    "u",
                    "the value of \"x${MISSING}y\"".to_string(),
                    &["MISSING".to_string()][..]
                ),
            ]
        );
        // Where it is not tolerated, an unset variable stays an error.
        let mut v: Value = serde_json::json!({ "u": "${MISSING}" });
        let found = expand_tree(&mut v, &env, &|_| false);
        assert_eq!(found.problems.len(), 1);
    }
}
