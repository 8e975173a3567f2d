//! MQTT topic filters: checked as the config reads them, and matched against a message's topic to
//! route it to a stream and to tell a message of a configured subscription from one of a
//! subscription an older config left in the broker's session. Pure; called by the config (to
//! check `topics` and `routes`) and by the session driver.

/// Why `filter` is not an MQTT topic filter, or `None` when it is one. `$share/<group>/<filter>`
/// (a shared subscription) is checked as its filter.
pub fn check(filter: &str) -> Option<String> {
    if filter.is_empty() {
        return Some("an empty topic filter".into());
    }
    if filter.contains('\0') {
        return Some(format!("{filter:?} holds a NUL character"));
    }
    let inner = match shared(filter) {
        Some(Ok(f)) => f,
        Some(Err(why)) => return Some(format!("{filter:?}: {why}")),
        None => filter,
    };
    let levels: Vec<&str> = inner.split('/').collect();
    for (i, level) in levels.iter().enumerate() {
        if level.contains('#') && (*level != "#" || i + 1 != levels.len()) {
            return Some(format!(
                "{filter:?}: `#` must be a level of its own and the last one (e.g. plant/#)"
            ));
        }
        if level.contains('+') && *level != "+" {
            return Some(format!(
                "{filter:?}: `+` must be a level of its own (e.g. plant/+/temperature)"
            ));
        }
    }
    None
}

/// `$share/<group>/<filter>`: the filter, or why it is not one; `None` for an unshared filter.
fn shared(filter: &str) -> Option<Result<&str, &'static str>> {
    let rest = filter.strip_prefix("$share/")?;
    Some(match rest.split_once('/') {
        Some((group, f)) if !group.is_empty() && !group.contains(['+', '#']) && !f.is_empty() => {
            Ok(f)
        }
        _ => Err("a shared subscription is $share/<group>/<filter>"),
    })
}

/// Whether `topic` (a topic name, no wildcards) matches `filter`, as a broker matches them: `+`
/// is one level, `#` the rest (the parent level included), and a topic starting with `$` is not
/// matched by a filter starting with a wildcard.
pub fn matches(filter: &str, topic: &str) -> bool {
    let filter = match shared(filter) {
        Some(Ok(f)) => f,
        Some(Err(_)) => return false,
        None => filter,
    };
    if topic.starts_with('$') && filter.starts_with(['+', '#']) {
        return false;
    }
    let mut f = filter.split('/');
    let mut t = topic.split('/');
    loop {
        match (f.next(), t.next()) {
            (Some("#"), _) => return true,
            (Some("+"), Some(_)) => {}
            (Some(a), Some(b)) if a == b => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_match_as_a_broker_matches_them() {
        assert!(matches("a/b", "a/b"));
        assert!(!matches("a/b", "a/b/c"));
        assert!(matches("a/+/c", "a/x/c"));
        assert!(!matches("a/+/c", "a/x/y/c"));
        assert!(matches("a/#", "a"));
        assert!(matches("a/#", "a/b/c"));
        assert!(matches("#", "anything/at/all"));
        assert!(!matches("#", "$SYS/broker/uptime"));
        assert!(matches("$SYS/#", "$SYS/broker/uptime"));
        assert!(matches("+/+", "/x"));
        assert!(matches("$share/g/plant/+", "plant/a"));
        assert!(!matches("a/+", "a"));
    }

    #[test]
    fn bad_filters_are_named() {
        assert!(check("a/#").is_none() && check("+/b/+").is_none() && check("#").is_none());
        assert!(check("$share/grp/a/#").is_none());
        assert!(check("a/#/b").unwrap().contains("`#` must be"));
        assert!(check("a/b#").unwrap().contains("`#` must be"));
        assert!(check("a/x+").unwrap().contains("`+` must be"));
        assert!(check("").unwrap().contains("empty"));
        assert!(
            check("$share/a")
                .unwrap()
                .contains("$share/<group>/<filter>")
        );
    }
}
