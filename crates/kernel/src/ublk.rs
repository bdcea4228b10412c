//! ublk (`ublk_drv`, Linux 6.1+): a block device whose requests come to this process through
//! io_uring (`libublk`), created with **user recovery**: when the process dies, the kernel
//! keeps the device and its requests (re-issuing the ones in flight, `USER_RECOVERY_REISSUE`)
//! until a new process recovers it. Safe here: one fenced writer at a time, and every request
//! at a fixed address.
//!
//! A queue per CPU (up to [`MAX_QUEUES`]), each served by a thread of its own: each request is
//! handed to a [`Server`] (the volume's device, on the async runtime) and its answer comes
//! back through a list and an eventfd the queue's ring reads. Data is copied between the
//! kernel's buffer and the request on the queue's thread only.
//!
//! What ends what:
//! - The process killed: the device stays, quiesced, its requests queued; the next [`serve`]
//!   of the same index recovers it.
//! - [`stop`] (from `unmap`): the kernel aborts the queue, [`serve`] returns; [`delete`]
//!   removes the device once its server has gone.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use libublk::ctrl::{UblkCtrl, UblkCtrlBuilder};
use libublk::helpers::IoBuf;
use libublk::io::{BufDescList, UblkDev, UblkIOCtx, UblkQueue};
use libublk::{sys, BufDesc, UblkError, UblkFlags, UblkIORes};

use crate::KernelError;

/// The largest request the device takes (and the queue's buffer per tag).
pub const MAX_IO: u32 = 512 << 10;
/// Requests in flight on each queue.
pub const DEPTH: u16 = 128;
/// The most queues a device gets.
pub const MAX_QUEUES: u16 = 4;

/// Queues of a new device: one per CPU, at most [`MAX_QUEUES`], each on a thread of its
/// own (the kernel sends each CPU's requests to one queue).
fn queues() -> u16 {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(MAX_QUEUES as usize) as u16)
}

/// Whether this kernel has ublk loaded.
pub fn available() -> bool {
    Path::new("/dev/ublk-control").exists()
}

/// Whether ublk device `index` exists (served or waiting for a server).
pub fn exists(index: u32) -> bool {
    Path::new(&format!("/sys/class/ublk-char/ublkc{index}")).exists()
}

/// A request of the device, for the server to do; ranges are within the device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Read {
        offset: u64,
        len: u32,
    },
    Write {
        offset: u64,
        data: Bytes,
        fua: bool,
    },
    Flush,
    Discard {
        offset: u64,
        len: u32,
    },
    WriteZeroes {
        offset: u64,
        len: u32,
        may_trim: bool,
    },
}

/// What a request came to: the bytes a read read, nothing else, or an errno.
pub type Answer = Result<Option<Bytes>, i32>;

/// Does the requests of a device. `submit` must not block: it starts the work and returns;
/// [`Done::finish`] answers later, from any thread.
pub trait Server: Send + Sync + 'static {
    fn submit(&self, op: Op, done: Done);
}

/// The answers a queue has not taken yet, and the eventfd that wakes it.
#[derive(Debug)]
struct Answers {
    list: Mutex<Vec<(u16, u32, Answer)>>,
    wake: OwnedFd,
}

