//! Admin commands and the fabrics commands of an admin queue (Property Get and Set).

use std::sync::atomic::Ordering;

use trireme_blockdev::BlockDevice;

use crate::cmd::{admin, fctype, status, Sqe, FABRICS};
use crate::ctrl::{lock, Ctrl, Out};
use crate::ident::{self, log};
use crate::target::Port;

/// I/O queues a controller grants at most.
pub const MAX_IO_QUEUES: u16 = 8;

/// What an admin command gives back.
#[derive(Debug)]
pub(crate) enum Answer {
    /// Dword 0 (and 1) of the completion, and data for the host.
    Done(u64, Option<Vec<u8>>),
    /// Held (an asynchronous event request): completed when an event comes.
    Held,
}

pub(crate) type AdminResult = Result<Answer, u16>;

fn done(result: u64) -> AdminResult {
    Ok(Answer::Done(result, None))
}

fn data(page: Vec<u8>) -> AdminResult {
    Ok(Answer::Done(0, Some(page)))
}

/// Runs one command of `ctrl`'s admin queue.
pub(crate) async fn run<D: BlockDevice>(
    port: &Port<D>,
    ctrl: &Ctrl,
    sqe: &Sqe,
    out: &Out,
) -> AdminResult {
    if sqe.opcode == FABRICS {
        return property(port, ctrl, sqe).await;
    }
    match sqe.opcode {
        admin::IDENTIFY => identify(port, ctrl, sqe),
        admin::GET_LOG_PAGE => get_log(port, ctrl, sqe),
        admin::SET_FEATURES => set_features(ctrl, sqe),
        admin::GET_FEATURES => get_features(ctrl, sqe),
        admin::ASYNC_EVENT => match ctrl.add_aer(sqe.cid, out.clone()) {
            Ok(()) => Ok(Answer::Held),
            Err(()) => Err(status::ASYNC_LIMIT | status::DNR),
        },
        admin::KEEP_ALIVE => done(0),
        _ => Err(status::INVALID_OPCODE | status::DNR),
    }
}

/// Controller configuration: enable, shutdown.
const CC: u32 = 0x14;
const CSTS: u32 = 0x1c;
const CAP: u32 = 0x00;
const VS: u32 = 0x08;

async fn property<D: BlockDevice>(port: &Port<D>, ctrl: &Ctrl, sqe: &Sqe) -> AdminResult {
    let offset = sqe.cdw11;
    match sqe.fctype() {
        fctype::PROPERTY_GET => match offset {
            CAP => done(ident::cap()),
            VS => done(u64::from(ident::VERSION)),
            CC => done(u64::from(ctrl.cc.load(Ordering::Relaxed))),
            CSTS => done(u64::from(ctrl.csts.load(Ordering::Relaxed))),
            _ => Err(status::INVALID_FIELD | status::DNR),
        },
        fctype::PROPERTY_SET if offset == CC => {
            set_cc(port, ctrl, sqe.cdw12).await;
            done(0)
        }
        fctype::PROPERTY_SET => Err(status::INVALID_FIELD | status::DNR),
        fctype::CONNECT => Err(status::SEQUENCE_ERROR | status::DNR),
        _ => Err(status::INVALID_OPCODE | status::DNR),
    }
}

/// A write of CC: enable sets CSTS.RDY, disable clears it, a shutdown flushes the volume and
/// reports it complete.
async fn set_cc<D: BlockDevice>(port: &Port<D>, ctrl: &Ctrl, cc: u32) {
    let enable = cc & 1 != 0;
    let shutdown = (cc >> 14) & 3 != 0;
    ctrl.cc.store(cc, Ordering::Relaxed);
    if shutdown {
        if let Some(i) = ctrl.subsys {
            if let Err(e) = port.subsystems[i].dev.flush().await {
                tracing::warn!(
                    cntlid = ctrl.cntlid,
                    "flush at the host's shutdown failed: {e}"
                );
            }
        }
        ctrl.csts
            .store(u32::from(enable) | 0b10 << 2, Ordering::Relaxed);
        return;
    }
    ctrl.csts.store(u32::from(enable), Ordering::Relaxed);
}

fn identify<D: BlockDevice>(port: &Port<D>, ctrl: &Ctrl, sqe: &Sqe) -> AdminResult {
    let cns = sqe.cdw10 & 0xff;
    let Some(i) = ctrl.subsys else {
        return match cns {
            1 => data(ident::identify_controller(&ident::ControllerId {
                cntlid: ctrl.cntlid,
                serial: "discovery",
                subnqn: ident::DISCOVERY_NQN,
                discovery: true,
                read_only: true,
                trim: false,
            })),
            _ => Err(status::INVALID_FIELD | status::DNR),
        };
    };
    let sub = &port.subsystems[i];
    let caps = sub.dev.caps();
    let nsid_ok = sqe.nsid == ident::NSID;
    match cns {
        0 if nsid_ok => data(ident::identify_namespace(&ident::NamespaceId {
            size: sub.dev.size(),
            nguid: sub.nguid,
            read_only: caps.read_only,
        })),
        // An inactive namespace id identifies as zeroes.
        0 if sqe.nsid != 0 && sqe.nsid != u32::MAX => data(vec![0; ident::PAGE]),
        1 => data(ident::identify_controller(&ident::ControllerId {
            cntlid: ctrl.cntlid,
            serial: &sub.serial,
            subnqn: &sub.nqn,
            discovery: false,
            read_only: caps.read_only,
            trim: caps.trim,
        })),
        2 if sqe.nsid < 0xffff_fffe => data(ident::active_namespaces(sqe.nsid)),
        3 if nsid_ok => data(ident::ns_descriptors(&sub.nguid)),
        // The NVM command set's specific structures: nothing beyond the defaults.
        5 | 6 if (sqe.cdw11 >> 24) == 0 => data(vec![0; ident::PAGE]),
        0 | 3 => Err(status::INVALID_NS | status::DNR),
        _ => Err(status::INVALID_FIELD | status::DNR),
    }
}

