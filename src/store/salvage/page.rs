//! redb 4.6's on-disk format, as far as the salvager needs it, read without trusting it: the
//! super-header's region geometry and commit slots (`tree_store/page_store/header.rs`), page
//! numbers and where they lie in the file (`page_store/base.rs`, `layout.rs`), leaf and branch
//! pages (`tree_store/btree_base.rs`) and table definitions in the table tree
//! (`tree_store/table_tree_base.rs`). Every offset and length is checked against the bytes at
//! hand; nothing here panics on any input. It knows no colibri table; the walk in `scan` does.

use std::ops::Range;

/// redb's page size (fixed in 4.6) and the granularity of every page's start in the file.
pub const PAGE: u64 = 4096;
/// A leaf's first 4 bytes: type, padding, entry count.
pub const LEAF: u8 = 1;
pub const BRANCH: u8 = 2;
/// The largest leaf the salvager reads (one value of a job far above any batch limit).
pub const MAX_LEAF: u64 = 256 << 20;
/// redb's limit on a tree's depth; a deeper walk is a cycle in damaged pages.
pub const MAX_DEPTH: usize = 128;

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(
        b.get(at..at.checked_add(2)?)?.try_into().ok()?,
    ))
}

pub fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        b.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}

pub fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(
        b.get(at..at.checked_add(8)?)?.try_into().ok()?,
    ))
}

/// Where pages lie: the region geometry from the super-header when it is sane, else redb's
/// defaults for a file colibri creates (4 KiB pages, no region header, 4 GiB regions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    region_header_pages: u64,
    region_pages: u64,
}

impl Default for Geometry {
    fn default() -> Self {
        Geometry {
            region_header_pages: 0,
            region_pages: 1 << 20,
        }
    }
}

impl Geometry {
    /// From the first bytes of the file (magic 0..9, page size 12..16, region header pages
    /// 16..20, region data pages 20..24). The magic is not required: a flipped byte there must
    /// not cost the geometry, and the checks below refuse anything redb would not write.
    pub fn from_header(h: &[u8]) -> Geometry {
        let sane = u32_at(h, 12) == Some(PAGE as u32);
        match (sane, u32_at(h, 16), u32_at(h, 20)) {
            (true, Some(hp), Some(dp)) if hp <= (1 << 20) && (1..=(1 << 20)).contains(&dp) => {
                Geometry {
                    region_header_pages: u64::from(hp),
                    region_pages: u64::from(dp),
                }
            }
            _ => Geometry::default(),
        }
    }

    /// The byte range of a page, from its 8-byte number (index: low 20 bits, fewer for higher
    /// orders; region: next 20; order: top 5); `None` for a number no layout can hold.
    pub fn range(&self, raw: u64) -> Option<Range<u64>> {
        let order = (raw >> 59) as u32;
        if order > 20 {
            return None;
        }
        let index = raw & (0x000F_FFFF >> order);
        let region = (raw >> 20) & 0x000F_FFFF;
        let region_bytes = (self.region_header_pages + self.region_pages).checked_mul(PAGE)?;
        let size = PAGE.checked_shl(order)?;
        let start = PAGE
            .checked_add(region.checked_mul(region_bytes)?)?
            .checked_add(self.region_header_pages.checked_mul(PAGE)?)?
            .checked_add(index.checked_mul(size)?)?;
        Some(start..start.checked_add(size)?)
    }
}

/// A commit slot's data tree root (the table tree) and its transaction id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    pub transaction: u64,
    pub user_root: u64,
}

/// The two commit slots (at 64 and 192, 128 bytes each), newest transaction first. Their
/// checksums are not verified (redb's xxh3 is its own): a slot is only a hint, and its root is
/// trusted only when it reads as a tree.
pub fn slots(h: &[u8]) -> Vec<Slot> {
    let mut out: Vec<Slot> = [64usize, 192]
        .iter()
        .filter_map(|&at| {
            let s = h.get(at..at + 128)?;
            if s.get(1).copied().unwrap_or(0) == 0 {
                return None;
            }
            Some(Slot {
                user_root: u64_at(s, 8)?,
                transaction: u64_at(s, 104)?,
            })
        })
        .collect();
    out.sort_by_key(|s| std::cmp::Reverse(s.transaction));
    out
}

