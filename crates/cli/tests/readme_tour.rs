//! The README's tour and its Space example, run as written (issue 63: the examples had come to
//! contradict themselves, and a reader who ran them met refusals the text did not mention).
//!
//! Each block becomes one bash script, run in a directory of its own where `trireme-data` is
//! the cluster's directory, as for a reader in a fresh checkout. What the test changes is
//! only where things go: the binary for `./target/release/trireme`, a free port for 10809,
//! a private directory for `/tmp/`. A line whose comment says it is refused must fail; a line
//! followed by `# error:` comment lines must fail saying what they say; a line ending in `&`
//! is waited for (its socket, its FUSE mount), and whatever is left in the background is
//! stopped at the end.

mod common;
use common::*;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The ```sh block that follows `marker` in the README, as lines.
fn block_after(marker: &str) -> Vec<String> {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let at = readme
        .find(marker)
        .unwrap_or_else(|| panic!("README has no {marker:?}"));
    let start = at + readme[at..].find("```sh\n").expect("a ```sh block") + 6;
    let end = start + readme[start..].find("\n```").unwrap();
    readme[start..end].lines().map(str::to_string).collect()
}

/// A command line and its trailing comment (after `  #`, outside quotes is close enough for
/// the README's lines: none has a `#` in a quoted string followed by two spaces).
fn split_comment(l: &str) -> (&str, &str) {
    match l.find("  #") {
        Some(i) if !l.trim_start().starts_with('#') => {
            (l[..i].trim_end(), l[i..].trim_start_matches([' ', '#']))
        }
        _ => (l, ""),
    }
}

/// The script a block becomes (see the module docs); `work` is where `/tmp/` goes.
fn script(lines: &[String], bin: &str, port: u16, work: &Path) -> String {
    let tmp = work.join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    // `/tmp/` first: the binary may itself live under /tmp (a checkout there).
    let local = |s: &str| {
        s.replace("/tmp/", &format!("{}/", tmp.display()))
            .replace("./target/release/trireme", bin)
            .replace("10809", &port.to_string())
    };
    // Whatever the block leaves running goes when the script ends, failed or not (a process
    // left holding the script's output would hang the test): the FUSE mounts first, then the
    // processes it started in the background.
    let mut out = String::from(
        "set -e\nset -o pipefail\nset -x\npids=\nmounts=\n\
         cleanup() { for m in $mounts; do umount $m 2>/dev/null || true; done; \
         kill $pids 2>/dev/null || true; wait || true; }\ntrap cleanup EXIT\n",
    );
    let mut i = 0;
    while i < lines.len() {
        let (cmd, comment) = split_comment(&lines[i]);
        let cmd = local(cmd);
        i += 1;
        if cmd.trim().is_empty() || cmd.trim_start().starts_with('#') {
            continue;
        }
        // `# error:` lines after it: what it must say as it fails.
        let mut error = String::new();
        while i < lines.len() {
            let t = lines[i].trim_start();
            let more = match error.is_empty() {
                true => t.starts_with("# error:"),
                false => t.starts_with("#   "),
            };
            if !more {
                break;
            }
            error += t.trim_start_matches("# error:").trim_start_matches('#');
            error.push(' ');
            i += 1;
        }
        let n = i;
        if !error.is_empty() {
            let want = error.split_whitespace().collect::<Vec<_>>().join(" ");
            out += &format!(
                "if out=$({cmd} 2>&1); then echo \"README line {n} should fail: $out\" >&2; exit 1; fi\n\
                 got=$(echo $out)\n\
                 case \"$got\" in *{want:?}*) ;; *) echo \"README line {n} says: {} / it said: $got\" >&2; exit 1;; esac\n",
                want.replace('"', "'")
            );
        } else if comment.contains("refused") {
            out += &format!(
                "if {cmd}; then echo 'README line {n} should be refused: {}' >&2; exit 1; fi\n",
                cmd.replace('\'', "")
            );
        } else {
            out += &cmd;
            out.push('\n');
        }
        if cmd.trim_end().ends_with('&') {
            out += "pids=\"$pids $!\"\n";
            let words: Vec<&str> = cmd.split_whitespace().collect();
            if let Some(k) = words.iter().position(|w| *w == "--socket") {
                out += &format!(
                    "for i in $(seq 200); do [ -S {} ] && break; sleep 0.1; done\n",
                    words[k + 1]
                );
            }
            if let Some(k) = words.iter().position(|w| *w == "nbdfuse") {
                out += &format!(
                    "for i in $(seq 200); do [ -e {}/nbd ] && break; sleep 0.1; done\n",
                    words[k + 1]
                );
                out += &format!("mounts=\"$mounts {}\"\n", words[k + 1]);
            }
        }
    }
    out
}

/// `trireme up ARGS` in `dir` on its default data directory, until its exports are written.
fn up(dir: &Path, args: &[&str]) -> Up {
    let log = std::fs::File::create(dir.join("up.log")).unwrap();
    let mut child = Command::new(BIN)
        .current_dir(dir)
        .arg("up")
        .args(args)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while !dir.join("trireme-data/exports").exists() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "up exited: {}",
            up_log(dir)
        );
        assert!(t0.elapsed() < Duration::from_secs(60), "{}", up_log(dir));
        std::thread::sleep(Duration::from_millis(100));
    }
    Up(child)
}

fn up_log(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("up.log")).unwrap_or_default()
}

/// A started `up`, stopped as Ctrl-C stops it when dropped: at a test's end, and when it
/// fails (nothing it started outlives it).
struct Up(Child);

impl Drop for Up {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the `up` this test started.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGINT) };
        let t0 = Instant::now();
        while matches!(self.0.try_wait(), Ok(None)) {
            if t0.elapsed() > Duration::from_secs(60) {
                let _ = self.0.kill();
                let _ = self.0.wait();
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn run_script(dir: &Path, s: &str) {
    let out = Command::new("bash")
        .current_dir(dir)
        .arg("-c")
        .arg(s)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the README's commands failed ({}):\n{}\n{}\nscript:\n{s}\nup's log:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        up_log(dir)
    );
    // What ran, for `--nocapture`.
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn the_tour_runs_as_written() {
    for t in ["qemu-img", "nbdinfo", "nbdfuse"] {
        need(t);
    }
    let work = tempfile::tempdir().unwrap();
    let port = free_port();
    let lines = block_after("In another terminal:");
    let s = script(&lines, BIN, port, work.path());
    let _cluster = up(work.path(), &["--port", &port.to_string()]);
    run_script(work.path(), &s);
}

#[test]
fn the_space_example_runs_as_written() {
    let work = tempfile::tempdir().unwrap();
    let mut lines = block_after("### Space: thin volumes");
    // Its first line starts the cluster: started here, on a free port.
    let first = lines.remove(0);
    let (cmd, _) = split_comment(&first);
    let args: Vec<&str> = cmd.split_whitespace().skip(2).collect();
    assert_eq!(cmd.split_whitespace().nth(1), Some("up"), "{first}");
    let port = free_port().to_string();
    let mut all = args.clone();
    all.extend(["--port", &port]);
    let s = script(
        &[vec!["T=./target/release/trireme".to_string()], lines].concat(),
        BIN,
        0,
        work.path(),
    );
    let _cluster = up(work.path(), &all);
    run_script(work.path(), &s);
}
