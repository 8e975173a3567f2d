//! Giving memory back to the system once the process no longer uses it: the free memory glibc
//! keeps in its heaps (it keeps what a thread freed for that thread's next allocations), and the
//! pages of the binary's own code and constants that stay mapped into the process after what ran
//! them (start-up, a burst of work) is over. Neither changes what the program computes; where the
//! C library or the kernel has no such call they do nothing. The callers decide when: after
//! start-up and reloads (`agent`), when a tail source goes quiet (`tail`), after a large ingest
//! body (`ingest`), when the store writer goes idle after a drain (`store`), once the config is
//! compiled (`cli`).

/// Both of the below: what start-up or a burst of work used and the idle process does not. About
/// half a millisecond of CPU, most of it mapping back the code that runs next: call it when work
/// ends, not per request.
pub fn give_back() {
    // In this order: reading smaps allocates (tens of KB), and the trim returns that too.
    release_code();
    trim_heap();
}

/// Returns the free memory of every allocator heap to the system: whole free pages inside the
/// heaps, and the tops of the heaps. It walks the heaps under their locks: call it once after a
/// burst, not per request.
pub fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes and returns integers; it only releases pages of free chunks, under
    // each heap's lock, so no live allocation is touched.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Unmaps the pages of the executable's read-only segments (code, constants, unwind tables) from
/// this process; returns the bytes that were resident in them, or `None` where that is not
/// possible. The pages stay in the page cache: the next call of a function there maps its pages
/// again (a minor fault, no disk read while the cache holds them). The kernel maps a file's pages
/// 64 KiB at a time around each fault, so by the time the agent is ready nearly all of its 5.4 MB
/// of code and 0.8 MB of its constants are mapped, most of it for code that only start-up runs
/// (the CLI, the YAML loader, the config checks, TLS and store set-up); a burst of work maps what
/// it ran in the same way. What the idle agent runs comes back: with a tail source and an HTTP
/// sink, 3.8 of 6.2 MB (BENCHMARKS.md, issue 16 part 5). This lowers the process's resident
/// set, not the page cache: the kernel can drop those pages without unmapping them first, and
/// reads them back when that code runs again.
pub fn release_code() -> Option<u64> {
    #[cfg(target_os = "linux")]
    {
        let exe = std::fs::read_link("/proc/self/exe").ok()?;
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let mut released = 0;
        for m in clean_readonly_mappings(&smaps, exe.as_os_str().as_encoded_bytes()) {
            // SAFETY: `m` is a whole mapping of this process (page-aligned start and length, as
            // the kernel lists them): a private, read-only mapping of the executable file in
            // which no page was ever written (`Anonymous: 0 kB`, so every page holds exactly the
            // file's bytes) and none can be written now (read-only; colibri never changes the
            // protection of its own image). MADV_DONTNEED on such a mapping only drops its page
            // table entries: the next access maps the same bytes from the file again, which is
            // what the kernel itself does whenever it reclaims these clean pages under memory
            // pressure. No value any code or reference reads changes.
            let rc =
                unsafe { libc::madvise(m.start as *mut libc::c_void, m.len, libc::MADV_DONTNEED) };
            if rc == 0 {
                released += m.rss;
            }
        }
        Some(released)
    }
    #[cfg(not(target_os = "linux"))]
    {
        None
    }
}

/// A mapping that [`release_code`] may release.
#[derive(Debug, PartialEq, Eq)]
struct Mapping {
    start: usize,
    len: usize,
    /// Resident bytes when smaps was read.
    rss: u64,
}