/// The children of a branch page, as page numbers; `None` when the bytes are not one.
/// Layout: type, padding, key count (u16), padding to 8; per child a 16-byte checksum, then per
/// child an 8-byte page number, then the keys.
pub fn branch_children(page: &[u8]) -> Option<Vec<u64>> {
    if page.first() != Some(&BRANCH) {
        return None;
    }
    let keys = usize::from(u16_at(page, 2)?);
    let children = keys + 1;
    let at = 8 + 16 * children;
    if page.len() < at + 8 * children {
        return None;
    }
    (0..children).map(|i| u64_at(page, at + 8 * i)).collect()
}

/// How many bytes of a branch page with `keys` keys must be read to see its children.
pub fn branch_need(first: &[u8]) -> Option<usize> {
    let keys = usize::from(u16_at(first, 2)?);
    Some(8 + 24 * (keys + 1))
}

/// One key-value pair of a leaf, as ranges of the leaf's bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub key: Range<usize>,
    pub value: Range<usize>,
}

/// The bytes a leaf's header and end-offset tables take, for `n` entries.
fn leaf_tables(n: usize, key_w: Option<usize>, value_w: Option<usize>) -> usize {
    4 + 4 * n * usize::from(key_w.is_none()) + 4 * n * usize::from(value_w.is_none())
}

/// A leaf's entry count (never 0) and where its keys begin; `None` when `b` is no leaf.
fn leaf_head(b: &[u8], key_w: Option<usize>, value_w: Option<usize>) -> Option<(usize, usize)> {
    if b.first() != Some(&LEAF) {
        return None;
    }
    let n = usize::from(u16_at(b, 2)?);
    if n == 0 {
        return None;
    }
    Some((n, leaf_tables(n, key_w, value_w)))
}

/// How many bytes a leaf declares it uses, read from its header and end offsets (which must be
/// in `b`): the end of its last value. `None` when the declared layout is impossible.
/// Layout: type, padding, entry count (u16); per entry a key end (u32) unless keys are fixed,
/// per entry a value end (u32) unless values are fixed; keys; values.
pub fn leaf_len(b: &[u8], key_w: Option<usize>, value_w: Option<usize>) -> Option<usize> {
    let (n, tables) = leaf_head(b, key_w, value_w)?;
    let keys_end = match key_w {
        Some(w) => tables.checked_add(w.checked_mul(n)?)?,
        None => u32_at(b, 4 + 4 * (n - 1))? as usize,
    };
    match value_w {
        Some(w) => keys_end.checked_add(w.checked_mul(n)?),
        None => {
            let at = 4 + 4 * n * usize::from(key_w.is_none()) + 4 * (n - 1);
            Some(u32_at(b, at)? as usize)
        }
    }
}

/// Whether a leaf may be `len` bytes long, from what its first page (`b`) shows, before more of
/// it is read: redb splits a leaf that would outgrow one page unless it holds a single pair, so
/// only a one-entry leaf is longer; and a longer one-entry leaf is read only when its value
/// starts as a job does, and, for a version 3 job stored as it is, is exactly as long as its
/// header says. So a damaged or foreign page cannot make the walk read far for nothing.
pub fn plausible_len(b: &[u8], len: usize, key_w: Option<usize>, value_w: Option<usize>) -> bool {
    if len as u64 <= PAGE {
        return true;
    }
    if u16_at(b, 2) != Some(1) || value_w.is_some() {
        return false;
    }
    let key_end = match key_w {
        Some(w) => leaf_tables(1, key_w, value_w) + w,
        None => match u32_at(b, 4) {
            Some(e) => e as usize,
            None => return false,
        },
    };
    let Some(v) = b.get(key_end..) else {
        return false;
    };
    let value_len = len.saturating_sub(key_end) as u64;
    match v.first() {
        Some(1 | 2) => true,
        Some(3) => match (u32_at(v, 17), u64_at(v, 21), v.get(29)) {
            (Some(meta), Some(plain), Some(0)) => {
                31u64.saturating_add(u64::from(meta)).saturating_add(plain) == value_len
            }
            // Compressed: never longer than its records plus zstd's worst case.
            (Some(meta), Some(plain), Some(1)) => {
                value_len <= 31u64 + u64::from(meta) + plain + plain / 128 + 1024
            }
            _ => false,
        },
        _ => false,
    }
}

