//! The registered receive pool: rendezvous receives land in its chunks.

#[allow(unused_imports)]
use super::*;

/// A long-lived buffer region registered with UCX once (`ucp_mem_map`) and cut into equal
/// chunks that rendezvous receives land in: with RDMA, the peer's data is read straight into
/// it, and no message pays for a registration of its own. Chunks go back to the pool when the
/// [`PoolBuf`] holding one is dropped.
pub struct MemPool {
    ctx: Arc<Context>,
    pub(crate) memh: sys::ucp_mem_h,
    base: *mut u8,
    chunk: usize,
    count: usize,
    free: Mutex<Vec<usize>>,
}

impl std::fmt::Debug for MemPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemPool")
            .field("chunk", &self.chunk)
            .field("count", &self.count)
            .finish()
    }
}

// SAFETY: the region is only reached through chunks, each owned by one `PoolBuf` at a time
// (the free list hands an index out once); the handle is used only to unmap on drop.
unsafe impl Send for MemPool {}
// SAFETY: as above; the free list is behind a Mutex.
unsafe impl Sync for MemPool {}

impl MemPool {
    /// `count` chunks of `chunk` bytes, mapped and registered now.
    pub fn new(ctx: &Arc<Context>, chunk: usize, count: usize) -> Result<Arc<MemPool>, Error> {
        let len = chunk.checked_mul(count).filter(|&l| l > 0).ok_or(Error {
            what: "memory pool",
            status: sys::UCS_ERR_INVALID_PARAM as i32,
            message: format!("{count} chunks of {chunk} bytes"),
        })?;
        // SAFETY: an anonymous private mapping of `len` bytes; the result is checked.
        let base = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(Error {
                what: "memory pool",
                status: sys::UCS_ERR_NO_MEMORY as i32,
                message: std::io::Error::last_os_error().to_string(),
            });
        }
        let params = sys::ucp_mem_map_params_t {
            field_mask: (sys::UCP_MEM_MAP_PARAM_FIELD_ADDRESS | sys::UCP_MEM_MAP_PARAM_FIELD_LENGTH)
                as u64,
            address: base,
            length: len,
            ..Default::default()
        };
        let mut memh: sys::ucp_mem_h = ptr::null_mut();
        // SAFETY: the context is live; `base..base+len` is our mapping, which stays mapped
        // until after ucp_mem_unmap (in drop).
        let s = unsafe { sys::ucp_mem_map(ctx.h, &params, &mut memh) };
        if let Err(e) = check("memory registration", s) {
            // SAFETY: the mapping made above, unmapped once.
            unsafe { libc::munmap(base, len) };
            return Err(e);
        }
        Ok(Arc::new(MemPool {
            ctx: ctx.clone(),
            memh,
            base: base as *mut u8,
            chunk,
            count,
            free: Mutex::new((0..count).rev().collect()),
        }))
    }

    /// The size of each chunk.
    pub fn chunk_size(&self) -> usize {
        self.chunk
    }

    /// A free chunk holding `len` bytes (`len` <= the chunk size), if one is free.
    pub fn take(self: &Arc<Self>, len: usize) -> Option<PoolBuf> {
        if len > self.chunk {
            return None;
        }
        let idx = self.free.lock().unwrap_or_else(|e| e.into_inner()).pop()?;
        Some(PoolBuf {
            pool: self.clone(),
            idx,
            len,
        })
    }

    /// How many chunks are free now.
    pub fn free_chunks(&self) -> usize {
        self.free.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

impl Drop for MemPool {
    fn drop(&mut self) {
        // SAFETY: every chunk holds an `Arc` of the pool, so none is in use; the registration
        // and the mapping are released once, in this order.
        unsafe {
            sys::ucp_mem_unmap(self.ctx.h, self.memh);
            libc::munmap(self.base as *mut c_void, self.chunk * self.count);
        }
    }
}

/// One chunk of a [`MemPool`], holding `len` bytes; back to the pool on drop.
#[derive(Debug)]
pub struct PoolBuf {
    pub(crate) pool: Arc<MemPool>,
    idx: usize,
    len: usize,
}

impl PoolBuf {
    pub(crate) fn ptr(&self) -> *mut u8 {
        // SAFETY: `idx < count`, so the chunk lies inside the pool's mapping.
        unsafe { self.pool.base.add(self.idx * self.pool.chunk) }
    }

    pub(crate) fn set_len(&mut self, len: usize) {
        self.len = len.min(self.pool.chunk);
    }
}

impl AsRef<[u8]> for PoolBuf {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the chunk is this buffer's alone (taken from the free list once) and
        // `len <= chunk`; the mapping lives as long as the pool, which we hold.
        unsafe { std::slice::from_raw_parts(self.ptr(), self.len) }
    }
}

impl Drop for PoolBuf {
    fn drop(&mut self) {
        self.pool
            .free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(self.idx);
    }
}
