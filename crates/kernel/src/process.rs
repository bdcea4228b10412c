//! Processes of this host: whether one is alive, as the records of writers and devices need
//! (a pid in a record outlives its process; a zombie or a thread that took the id is not it).

/// Whether a process of this host with this pid exists.
pub fn alive(pid: u32) -> bool {
    if let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
        let field = |k: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(k))
                .map(str::trim)
        };
        // A zombie (killed, not yet reaped by its parent) holds nothing any more.
        if field("State:").is_some_and(|s| s.starts_with('Z')) {
            return false;
        }
        // A thread of another process: it has a /proc entry and kill(2) accepts its id, but
        // it is not the process that held the record (whose id went back to the pool).
        if field("Tgid:")
            .and_then(|t| t.parse::<u32>().ok())
            .is_some_and(|t| t != pid)
        {
            return false;
        }
    }
    // SAFETY: kill with signal 0 only checks that the process exists; nothing is sent.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

#[cfg(test)]
mod tests {
    use super::alive;

    #[test]
    fn a_live_process_is_alive_and_a_thread_of_one_is_not() {
        assert!(alive(std::process::id()));
        let (tx, rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            tx.send(unsafe { libc::gettid() } as u32).unwrap();
            let _ = stop_rx.recv();
        });
        let tid = rx.recv().unwrap();
        assert_ne!(tid, std::process::id());
        // A dead writer's pid that went to a thread of another process is not that writer.
        assert!(!alive(tid));
        stop_tx.send(()).unwrap();
        t.join().unwrap();
        // A pid nobody holds (past pid_max).
        assert!(!alive(u32::MAX / 2));
    }

    #[test]
    fn a_killed_process_not_reaped_yet_is_not_alive() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        assert!(alive(child.id()));
        child.kill().unwrap();
        // Not reaped: a zombie until wait().
        let t0 = std::time::Instant::now();
        while alive(child.id()) {
            assert!(t0.elapsed().as_secs() < 10, "a killed child is still alive");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        child.wait().unwrap();
    }
}
