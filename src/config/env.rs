//! `${VAR}` and `${VAR:-default}` expansion in the string values of the config file, so a secret or a
//! tuning value can come from the unit file's environment. It runs on the parsed YAML tree (string
//! scalars only, never keys or comments), so a commented-out `${UNSET}` is not an error and an expanded
//! value can never change the file's structure. `$$` writes a literal `$`; a `$` not followed by `{`
//! or `$` is kept as it is. Called by `config::load` before the typed structs are built.

use serde_json::Value;

/// Expands every string in `value` in place. Problems are collected, not returned at the first one:
/// each is `(path, message)` where the path is the JSON-pointer-like location in the file.
pub fn expand_tree(
    value: &mut Value,
    path: &mut String,
    lookup: &dyn Fn(&str) -> Option<String>,
    problems: &mut Vec<(String, String)>,
) {
    match value {
        Value::String(s) => {
            if s.contains('$') {
                match expand(s, lookup) {
                    Ok(out) => *s = out,
                    Err(e) => problems.push((path.clone(), e)),
                }
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                let len = path.len();
                path.push_str(&format!("[{i}]"));
                expand_tree(item, path, lookup, problems);
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
                expand_tree(v, path, lookup, problems);
                path.truncate(len);
            }
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

/// Expands one string. Variable names are `[A-Za-z_][A-Za-z0-9_]*`.
pub fn expand(s: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
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
            match (lookup(name), default) {
                // `:-` means "unset or empty", as in the shell.
                (Some(v), _) if !v.is_empty() || default.is_none() => out.push_str(&v),
                (_, Some(d)) => out.push_str(d),
                (None, None) => {
                    return Err(format!(
                        "environment variable {name} is not set (write ${{{name}:-default}} to give a default)"
                    ));
                }
                (Some(_), None) => unreachable!("matched by the first arm"),
            }
            rest = &body_start[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
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
        let mut problems = Vec::new();
        expand_tree(&mut v, &mut String::new(), &env, &mut problems);
        assert_eq!(v["a"], "s3cret");
        assert_eq!(v["tasks"][0]["command"][1], "4");
        let paths: Vec<&str> = problems.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(paths, ["tasks[0].command[0]", "tasks[1].x"]);
    }
}
