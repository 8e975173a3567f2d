//! Reading one entry of the file while collecting every problem in it, not only the first one
//! serde stops at (`de_all`): the refused field is reported with its path, left out, and the entry
//! read again. Owns nothing else; the entries' own checks stay with them. Called by `config`'s
//! compile and by the sink and task readers.

use serde_json::Value;

use super::{Problems, units};

/// `value` read as `T`, with every problem in it reported under `err`, not only the first one
/// serde stops at: the field a problem is at is reported, left out, and the rest read again, so an
/// entry with an unknown key, a wrong type and a value out of range shows all of them (the range
/// is the caller's check, on what is returned). `None` when what is left cannot be read (a required
/// field was bad or missing). A number written as a string is refused (`qos: "1"`), unless the
/// string came from `${VAR}` expansion, which can only give strings: that one is read as the
/// number it holds.
pub fn de_all<T: serde::de::DeserializeOwned>(
    mut value: Value,
    err: &mut Problems<'_>,
) -> Option<T> {
    let mut removed: Vec<Vec<Seg>> = Vec::new();
    // Each round removes a node or turns a string into a number, so this many rounds is enough.
    let rounds = 2 * nodes(&value) + 1;
    for _ in 0..rounds {
        let e = match serde_path_to_error::deserialize::<_, T>(value.clone()) {
            Ok(t) => return Some(t),
            Err(e) => e,
        };
        let shown = e.path().to_string();
        let shown = if shown == "." { String::new() } else { shown };
        let mut at: Vec<Seg> = Vec::new();
        for s in e.path() {
            match s {
                serde_path_to_error::Segment::Seq { index } => at.push(Seg::Index(*index)),
                serde_path_to_error::Segment::Map { key }
                | serde_path_to_error::Segment::Enum { variant: key } => {
                    at.push(Seg::Key(key.clone()))
                }
                serde_path_to_error::Segment::Unknown => {
                    err.add(&shown, e.into_inner().to_string());
                    return None;
                }
            }
        }
        let message = e.into_inner().to_string();
        if message.starts_with(units::QUOTED_NUMBER)
            && err.expanded(&shown)
            && to_number(&mut value, &at)
        {
            continue;
        }
        // A required field left out above: its own problem is already reported.
        let left_out = missing_field(&message).is_some_and(|f| {
            let mut field = at.clone();
            field.push(Seg::Key(f.to_string()));
            removed.contains(&field)
        });
        if !left_out {
            err.add(&shown, message);
        }
        // An element of a list is not removed (the later ones would change index): its list is.
        while matches!(at.last(), Some(Seg::Index(_))) {
            at.pop();
        }
        if at.is_empty() || !remove(&mut value, &at) {
            return None;
        }
        removed.push(at);
    }
    None
}

/// One step of a path into a tree.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seg {
    Key(String),
    Index(usize),
}

fn nodes(v: &Value) -> usize {
    match v {
        Value::Array(items) => 1 + items.iter().map(nodes).sum::<usize>(),
        Value::Object(map) => 1 + map.values().map(nodes).sum::<usize>(),
        _ => 1,
    }
}

fn node_mut<'v>(mut v: &'v mut Value, at: &[Seg]) -> Option<&'v mut Value> {
    for s in at {
        v = match (s, v) {
            (Seg::Key(k), Value::Object(map)) => map.get_mut(k)?,
            (Seg::Index(i), Value::Array(items)) => items.get_mut(*i)?,
            _ => return None,
        };
    }
    Some(v)
}

/// Removes the mapping entry at `at` (whose last step is a key); whether there was one.
fn remove(v: &mut Value, at: &[Seg]) -> bool {
    let Some((Seg::Key(key), parent)) = at.split_last() else {
        return false;
    };
    match node_mut(v, parent) {
        Some(Value::Object(map)) => map.remove(key).is_some(),
        _ => false,
    }
}

/// Turns the string at `at` into the whole number it holds; whether it did.
fn to_number(v: &mut Value, at: &[Seg]) -> bool {
    let Some(node) = node_mut(v, at) else {
        return false;
    };
    let Some(n) = node.as_str().and_then(|s| s.trim().parse::<u64>().ok()) else {
        return false;
    };
    *node = Value::from(n);
    true
}

/// The field serde's "missing field `x`" names.
fn missing_field(message: &str) -> Option<&str> {
    message
        .strip_prefix("missing field `")?
        .split_once('`')
        .map(|(f, _)| f)
}