/// The mappings of `exe` in `smaps` (the text of `/proc/self/smaps`) that are private, not
/// writable and hold no anonymous (written, copied-on-write) page.
fn clean_readonly_mappings(smaps: &str, exe: &[u8]) -> Vec<Mapping> {
    let mut out = Vec::new();
    // The mapping being read, while it still qualifies: (start, len, rss).
    let mut current: Option<(usize, usize, u64)> = None;
    let mut anonymous = None;
    let mut finish = |cur: Option<(usize, usize, u64)>, anon: Option<u64>| {
        if let (Some((start, len, rss)), Some(0)) = (cur, anon) {
            out.push(Mapping { start, len, rss });
        }
    };
    for line in smaps.lines() {
        if let Some(header) = mapping_header(line) {
            finish(current.take(), anonymous.take());
            let (range, perms, path) = header;
            let qualifies = perms.len() == 4
                && perms.as_bytes()[0] == b'r'
                && perms.as_bytes()[1] == b'-'
                && perms.as_bytes()[3] == b'p'
                && path.as_bytes() == exe;
            if qualifies
                && let Some((start, end)) = range.split_once('-')
                && let (Ok(start), Ok(end)) = (
                    usize::from_str_radix(start, 16),
                    usize::from_str_radix(end, 16),
                )
                && end > start
            {
                current = Some((start, end - start, 0));
            }
            continue;
        }
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let kib = || {
            value
                .trim()
                .strip_suffix("kB")
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        match key {
            "Rss" => {
                if let (Some(c), Some(k)) = (&mut current, kib()) {
                    c.2 = k * 1024;
                }
            }
            "Anonymous" => anonymous = kib(),
            _ => {}
        }
    }
    finish(current, anonymous);
    out
}

/// The address range, permissions and path of a mapping's first line in smaps
/// (`start-end perms offset dev inode [path]`); `None` for the `Key: value` lines.
fn mapping_header(line: &str) -> Option<(&str, &str, &str)> {
    let mut fields = line.splitn(6, ' ');
    let range = fields.next()?;
    if !range.contains('-') || range.contains(':') {
        return None;
    }
    let perms = fields.next()?;
    let _offset = fields.next()?;
    let _dev = fields.next()?;
    let _inode = fields.next()?;
    let path = fields.next().map_or("", str::trim_start);
    Some((range, perms, path))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMAPS: &str = "\
00200000-003c1000 r--p 00000000 fe:00 10019292                           /usr/bin/colibri
Size:               1796 kB
Rss:                 832 kB
Anonymous:             0 kB
003c1000-00912000 r-xp 001c0000 fe:00 10019292                           /usr/bin/colibri
Size:               5444 kB
Rss:                5316 kB
Anonymous:             0 kB
00912000-00917000 r--p 00710000 fe:00 10019292                           /usr/bin/colibri
Size:                 20 kB
Rss:                  20 kB
Anonymous:            20 kB
00917000-0091c000 rw-p 00714000 fe:00 10019292                           /usr/bin/colibri
Size:                 20 kB
Rss:                  20 kB
Anonymous:             8 kB
0091c000-00922000 rw-p 00000000 00:00 0 
Size:                 24 kB
Rss:                  12 kB
Anonymous:            12 kB
7f94ed6ca000-7f94ed6cc000 r-xp 00000000 00:00 0                          [vdso]
Rss:                   4 kB
Anonymous:             0 kB
7f0000000000-7f0000001000 r--p 00000000 fe:00 77                         /usr/lib/other
Rss:                   4 kB
Anonymous:             0 kB
";

    #[test]
    fn only_clean_readonly_mappings_of_the_executable_qualify() {
        let found = clean_readonly_mappings(SMAPS, b"/usr/bin/colibri");
        assert_eq!(
            found,
            vec![
                Mapping {
                    start: 0x200000,
                    len: 0x1c1000,
                    rss: 832 * 1024
                },
                Mapping {
                    start: 0x3c1000,
                    len: 0x551000,
                    rss: 5316 * 1024
                },
            ],
            "the relocated (written) read-only segment, the writable ones, [vdso] and other \
             files are left alone"
        );
    }

    #[test]
    fn a_mapping_without_an_anonymous_line_is_left_alone() {
        let smaps = "00200000-003c1000 r-xp 00000000 fe:00 1 /usr/bin/colibri\nRss: 4 kB\n";
        assert!(clean_readonly_mappings(smaps, b"/usr/bin/colibri").is_empty());
    }

    #[test]
    fn releasing_the_code_of_a_running_process_keeps_it_running() {
        // The test binary itself: its code is released and then runs on.
        assert!(release_code().is_some());
        give_back();
        assert_eq!((1..=10u64).sum::<u64>(), 55);
    }
}
