//! The fabrics Connect command: who may make a controller, and which queue may join one.

use std::net::SocketAddr;
use std::sync::Arc;

use trireme_blockdev::BlockDevice;

use crate::cmd::{fctype, status, Sqe, FABRICS};
use crate::ctrl::{lock, Ctrl};
use crate::ident::{DISCOVERY_NQN, QUEUE_ENTRIES};
use crate::target::Port;

/// Entries of an admin queue at most (Linux asks for 32).
pub const ADMIN_ENTRIES: u32 = 32;

/// A queue connected.
#[derive(Debug)]
pub(crate) struct Connected {
    pub ctrl: Arc<Ctrl>,
    pub qid: u16,
    pub entries: u32,
    pub sqflow_disabled: bool,
}

/// Connect Invalid Parameters, naming the field at fault: `data` says whether it is in the
/// command (offset in the SQE) or in its data (offset in the 1 KiB).
fn invalid(data: bool, offset: u16) -> (u16, u64) {
    (
        status::CONNECT_INVALID_PARAMETERS,
        u64::from(data) << 16 | u64::from(offset),
    )
}

/// What the Connect's 1 KiB of data says.
struct ConnectData {
    hostid: [u8; 16],
    cntlid: u16,
    subnqn: String,
    hostnqn: String,
}

fn nqn_at(data: &[u8], at: usize) -> Result<String, (u16, u64)> {
    let field = &data[at..at + 256];
    let end = field
        .iter()
        .position(|&b| b == 0)
        .ok_or(invalid(true, at as u16))?;
    let s = std::str::from_utf8(&field[..end]).map_err(|_| invalid(true, at as u16))?;
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(invalid(true, at as u16));
    }
    Ok(s.to_string())
}

fn parse(data: &[u8]) -> Result<ConnectData, (u16, u64)> {
    if data.len() != 1024 {
        return Err((status::SGL_INVALID_DATA_LENGTH, 0));
    }
    Ok(ConnectData {
        hostid: data[..16].try_into().expect("16 bytes"),
        cntlid: u16::from_le_bytes([data[16], data[17]]),
        subnqn: nqn_at(data, 256)?,
        hostnqn: nqn_at(data, 512)?,
    })
}

/// Accepts or refuses a Connect on a new queue: the status and dword 0 of a refusal.
pub(crate) fn accept<D: BlockDevice>(
    port: &Port<D>,
    sqe: &Sqe,
    data: &[u8],
    peer: SocketAddr,
) -> Result<Connected, (u16, u64)> {
    if sqe.opcode != FABRICS || sqe.fctype() != fctype::CONNECT {
        return Err((status::SEQUENCE_ERROR, 0));
    }
    let recfmt = sqe.cdw10 & 0xffff;
    if recfmt != 0 {
        return Err((status::CONNECT_INCOMPATIBLE_FORMAT, 0));
    }
    let qid = (sqe.cdw10 >> 16) as u16;
    let sqsize = sqe.cdw11 & 0xffff;
    let cattr = (sqe.cdw11 >> 16) & 0xff;
    let kato = sqe.cdw12;
    let d = parse(data)?;
    let max = if qid == 0 {
        ADMIN_ENTRIES
    } else {
        QUEUE_ENTRIES
    };
    if sqsize == 0 || sqsize + 1 > max {
        return Err(invalid(false, 44));
    }
    let sub = match d.subnqn.as_str() {
        DISCOVERY_NQN => None,
        nqn => match port.subsystem(nqn) {
            Some((i, s)) => {
                if !(s.allow)(&d.hostnqn) {
                    tracing::warn!(
                        host = %d.hostnqn,
                        %peer,
                        subsystem = nqn,
                        "refused a Connect: the host NQN is not on the volume's access list"
                    );
                    return Err((status::CONNECT_INVALID_HOST, 0));
                }
                Some(i)
            }
            None => return Err(invalid(true, 256)),
        },
    };
    let connected = |ctrl| Connected {
        ctrl,
        qid,
        entries: sqsize + 1,
        sqflow_disabled: cattr & 0b100 != 0,
    };
    if qid == 0 {
        if d.cntlid != 0xffff {
            return Err(invalid(true, 16));
        }
        let make = |id| Ctrl::new(id, sub, d.hostnqn.clone(), d.hostid, peer, kato);
        let ctrl = port
            .registry
            .add(make)
            .ok_or((status::CONNECT_CONTROLLER_BUSY, 0))?;
        ctrl.seen();
        tracing::info!(
            cntlid = ctrl.cntlid,
            host = %ctrl.hostnqn,
            %peer,
            subsystem = %d.subnqn,
            "host connected"
        );
        return Ok(connected(ctrl));
    }
    let ctrl = port.registry.get(d.cntlid).ok_or(invalid(true, 16))?;
    let same_host = ctrl.subsys == sub && ctrl.hostnqn == d.hostnqn && ctrl.hostid == d.hostid;
    if !same_host || ctrl.is_dead() {
        return Err(invalid(true, 16));
    }
    if ctrl.csts.load(std::sync::atomic::Ordering::Relaxed) & 1 == 0 {
        return Err((status::SEQUENCE_ERROR, 0));
    }
    let mut q = lock(&ctrl.queues);
    if qid > q.0 || !q.1.insert(qid) {
        return Err(invalid(false, 42));
    }
    drop(q);
    ctrl.seen();
    Ok(connected(ctrl))
}
