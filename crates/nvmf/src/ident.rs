//! The data structures a controller returns: Identify controller and namespace, the
//! namespace descriptors, and the log pages (SMART, changed namespaces, command effects, ANA,
//! discovery). Byte offsets are the NVMe base (2.0) and fabrics (1.1) specifications'. Pure.

/// Identify and log page buffers are this long (Identify is always 4 KiB).
pub const PAGE: usize = 4096;
/// Logical block size: 4 KiB (LBA data size 2^12).
pub const LBA_SHIFT: u32 = 12;
/// Max data transfer: 2^MDTS pages of 4 KiB (256 KiB).
pub const MDTS: u8 = 6;
/// In-capsule data an I/O queue takes (16 KiB, as Linux's target).
pub const INLINE_DATA: usize = 16 * 1024;
/// In-capsule data the admin queue takes (the Connect command's 1 KiB, and Set Features).
pub const ADMIN_INLINE_DATA: usize = 8 * 1024;
/// Entries per queue the controller takes (CAP.MQES + 1).
pub const QUEUE_ENTRIES: u32 = 128;
/// Asynchronous event requests outstanding at once (AERL + 1).
pub const AER_LIMIT: usize = 4;
/// The only namespace's id.
pub const NSID: u32 = 1;
/// The only ANA group's id.
pub const ANA_GROUP: u32 = 1;
/// NVMe 1.3, what Linux's target reports: a host asks nothing newer of it.
pub const VERSION: u32 = 0x0001_0300;
/// Well-known NQN of a discovery subsystem.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";

/// ANA states.
pub mod ana {
    pub const OPTIMIZED: u8 = 0x01;
    pub const NON_OPTIMIZED: u8 = 0x02;
    pub const INACCESSIBLE: u8 = 0x03;
    pub const CHANGE: u8 = 0x0f;

    /// A state's name, as `status` shows it.
    pub fn name(state: u8) -> &'static str {
        match state {
            OPTIMIZED => "optimized",
            NON_OPTIMIZED => "non-optimized",
            INACCESSIBLE => "inaccessible",
            CHANGE => "change",
            _ => "unknown",
        }
    }
}

/// Log page identifiers.
pub mod log {
    pub const ERROR: u8 = 0x01;
    pub const SMART: u8 = 0x02;
    pub const FIRMWARE: u8 = 0x03;
    pub const CHANGED_NS: u8 = 0x04;
    pub const CMD_EFFECTS: u8 = 0x05;
    pub const ANA: u8 = 0x0c;
    pub const DISCOVERY: u8 = 0x70;
}

/// The capabilities register: MQES, contiguous queues required, a timeout of 7.5 s
/// (15 × 500 ms) for CSTS.RDY, the NVM command set.
pub fn cap() -> u64 {
    u64::from(QUEUE_ENTRIES - 1) | 1 << 16 | 15 << 24 | 1 << 37
}

fn put_str(b: &mut [u8], s: &str) {
    // ASCII, space padded (serial, model, firmware) or NUL padded (NQNs: caller zeroes).
    for (d, c) in b.iter_mut().zip(s.bytes().chain(std::iter::repeat(b' '))) {
        *d = c;
    }
}

fn put_nqn(b: &mut [u8], s: &str) {
    let n = s.len().min(b.len() - 1);
    b[..n].copy_from_slice(&s.as_bytes()[..n]);
}

fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}

fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// What Identify Controller says of one controller.
#[derive(Debug, Clone)]
pub struct ControllerId<'a> {
    pub cntlid: u16,
    pub serial: &'a str,
    pub subnqn: &'a str,
    pub discovery: bool,
    /// The volume takes no write: no volatile cache, no write commands advertised.
    pub read_only: bool,
    pub trim: bool,
}

