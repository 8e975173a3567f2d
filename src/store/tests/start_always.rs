//! Start always: a store file that cannot be opened, whatever the damage, is moved aside under a
//! name of its own and the agent's open continues on a fresh store.

use super::*;

/// The file of a small store of `n` jobs, closed.
fn damaged(d: &Dir, damage: impl FnOnce(&mut Vec<u8>)) {
    {
        let mut store = d.open();
        for i in 0..50 {
            append(&mut store, S, &recs(&format!("j{i}"), 20), T0).unwrap();
        }
    }
    let path = d.dir.path().join(DB_FILE);
    let mut bytes = std::fs::read(&path).unwrap();
    damage(&mut bytes);
    std::fs::write(&path, &bytes).unwrap();
}

type Damage = Box<dyn Fn(&mut Vec<u8>)>;

/// Every kind of damage that made `colibri run` exit before (issue 17), and more header damage.
fn damage_classes() -> Vec<(&'static str, Damage)> {
    vec![
        (
            "a flipped byte in the magic number",
            Box::new(|b| b[0] ^= 0x01),
        ),
        ("the first page zeroed", Box::new(|b| b[..4096].fill(0))),
        ("cut to 100 bytes", Box::new(|b| b.truncate(100))),
        ("cut to 5000 bytes", Box::new(|b| b.truncate(5000))),
        ("cut to half", Box::new(|b| b.truncate(b.len() / 2))),
        ("two header bytes at 20", Box::new(|b| flip(b, 20))),
        ("two header bytes at 64", Box::new(|b| flip(b, 64))),
        ("two header bytes at 200", Box::new(|b| flip(b, 200))),
    ]
}

fn flip(b: &mut [u8], at: usize) {
    b[at] ^= 0xff;
    b[at + 1] ^= 0xff;
}

#[test]
fn any_damaged_file_is_moved_aside_and_a_fresh_store_opens() {
    for (name, damage) in damage_classes() {
        let d = Dir::new(vec![stream(S)]);
        damaged(&d, damage);
        let before = std::fs::read(d.dir.path().join(DB_FILE)).unwrap();
        let store = Store::open_or_replace(d.dir.path(), d.storage, &d.streams, false)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        check(&store);
        let aside = store.aside_files();
        if aside.is_empty() {
            // redb read past the damage (a header slot it does not use): the jobs are all there.
            assert_eq!(counters(&store, S).ready_jobs, 50, "{name}");
            continue;
        }
        assert_eq!(aside.len(), 1, "{name}");
        assert_eq!(
            std::fs::read(&aside[0].path).unwrap(),
            before,
            "{name}: kept as it was"
        );
        assert_eq!(counters(&store, S).ready_jobs, 0, "{name}");
        // It counts against storage.max_bytes until removed.
        assert_eq!(store.budget_used(), aside[0].bytes, "{name}");
    }
}

#[test]
fn an_empty_file_is_replaced() {
    let d = Dir::new(vec![stream(S)]);
    std::fs::write(d.dir.path().join(DB_FILE), b"").unwrap();
    let mut store = Store::open_or_replace(d.dir.path(), d.storage, &d.streams, false).unwrap();
    assert!(store.aside_files().is_empty(), "nothing to keep");
    append(&mut store, S, &recs("a", 2), T0).unwrap();
}

#[test]
fn a_second_damaged_file_is_kept_beside_the_first_and_both_count_in_the_budget() {
    let d = Dir::new(vec![stream(S)]).with_storage(StorageConfig {
        max_bytes: 1 << 20,
        min_free: 0,
    });
    for _ in 0..2 {
        damaged(&d, |b| b[0] ^= 0x01);
        drop(Store::open_or_replace(d.dir.path(), d.storage, &d.streams, false).unwrap());
    }
    let mut store = Store::open_or_replace(d.dir.path(), d.storage, &d.streams, false).unwrap();
    let aside = store.aside_files();
    assert_eq!(aside.len(), 2);
    let held: u64 = aside.iter().map(|f| f.bytes).sum();
    assert!(held > 0 && held < 1 << 20, "{held}");
    assert_eq!(store.budget_used(), held);
    // The budget left is what the damaged files do not hold: a batch that fits in 1 MiB but not
    // beside them is refused as full, not as too large.
    let big: Vec<Vec<u8>> = (0..10)
        .map(|i| vec![b'a' + i as u8; ((1 << 20) - held as usize) / 10 + 64])
        .collect();
    match append(&mut store, S, &big, T0) {
        Err(AppendError::Full { reason, .. }) => assert_eq!(reason, FullReason::Budget),
        other => panic!("{other:?}"),
    }
    // Removed by an operator, they no longer count (from the next open).
    for f in &aside {
        std::fs::remove_file(&f.path).unwrap();
    }
    drop(store);
    let mut store = d.open();
    append(&mut store, S, &big, T0).unwrap();
}