fn get_log<D: BlockDevice>(port: &Port<D>, ctrl: &Ctrl, sqe: &Sqe) -> AdminResult {
    let lid = (sqe.cdw10 & 0xff) as u8;
    let lsp = (sqe.cdw10 >> 8) & 0x7f;
    let retain = sqe.cdw10 & (1 << 15) != 0;
    let dwords = ((sqe.cdw11 & 0xffff) << 16 | sqe.cdw10 >> 16) as usize + 1;
    let len = dwords * 4;
    let offset = u64::from(sqe.cdw12) | u64::from(sqe.cdw13) << 32;
    if len != sqe.sgl_len as usize || offset % 4 != 0 {
        return Err(status::INVALID_FIELD | status::DNR);
    }
    let page = match (ctrl.subsys, lid) {
        (None, log::DISCOVERY) => discovery_page(port, ctrl),
        (None, _) => return Err(status::INVALID_LOG_PAGE | status::DNR),
        (Some(_), log::ERROR) => vec![0; 64],
        (Some(_), log::SMART) => ident::smart_log(0, 0),
        (Some(_), log::FIRMWARE) => {
            let mut b = vec![0u8; 512];
            b[0] = 1; // active slot 1
            let v = env!("CARGO_PKG_VERSION").as_bytes();
            b[8..8 + v.len().min(8)].copy_from_slice(&v[..v.len().min(8)]);
            b
        }
        (Some(_), log::CHANGED_NS) => {
            let changed = match retain {
                true => ctrl.ns_changed.load(Ordering::Relaxed),
                false => ctrl.ns_changed.swap(false, Ordering::Relaxed),
            };
            ident::changed_ns_log(changed)
        }
        (Some(i), log::CMD_EFFECTS) => {
            ident::cmd_effects_log(port.subsystems[i].dev.caps().read_only)
        }
        (Some(i), log::ANA) => {
            let a = port.subsystems[i].ana.get();
            ident::ana_log(a.chgcnt, a.state, lsp & 1 != 0)
        }
        _ => return Err(status::INVALID_LOG_PAGE | status::DNR),
    };
    data(ident::window(&page, offset, len))
}

/// The subsystems of this port the controller's host may connect to.
fn discovery_page<D: BlockDevice>(port: &Port<D>, ctrl: &Ctrl) -> Vec<u8> {
    let entries: Vec<ident::DiscoveryEntry> = port
        .subsystems
        .iter()
        .filter(|s| (s.allow)(&ctrl.hostnqn))
        .map(|s| ident::DiscoveryEntry {
            port_id: port.port_id,
            subnqn: s.nqn.clone(),
            addr: port.addr,
        })
        .collect();
    ident::discovery_log(1, &entries)
}

fn set_features(ctrl: &Ctrl, sqe: &Sqe) -> AdminResult {
    if sqe.cdw10 & (1 << 31) != 0 {
        return Err(status::FEATURE_NOT_SAVEABLE | status::DNR);
    }
    match sqe.cdw10 & 0xff {
        0x07 => {
            let (nsq, ncq) = (sqe.cdw11 & 0xffff, sqe.cdw11 >> 16);
            if nsq == 0xffff || ncq == 0xffff || ctrl.subsys.is_none() {
                return Err(status::INVALID_FIELD | status::DNR);
            }
            let want = nsq.max(ncq) as u16 + 1;
            let granted = want.min(MAX_IO_QUEUES);
            lock(&ctrl.queues).0 = granted;
            done(queues_result(granted))
        }
        0x0b => {
            ctrl.aen_config.store(sqe.cdw11, Ordering::Relaxed);
            done(0)
        }
        0x0f => {
            ctrl.kato_ms.store(sqe.cdw11, Ordering::Relaxed);
            done(0)
        }
        _ => Err(status::INVALID_FIELD | status::DNR),
    }
}

fn queues_result(granted: u16) -> u64 {
    let g = u64::from(granted.saturating_sub(1));
    g | g << 16
}

fn get_features(ctrl: &Ctrl, sqe: &Sqe) -> AdminResult {
    match sqe.cdw10 & 0xff {
        0x06 => done(1),
        0x07 => done(queues_result(lock(&ctrl.queues).0)),
        0x0b => done(u64::from(ctrl.aen_config.load(Ordering::Relaxed))),
        0x0f => done(u64::from(ctrl.kato_ms.load(Ordering::Relaxed))),
        _ => Err(status::INVALID_FIELD | status::DNR),
    }
}