impl Answers {
    fn new() -> Result<Answers, KernelError> {
        // SAFETY: eventfd(2) with valid flags; the descriptor is owned from here on.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(KernelError::io("an eventfd for the ublk queue")(
                std::io::Error::last_os_error(),
            ));
        }
        Ok(Answers {
            list: Mutex::new(Vec::new()),
            // SAFETY: `fd` was just created and nothing else owns it.
            wake: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    fn take(&self) -> Vec<(u16, u32, Answer)> {
        std::mem::take(&mut *self.list.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// The answer to one request: [`Done::finish`] it exactly once. Dropped unfinished, the
/// request stays with the kernel, which issues it again to the next server.
#[derive(Debug)]
pub struct Done {
    tag: u16,
    len: u32,
    answers: Arc<Answers>,
}

impl Done {
    pub fn finish(self, a: Answer) {
        self.answers
            .list
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((self.tag, self.len, a));
        let one = 1u64.to_ne_bytes();
        // SAFETY: an 8-byte write from a live buffer to the queue's eventfd, which lives as
        // long as `answers`.
        let _ = unsafe { libc::write(self.answers.wake.as_raw_fd(), one.as_ptr().cast(), 8) };
    }
}

/// How the device is made.
#[derive(Debug, Clone)]
pub struct Config {
    /// Bytes; a multiple of 4096.
    pub size: u64,
    pub read_only: bool,
    /// Discard and write-zeroes are advertised.
    pub trim: bool,
}

fn ublk_err(what: &str) -> impl FnOnce(UblkError) -> KernelError + '_ {
    move |e| match e {
        UblkError::OtherError(n) | UblkError::UringIOError(n) if n < 0 => KernelError::Refused {
            what: what.to_string(),
            errno: -n,
        },
        UblkError::IOError(e) => KernelError::Io {
            what: what.to_string(),
            source: e,
        },
        e => KernelError::Record(format!("{what}: {e}")),
    }
}

/// Serves a ublk device for `server`: device `recover` (one whose server died: recovered, the
/// same device with its queued requests) or a new one. Calls `started` with the device's
/// index once it serves, then returns only when the device is stopped ([`stop`]).
pub fn serve(
    recover: Option<u32>,
    cfg: &Config,
    server: Arc<dyn Server>,
    started: impl FnOnce(u32) + Send + Sync + 'static,
) -> Result<(), KernelError> {
    if !available() {
        return Err(KernelError::NoDriver(
            "this kernel has no ublk: `modprobe ublk_drv` (Linux 6.1+, CONFIG_BLK_DEV_UBLK)".into(),
        ));
    }
    let (id, flags, queues) = match recover {
        Some(i) => {
            // Waits (30 s at most) for the kernel to quiesce the device its server left; the
            // device keeps the queues it was made with.
            let c = UblkCtrl::new_simple(i as i32)
                .map_err(ublk_err("the ublk device its dead server left"))?;
            let queues = c.dev_info().nr_hw_queues;
            c.start_user_recover()
                .map_err(ublk_err("recovering the ublk device its dead server left"))?;
            (i as i32, UblkFlags::UBLK_DEV_F_RECOVER_DEV, queues)
        }
        None => (-1, UblkFlags::UBLK_DEV_F_ADD_DEV, queues()),
    };
    let ctrl = UblkCtrlBuilder::default()
        .name("trireme")
        .id(id)
        .nr_queues(queues)
        .depth(DEPTH)
        .io_buf_bytes(MAX_IO)
        .ctrl_flags((sys::UBLK_F_USER_RECOVERY | sys::UBLK_F_USER_RECOVERY_REISSUE) as u64)
        .dev_flags(flags)
        .build()
        .map_err(ublk_err("creating a ublk device"))?;
    // The device outlives this process: only `unmap` deletes it.
    ctrl.disown();
    let cfg = cfg.clone();
    let init = move |dev: &mut UblkDev| {
        params(dev, &cfg);
        Ok(())
    };
    let queue_fn = move |qid: u16, dev: &UblkDev| {
        if let Err(e) = queue(qid, dev, server) {
            eprintln!("ublk queue {qid}: {e}");
        }
    };
    let ready = move |c: &UblkCtrl| started(c.dev_info().dev_id);
    ctrl.run_target(init, queue_fn, ready)
        .map_err(ublk_err("serving the ublk device"))?;
    Ok(())
}

/// The device's parameters: 512-byte sectors on 4 KiB blocks, a volatile cache with FUA,
/// read-only or with discard and write-zeroes.
fn params(dev: &mut UblkDev, cfg: &Config) {
    dev.set_default_params(cfg.size);
    dev.tgt.extra_ios = 1;
    let p = &mut dev.tgt.params;
    p.basic.attrs = sys::UBLK_ATTR_VOLATILE_CACHE | sys::UBLK_ATTR_FUA;
    if cfg.read_only {
        p.basic.attrs |= sys::UBLK_ATTR_READ_ONLY;
    } else if cfg.trim {
        p.types |= sys::UBLK_PARAM_TYPE_DISCARD;
        p.discard = sys::ublk_param_discard {
            discard_granularity: 4096,
            max_discard_sectors: MAX_IO >> 9,
            max_write_zeroes_sectors: MAX_IO >> 9,
            max_discard_segments: 1,
            ..Default::default()
        };
    }
}

/// Serves queue `qid` until the device stops.
fn queue(qid: u16, dev: &UblkDev, server: Arc<dyn Server>) -> Result<(), KernelError> {
    let depth = dev.dev_info.queue_depth;
    let answers = Arc::new(Answers::new()?);
    let mut bufs = dev.alloc_queue_io_bufs();
    let q = UblkQueue::new(qid, dev)
        .and_then(|q| q.submit_fetch_commands_unified(BufDescList::Slices(Some(&bufs))))
        .map_err(ublk_err("starting the ublk queue"))?;
    let mut wake = Box::new([0u8; 8]);
    arm(&q, &answers, &mut wake, depth)?;
    q.wait_and_handle_io(|q, tag, ctx| {
        if ctx.is_tgt_io() {
            for (tag, len, a) in answers.take() {
                complete(q, tag, &mut bufs[tag as usize], len, a);
            }
            if let Err(e) = arm(q, &answers, &mut wake, depth) {
                eprintln!("ublk queue {qid}: {e}");
            }
            return;
        }
        request(q, tag, &bufs[tag as usize], &server, &answers);
    });
    Ok(())
}

/// Reads the eventfd on the queue's ring (its completion is a target I/O on the extra tag).
fn arm(
    q: &UblkQueue<'_>,
    answers: &Answers,
    buf: &mut [u8; 8],
    depth: u16,
) -> Result<(), KernelError> {
    let sqe = io_uring::opcode::Read::new(
        io_uring::types::Fd(answers.wake.as_raw_fd()),
        buf.as_mut_ptr(),
        8,
    )
    .build()
    .user_data(UblkIOCtx::build_user_data(depth, 0, 0, true));
    q.ublk_submit_sqe_sync(sqe)
        .map_err(ublk_err("waiting for answers on the ublk queue"))
}

/// What the kernel asks on `tag`, as an [`Op`] (or an errno for what the device refuses). A
/// flush has no range (the kernel gives its sector as all ones).
pub fn decode(op_flags: u32, start_sector: u64, nr_sectors: u32, buf: &[u8]) -> Result<Op, i32> {
    let op = op_flags & 0xff;
    if op == sys::UBLK_IO_OP_FLUSH {
        return Ok(Op::Flush);
    }
    let offset = start_sector.checked_mul(512).ok_or(-libc::EINVAL)?;
    let len = nr_sectors.checked_mul(512).ok_or(-libc::EINVAL)?;
    let moves = matches!(op, sys::UBLK_IO_OP_READ | sys::UBLK_IO_OP_WRITE);
    if moves && len as usize > buf.len() {
        return Err(-libc::EINVAL);
    }
    Ok(match op {
        sys::UBLK_IO_OP_READ => Op::Read { offset, len },
        sys::UBLK_IO_OP_WRITE => Op::Write {
            offset,
            data: Bytes::copy_from_slice(&buf[..len as usize]),
            fua: op_flags & sys::UBLK_IO_F_FUA != 0,
        },
        sys::UBLK_IO_OP_DISCARD => Op::Discard { offset, len },
        sys::UBLK_IO_OP_WRITE_ZEROES => Op::WriteZeroes {
            offset,
            len,
            may_trim: op_flags & sys::UBLK_IO_F_NOUNMAP == 0,
        },
        _ => return Err(-libc::EOPNOTSUPP),
    })
}

fn request(
    q: &UblkQueue<'_>,
    tag: u16,
    buf: &IoBuf<u8>,
    server: &Arc<dyn Server>,
    answers: &Arc<Answers>,
) {
    let iod = q.get_iod(tag);
    let len = iod.nr_sectors.saturating_mul(512);
    match decode(
        iod.op_flags,
        iod.start_sector,
        iod.nr_sectors,
        buf.as_slice(),
    ) {
        Ok(op) => server.submit(
            op,
            Done {
                tag,
                len,
                answers: answers.clone(),
            },
        ),
        Err(errno) => commit(q, tag, buf, errno),
    }
}

/// Answers request `tag` (`len` bytes) with `a`: the bytes read copied to its buffer.
fn complete(q: &UblkQueue<'_>, tag: u16, buf: &mut IoBuf<u8>, len: u32, a: Answer) {
    let res = match a {
        Ok(Some(data)) if data.len() == len as usize && data.len() <= buf.len() => {
            buf.as_mut_slice()[..data.len()].copy_from_slice(&data);
            len as i32
        }
        Ok(Some(_)) => -libc::EIO,
        Ok(None) => len as i32,
        Err(errno) => errno,
    };
    commit(q, tag, buf, res);
}

fn commit(q: &UblkQueue<'_>, tag: u16, buf: &IoBuf<u8>, res: i32) {
    let r = q.complete_io_cmd_unified(
        tag,
        BufDesc::Slice(buf.as_slice()),
        Ok(UblkIORes::Result(res)),
    );
    if let Err(e) = r {
        eprintln!("ublk: answering request {tag}: {e}");
    }
}

/// Stops device `index`: its server's queue ends and [`serve`] returns. A device whose server
/// died is stopped as well.
pub fn stop(index: u32) -> Result<(), KernelError> {
    UblkCtrl::new_simple(index as i32)
        .and_then(|c| c.kill_dev())
        .map(|_| ())
        .map_err(ublk_err("stopping the ublk device"))
}

/// Gives device `index` a new size while it serves (Linux 6.16+: `UPDATE_SIZE`; an older
/// kernel refuses it).
pub fn resize(index: u32, size: u64) -> Result<(), KernelError> {
    UblkCtrl::new_simple(index as i32)
        .and_then(|c| c.update_size(size))
        .map(|_| ())
        .map_err(ublk_err("resizing the ublk device (Linux 6.16+)"))
}

/// Deletes device `index` (after [`stop`], once its server has gone).
pub fn delete(index: u32) -> Result<(), KernelError> {
    UblkCtrl::new_simple(index as i32)
        .and_then(|c| c.del_dev())
        .map(|_| ())
        .map_err(ublk_err("deleting the ublk device"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_decode_within_their_buffer() {
        let buf = vec![7u8; 4096];
        assert_eq!(
            decode(sys::UBLK_IO_OP_READ, 8, 8, &buf),
            Ok(Op::Read {
                offset: 4096,
                len: 4096
            })
        );
        let w = decode(sys::UBLK_IO_OP_WRITE | sys::UBLK_IO_F_FUA, 0, 8, &buf).unwrap();
        assert_eq!(
            w,
            Op::Write {
                offset: 0,
                data: Bytes::from(vec![7u8; 4096]),
                fua: true
            }
        );
        // Larger than the buffer the kernel was given: refused, never read past it.
        assert_eq!(
            decode(sys::UBLK_IO_OP_WRITE, 0, 9, &buf),
            Err(-libc::EINVAL)
        );
        assert_eq!(
            decode(
                sys::UBLK_IO_OP_WRITE_ZEROES | sys::UBLK_IO_F_NOUNMAP,
                0,
                16,
                &buf
            ),
            Ok(Op::WriteZeroes {
                offset: 0,
                len: 8192,
                may_trim: false
            })
        );
        assert_eq!(
            decode(sys::UBLK_IO_OP_ZONE_OPEN, 0, 8, &buf),
            Err(-libc::EOPNOTSUPP)
        );
        assert_eq!(
            decode(sys::UBLK_IO_OP_READ, u64::MAX, 8, &buf),
            Err(-libc::EINVAL)
        );
    }
}