/// How many bytes must be read to see a leaf's end-offset tables (from its first 4 bytes).
pub fn leaf_tables_len(
    first: &[u8],
    key_w: Option<usize>,
    value_w: Option<usize>,
) -> Option<usize> {
    let n = usize::from(u16_at(first, 2)?);
    Some(leaf_tables(n, key_w, value_w))
}

/// The entries of a leaf whose bytes are all in `b` (at least [`leaf_len`] of them), checked:
/// every key and value within the bytes, in order, not overlapping the tables. `None` otherwise.
pub fn leaf_entries(b: &[u8], key_w: Option<usize>, value_w: Option<usize>) -> Option<Vec<Entry>> {
    let (n, tables) = leaf_head(b, key_w, value_w)?;
    let mut key_ends = Vec::with_capacity(n);
    for i in 0..n {
        key_ends.push(match key_w {
            Some(w) => tables.checked_add(w.checked_mul(i + 1)?)?,
            None => u32_at(b, 4 + 4 * i)? as usize,
        });
    }
    let keys_end = *key_ends.last()?;
    let value_tab = 4 + 4 * n * usize::from(key_w.is_none());
    let mut out = Vec::with_capacity(n);
    let (mut key_at, mut value_at) = (tables, keys_end);
    for (i, &key_end) in key_ends.iter().enumerate() {
        let value_end = match value_w {
            Some(w) => keys_end.checked_add(w.checked_mul(i + 1)?)?,
            None => u32_at(b, value_tab + 4 * i)? as usize,
        };
        if key_end < key_at || value_end < value_at || value_end > b.len() {
            return None;
        }
        out.push(Entry {
            key: key_at..key_end,
            value: value_at..value_end,
        });
        key_at = key_end;
        value_at = value_end;
    }
    Some(out)
}

/// A table's root page number from its definition in the table tree (`None` for an empty
/// table or bytes that are not a definition). Layout: type (3 normal, 4 multimap), length (u64),
/// root non-null (u8), root page number (u64), checksum (16), tree length (u64), then sizes and
/// type names.
pub fn table_root(def: &[u8]) -> Option<Option<u64>> {
    if def.len() < 64 || !matches!(def.first(), Some(3 | 4)) {
        return None;
    }
    match def.get(9)? {
        0 => Some(None),
        _ => Some(Some(u64_at(def, 10)?)),
    }
}

/// How many entries a table definition says its table holds (bytes 1..9).
pub fn table_len(def: &[u8]) -> Option<u64> {
    u64_at(def, 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_numbers_map_to_file_ranges() {
        let g = Geometry::default();
        assert_eq!(g.range(0), Some(4096..8192));
        assert_eq!(g.range(3), Some(4096 + 3 * 4096..4096 + 4 * 4096));
        // Order 2 (16 KiB), index 1.
        assert_eq!(g.range((2u64 << 59) | 1), Some(4096 + 16384..4096 + 32768));
        assert_eq!(g.range(31u64 << 59), None);
        assert_eq!(g.range(u64::MAX), None);
    }

    #[test]
    fn leaves_with_impossible_offsets_are_refused() {
        let mut b = vec![0u8; 64];
        b[0] = LEAF;
        b[2] = 1;
        // One entry, fixed 8-byte key, value end 4 + 4 + 8 + 3 = 19.
        b[4..8].copy_from_slice(&19u32.to_le_bytes());
        let e = leaf_entries(&b, Some(8), None).unwrap();
        assert_eq!(
            e,
            [Entry {
                key: 8..16,
                value: 16..19
            }]
        );
        assert_eq!(leaf_len(&b, Some(8), None), Some(19));
        b[4..8].copy_from_slice(&9u32.to_le_bytes());
        assert_eq!(
            leaf_entries(&b, Some(8), None),
            None,
            "a value before its key"
        );
        b[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(leaf_entries(&b, Some(8), None), None, "past the bytes");
        assert_eq!(leaf_entries(&[LEAF, 0, 9], None, None), None);
        assert_eq!(branch_children(&[BRANCH, 0, 200, 0]), None);
    }
}
