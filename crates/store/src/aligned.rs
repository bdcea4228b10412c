//! Heap buffers aligned for `O_DIRECT`.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;

/// Alignment of `O_DIRECT` buffers, offsets and lengths.
pub const ALIGN: usize = 4096;

/// A zeroed, `ALIGN`-aligned byte buffer.
#[derive(Debug)]
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: AlignedBuf uniquely owns its allocation, like a Box<[u8]>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out &[u8]; mutation needs &mut self.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// Allocates `len` zeroed bytes (`len` is rounded up to `ALIGN`, minimum one block).
    pub fn new(len: usize) -> AlignedBuf {
        let len = len.max(ALIGN).div_ceil(ALIGN) * ALIGN;
        let layout = Layout::from_size_align(len, ALIGN).expect("valid layout");
        // SAFETY: layout has a non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len }
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialised (zeroed) bytes for the life of self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in deref, and &mut self guarantees unique access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = Layout::from_size_align(self.len, ALIGN).expect("valid layout");
        // SAFETY: allocated in new() with exactly this layout.
        unsafe { dealloc(self.ptr.as_ptr(), layout) }
    }
}

pub fn align_down(v: u64) -> u64 {
    v & !(ALIGN as u64 - 1)
}

pub fn align_up(v: u64) -> u64 {
    v.div_ceil(ALIGN as u64) * ALIGN as u64
}

/// Largest scratch buffer a thread keeps between calls.
const SCRATCH_KEPT: usize = 1 << 20;

thread_local! {
    static SCRATCH: std::cell::RefCell<Option<AlignedBuf>> = const { std::cell::RefCell::new(None) };
}

/// Runs `f` with an `ALIGN`-aligned buffer of at least `len` bytes whose contents are left
/// over from earlier calls: callers overwrite what they use (a read from the file, data to
/// write). The thread keeps one buffer of up to a megabyte, so the I/O path of a file replica
/// neither allocates nor zero-fills per request; larger spans get a buffer of their own.
pub fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    if len > SCRATCH_KEPT {
        return f(&mut AlignedBuf::new(len));
    }
    SCRATCH.with(|cell| {
        // Taken out while in use: a nested call (none today) gets a fresh buffer.
        let mut buf = match cell.borrow_mut().take() {
            Some(b) if b.len() >= len => b,
            _ => AlignedBuf::new(len),
        };
        let r = f(&mut buf);
        *cell.borrow_mut() = Some(buf);
        r
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scratch_is_aligned_reused_and_large_enough() {
        let first = with_scratch(8192, |b| {
            assert!(b.len() >= 8192);
            assert_eq!(b.as_ptr() as usize % ALIGN, 0);
            b[..4].copy_from_slice(b"abcd");
            b.as_ptr() as usize
        });
        // The same buffer comes back, with what the last user left in it.
        let again = with_scratch(4096, |b| {
            assert_eq!(&b[..4], b"abcd");
            b.as_ptr() as usize
        });
        assert_eq!(first, again);
        // Over the kept size: a buffer of its own, aligned too.
        with_scratch(SCRATCH_KEPT + ALIGN, |b| {
            assert!(b.len() > SCRATCH_KEPT);
            assert_eq!(b.as_ptr() as usize % ALIGN, 0);
        });
    }
}
