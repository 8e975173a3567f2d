//! Giving memory back to the system once the process no longer uses it: the free memory glibc
//! keeps in its heaps (it keeps what a thread freed for that thread's next allocations). It
//! changes nothing the program computes; where the C library has no such call it does nothing.
//! The callers decide when: after start-up, when a burst of work ends.

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
