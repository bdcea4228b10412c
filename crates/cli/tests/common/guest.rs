//! A Linux guest under qemu's software emulation (TCG: for function, never for timings),
//! for what this host's kernel lacks (the kernel's NBD client, ublk): a Debian 6.12 kernel
//! and its modules (unpacked by `scripts/setup.sh` into [`GUEST`]), an initramfs built here
//! with busybox, the `trireme` binary and the programs a test names, and qemu's user network
//! (the host is 10.0.2.2).
//!
//! The guest reaches the cluster at 10.0.2.2: the test runs it in a network namespace of its
//! own ([`GuestNet`]) where 10.0.2.2 is a local address and qemu's connections to
//! 127.0.0.1 (its user network's host) are redirected to it. Servers there listen on
//! 10.0.2.2 and are reached at the same address from the namespace and from the guest.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Where `scripts/setup.sh` unpacks the guest's kernel (`vmlinuz`) and modules.
pub const GUEST: &str = "/var/cache/trireme-guest";

/// Why a guest cannot run here, if it cannot.
pub fn unavailable() -> Option<String> {
    let missing: Vec<&str> = [
        (
            Path::new(GUEST).join("ready").exists(),
            "the guest kernel (scripts/setup.sh)",
        ),
        (which("qemu-system-x86_64"), "qemu-system-x86_64"),
        (Path::new("/bin/busybox").exists(), "busybox-static"),
        (which("cpio"), "cpio"),
    ]
    .into_iter()
    .filter(|(ok, _)| !ok)
    .map(|(_, w)| w)
    .collect();
    (!missing.is_empty()).then(|| missing.join(", "))
}

fn which(tool: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .is_ok_and(|o| o.status.success())
}

fn sh(args: &[&str]) {
    let o = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(o.status.success(), "{args:?}: {o:?}");
}

/// A network namespace where 10.0.2.2 is local and qemu's user network reaches it.
pub struct GuestNet {
    pub name: String,
}

impl GuestNet {
    pub fn create() -> GuestNet {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("trireme-g{}-{n}", std::process::id());
        sh(&["ip", "netns", "add", &name]);
        let n = GuestNet { name };
        sh(&["ip", "-n", &n.name, "link", "set", "lo", "up"]);
        sh(&[
            "ip",
            "-n",
            &n.name,
            "addr",
            "add",
            "10.0.2.2/32",
            "dev",
            "lo",
        ]);
        sh(&[
            "ip",
            "netns",
            "exec",
            &n.name,
            "iptables",
            "-t",
            "nat",
            "-A",
            "OUTPUT",
            "-d",
            "127.0.0.1/32",
            "-p",
            "tcp",
            "-j",
            "DNAT",
            "--to-destination",
            "10.0.2.2",
        ]);
        n
    }

    /// Moves the calling thread into the namespace (its sockets from then on are there).
    pub fn enter(&self) {
        use std::os::unix::io::AsRawFd;
        let f = std::fs::File::open(format!("/run/netns/{}", self.name)).unwrap();
        // SAFETY: setns on a namespace file this thread opened; it changes only this thread.
        let r = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(r, 0, "setns: {}", std::io::Error::last_os_error());
    }

    /// `program ARGS` inside the namespace.
    pub fn cmd(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, program]);
        c
    }
}