/// Identify Controller (CNS 01h).
pub fn identify_controller(c: &ControllerId<'_>) -> Vec<u8> {
    let mut b = vec![0u8; PAGE];
    put16(&mut b, 0, 0x1d1d); // PCI vendor: none that is real; fabrics ignore it
    put16(&mut b, 2, 0x1d1d);
    put_str(&mut b[4..24], c.serial);
    put_str(&mut b[24..64], "trireme");
    put_str(&mut b[64..72], env!("CARGO_PKG_VERSION"));
    // CMIC: more than one port, more than one controller, ANA reporting.
    b[76] = if c.discovery { 0 } else { 0b1011 };
    b[77] = MDTS;
    put16(&mut b, 78, c.cntlid);
    put32(&mut b, 80, VERSION);
    // OAES: namespace attribute and ANA change notices.
    put32(
        &mut b,
        92,
        if c.discovery {
            1 << 31
        } else {
            1 << 8 | 1 << 11
        },
    );
    b[111] = if c.discovery { 2 } else { 1 }; // CNTRLTYPE
    b[259] = (AER_LIMIT - 1) as u8; // AERL
    b[260] = 0b10; // FRMW: slot 1 read only
    b[261] = 0b110; // LPA: command effects log, extended data for Get Log Page
    b[262] = 0; // ELPE: one error log entry
    put16(&mut b, 320, 10); // KAS: 100 ms units, so keep-alive is counted in seconds
    if !c.discovery {
        b[343] = 10; // ANATT: 10 s
        b[344] = 0b100_1001; // ANACAP: optimized and inaccessible reported, group id fixed
        put32(&mut b, 345, 1); // ANAGRPMAX
        put32(&mut b, 349, 1); // NANAGRPID
    }
    b[512] = 0x66; // SQES
    b[513] = 0x44; // CQES
    put16(&mut b, 514, QUEUE_ENTRIES as u16); // MAXCMD
    put32(&mut b, 516, if c.discovery { 0 } else { 1 }); // NN
    if !c.discovery && !c.read_only {
        // ONCS: dataset management (if trims deallocate) and write zeroes.
        put16(&mut b, 520, if c.trim { 1 << 2 | 1 << 3 } else { 1 << 3 });
        b[525] = 1; // VWC: a volatile write cache (flush makes writes durable)
    }
    // SGLS: SGLs supported, offsets of in-capsule data (SGL data block, offset).
    put32(&mut b, 536, 1 | 1 << 20);
    put32(&mut b, 540, if c.discovery { 0 } else { 1 }); // MNAN
    put_nqn(&mut b[768..1024], c.subnqn);
    // Fabrics: command and response capsule sizes in 16-byte units, in-capsule data at 0,
    // the dynamic controller model, one SGL descriptor.
    let inline = if c.discovery { 0 } else { INLINE_DATA };
    put32(&mut b, 1792, ((64 + inline) / 16) as u32); // IOCCSZ
    put32(&mut b, 1796, 1); // IORCSZ
    put16(&mut b, 1800, 0); // ICDOFF
    b[1802] = 0; // FCATT: dynamic controller model
    b[1803] = 1; // MSDBD
    b
}

/// What Identify Namespace says.
#[derive(Debug, Clone, Copy)]
pub struct NamespaceId {
    pub size: u64,
    pub nguid: [u8; 16],
    pub read_only: bool,
}

/// Identify Namespace (CNS 00h).
pub fn identify_namespace(n: &NamespaceId) -> Vec<u8> {
    let mut b = vec![0u8; PAGE];
    let blocks = n.size >> LBA_SHIFT;
    put64(&mut b, 0, blocks); // NSZE
    put64(&mut b, 8, blocks); // NCAP
    put64(&mut b, 16, blocks); // NUSE
    b[24] = 1; // NSFEAT: thin provisioned
    b[25] = 0; // NLBAF: one format
    b[26] = 0; // FLBAS: format 0
    b[30] = 1; // NMIC: shared by several controllers (multipath)
    b[33] = 0b1001; // DLFEAT: deallocated blocks read zeroes; write zeroes may deallocate
    put32(&mut b, 92, ANA_GROUP); // ANAGRPID
    b[99] = u8::from(n.read_only); // NSATTR: write protected
    b[104..120].copy_from_slice(&n.nguid);
    b[128 + 2] = LBA_SHIFT as u8; // LBAF0: no metadata, 4 KiB
    b
}

/// Namespace identification descriptor list (CNS 03h): the NGUID.
pub fn ns_descriptors(nguid: &[u8; 16]) -> Vec<u8> {
    let mut b = vec![0u8; PAGE];
    b[0] = 2; // NIDT: NGUID
    b[1] = 16;
    b[4..20].copy_from_slice(nguid);
    b
}

/// Active namespace list (CNS 02h) from after `after`.
pub fn active_namespaces(after: u32) -> Vec<u8> {
    let mut b = vec![0u8; PAGE];
    if after < NSID {
        put32(&mut b, 0, NSID);
    }
    b
}

/// The SMART / health log: temperature 300 K, nothing worn; host reads and writes in units
/// of 1000 blocks of 512 bytes.
pub fn smart_log(read_bytes: u64, written_bytes: u64) -> Vec<u8> {
    let mut b = vec![0u8; 512];
    put16(&mut b, 1, 300);
    b[3] = 100; // available spare
    b[4] = 10; // spare threshold
    let units = |bytes: u64| (bytes / 512).div_ceil(1000);
    put64(&mut b, 32, units(read_bytes));
    put64(&mut b, 48, units(written_bytes));
    b
}

/// The changed namespace list: namespace 1 if it changed.
pub fn changed_ns_log(changed: bool) -> Vec<u8> {
    let mut b = vec![0u8; PAGE];
    if changed {
        put32(&mut b, 0, NSID);
    }
    b
}