impl Drop for GuestNet {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// Copies `bin` and the shared libraries it loads into `root`, at the same paths.
fn with_libs(root: &Path, bin: &Path, to: &str) {
    let dst = root.join(to.trim_start_matches('/'));
    std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
    let o = Command::new("objcopy")
        .arg("--strip-debug")
        .arg(bin)
        .arg(&dst)
        .output()
        .unwrap();
    if !o.status.success() {
        std::fs::copy(bin, &dst).unwrap();
    }
    let ldd = Command::new("ldd").arg(bin).output().unwrap();
    for line in String::from_utf8_lossy(&ldd.stdout).lines() {
        let path = line
            .split("=>")
            .nth(1)
            .unwrap_or(line)
            .split_whitespace()
            .next()
            .unwrap_or("");
        if path.starts_with('/') {
            let d = root.join(path.trim_start_matches('/'));
            std::fs::create_dir_all(d.parent().unwrap()).unwrap();
            if !d.exists() {
                std::fs::copy(path, &d).unwrap();
            }
        }
    }
}

/// Builds an initramfs in `dir` whose init loads the modules, brings the network up and runs
/// `script` (sh), then powers off. Returns its path.
pub fn initrd(dir: &Path, script: &str, programs: &[(&Path, &str)]) -> PathBuf {
    let root = dir.join("initrd");
    for d in [
        "bin",
        "sbin",
        "dev",
        "proc",
        "sys",
        "tmp",
        "mnt",
        "run",
        "lib/modules",
    ] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    std::fs::copy("/bin/busybox", root.join("bin/busybox")).unwrap();
    for e in std::fs::read_dir(Path::new(GUEST).join("modules")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), root.join("lib/modules").join(e.file_name())).unwrap();
    }
    for (bin, to) in programs {
        with_libs(&root, bin, to);
    }
    let init = "#!/bin/busybox sh\n\
         /bin/busybox --install -s /bin\n\
         mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev\n\
         mount -t tmpfs run /run\n\
         for m in failover net_failover virtio_net crc16 mbcache jbd2 crc32c_generic ext4 nbd ublk_drv; do\n\
           insmod /lib/modules/$m.ko || echo \"@@ insmod $m failed\"\n\
         done\n\
         for m in nvme-auth nvme-keyring nvme-core nvme-fabrics nvme-tcp; do\n\
           [ -e /lib/modules/$m.ko ] && { insmod /lib/modules/$m.ko || echo \"@@ insmod $m failed\"; }\n\
         done\n\
         ip link set lo up; ip link set eth0 up\n\
         ip addr add 10.0.2.15/24 dev eth0; ip route add default via 10.0.2.2\n\
         echo '@@ GUEST-UP'\n\
         sh /test.sh 2>&1\n\
         echo \"@@ GUEST-DONE $?\"\n\
         poweroff -f\n";
    std::fs::write(root.join("init"), init).unwrap();
    std::fs::write(root.join("test.sh"), script).unwrap();
    let mut perm = std::fs::metadata(root.join("init")).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o755);
    std::fs::set_permissions(root.join("init"), perm).unwrap();
    let out = dir.join("initrd.cpio");
    let o = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "cd {} && find . | cpio -o -H newc > {} 2>/dev/null",
            root.display(),
            out.display()
        ))
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    out
}

/// A running guest: its console lines, as they come.
pub struct Guest {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    lines: mpsc::Receiver<String>,
    /// Every line so far, for failure messages.
    pub log: Vec<String>,
}

impl Guest {
    /// Boots `initrd` in `net`.
    pub fn boot(net: &GuestNet, initrd: &Path) -> Guest {
        Self::boot_with(net, initrd, &[])
    }

    /// [`Guest::boot`], with guest TCP ports forwarded from 10.0.2.2 in `net`: (host, guest).
    pub fn boot_with(net: &GuestNet, initrd: &Path, forward: &[(u16, u16)]) -> Guest {
        let mut netdev = String::from("user,id=n0");
        for (h, g) in forward {
            netdev += &format!(",hostfwd=tcp:10.0.2.2:{h}-:{g}");
        }
        let mut child = net
            .cmd("qemu-system-x86_64")
            .args([
                "-M",
                "q35",
                "-m",
                "2048",
                "-smp",
                "2",
                "-nographic",
                "-no-reboot",
            ])
            .arg("-kernel")
            .arg(Path::new(GUEST).join("vmlinuz"))
            .arg("-initrd")
            .arg(initrd)
            .args(["-append", "console=ttyS0 panic=-1 loglevel=4"])
            .args(["-netdev", &netdev, "-device", "virtio-net-pci,netdev=n0"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("qemu-system-x86_64");
        let (tx, lines) = mpsc::channel();
        let out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for l in std::io::BufReader::new(out).lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take();
        Guest {
            child,
            stdin,
            lines,
            log: Vec::new(),
        }
    }

    /// Types `line` on the guest's console (a script there that reads it runs it).
    pub fn send(&mut self, line: &str) {
        use std::io::Write;
        let i = self.stdin.as_mut().expect("the console's input");
        i.write_all(format!("{line}\n").as_bytes()).unwrap();
        i.flush().unwrap();
    }

    /// Waits until a console line contains `what` (failing the test after `limit`); returns it.
    pub fn expect(&mut self, what: &str, limit: Duration) -> String {
        let t0 = Instant::now();
        loop {
            let left = limit.saturating_sub(t0.elapsed());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    self.log.push(l.clone());
                    if l.contains(what) {
                        return l;
                    }
                }
                Err(_) => panic!(
                    "the guest did not say {what:?} within {limit:?}; its console:\n{}",
                    self.log.join("\n")
                ),
            }
        }
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