/// The commands supported and their effects.
pub fn cmd_effects_log(read_only: bool) -> Vec<u8> {
    let mut b = vec![0u8; PAGE];
    let supported = 1u32;
    let changes_content = 1u32 << 1;
    for op in [
        crate::cmd::admin::GET_LOG_PAGE,
        crate::cmd::admin::IDENTIFY,
        crate::cmd::admin::SET_FEATURES,
        crate::cmd::admin::GET_FEATURES,
        crate::cmd::admin::ASYNC_EVENT,
        crate::cmd::admin::KEEP_ALIVE,
    ] {
        put32(&mut b, 4 * op as usize, supported);
    }
    let io = 1024;
    put32(&mut b, io + 4 * crate::cmd::io::READ as usize, supported);
    if !read_only {
        for op in [
            crate::cmd::io::FLUSH,
            crate::cmd::io::WRITE,
            crate::cmd::io::WRITE_ZEROES,
            crate::cmd::io::DSM,
        ] {
            put32(&mut b, io + 4 * op as usize, supported | changes_content);
        }
    }
    b
}

/// The ANA log: one group, holding namespace 1 (unless only groups are asked for), in
/// `state`, changed `chgcnt` times.
pub fn ana_log(chgcnt: u64, state: u8, groups_only: bool) -> Vec<u8> {
    let mut b = vec![0u8; 16 + 32 + 4];
    put64(&mut b, 0, chgcnt);
    put16(&mut b, 8, 1); // NGRPS
    put32(&mut b, 16, ANA_GROUP);
    put32(&mut b, 20, u32::from(!groups_only)); // NNSIDS
    put64(&mut b, 24, chgcnt);
    b[32] = state;
    if groups_only {
        b.truncate(48);
    } else {
        put32(&mut b, 48, NSID);
    }
    b
}

/// One entry of a discovery log.
#[derive(Debug, Clone)]
pub struct DiscoveryEntry {
    pub port_id: u16,
    pub subnqn: String,
    pub addr: std::net::SocketAddr,
}

/// The discovery log page: a 1 KiB header, then 1 KiB per entry.
pub fn discovery_log(genctr: u64, entries: &[DiscoveryEntry]) -> Vec<u8> {
    let mut b = vec![0u8; 1024 * (1 + entries.len())];
    put64(&mut b, 0, genctr);
    put64(&mut b, 8, entries.len() as u64);
    for (i, e) in entries.iter().enumerate() {
        let r = &mut b[1024 * (i + 1)..1024 * (i + 2)];
        r[0] = 3; // TRTYPE: TCP
        r[1] = if e.addr.is_ipv4() { 1 } else { 2 }; // ADRFAM
        r[2] = if e.subnqn == DISCOVERY_NQN { 3 } else { 2 }; // SUBTYPE
        r[3] = 0b10; // TREQ: secure channel not required
        put16(r, 4, e.port_id);
        put16(r, 6, 0xffff); // CNTLID: dynamic
        put16(r, 8, 32); // ASQSZ
        put_str(&mut r[32..64], &e.addr.port().to_string());
        put_nqn(&mut r[256..512], &e.subnqn);
        let ip = e.addr.ip().to_string();
        put_str(&mut r[512..768], &ip);
        // TSAS (768..1024): no security (SECTYPE 0).
    }
    b
}

/// `len` bytes of `page` from `offset`, zero-filled past its end.
pub fn window(page: &[u8], offset: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    if let Ok(start) = usize::try_from(offset) {
        if start < page.len() {
            let n = (page.len() - start).min(len);
            out[..n].copy_from_slice(&page[start..start + n]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identify_controller_fields() {
        let b = identify_controller(&ControllerId {
            cntlid: 0x2001,
            serial: "abc",
            subnqn: "nqn.2026-12.io.trireme:c:v",
            discovery: false,
            read_only: false,
            trim: true,
        });
        assert_eq!(&b[4..8], b"abc ");
        assert_eq!(u16::from_le_bytes([b[78], b[79]]), 0x2001);
        assert_eq!(b[76] & 0b1000, 0b1000, "ANA reporting");
        assert_eq!(&b[768..794], b"nqn.2026-12.io.trireme:c:v");
        assert_eq!(b[794], 0);
        assert_eq!(
            u32::from_le_bytes([b[1792], b[1793], b[1794], b[1795]]),
            (64 + 16384) / 16
        );
    }

    #[test]
    fn ana_log_lists_namespace_unless_groups_only() {
        let full = ana_log(3, ana::OPTIMIZED, false);
        assert_eq!(full.len(), 52);
        assert_eq!(full[32], ana::OPTIMIZED);
        assert_eq!(
            u32::from_le_bytes([full[48], full[49], full[50], full[51]]),
            1
        );
        assert_eq!(ana_log(3, ana::INACCESSIBLE, true).len(), 48);
    }

    #[test]
    fn window_pads_and_clips() {
        let p = [1u8, 2, 3];
        assert_eq!(window(&p, 1, 4), vec![2, 3, 0, 0]);
        assert_eq!(window(&p, 9, 2), vec![0, 0]);
        assert_eq!(window(&p, u64::MAX, 1), vec![0]);
    }
}
