//! README's "Running on several servers" block as the test reads it: its commands, which
//! host runs each, and the changes a test (or the paragraph after the block) makes to them.

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Role {
    Operator,
    Server,
    Client,
}

/// One step of the block.
#[derive(Debug)]
pub enum Step {
    /// Where the block says etcd's members run.
    StartEtcd,
    Cmd(Line),
}

/// One command: continuation lines joined, with the comment at its end.
#[derive(Debug, Clone)]
pub struct Line {
    pub role: Role,
    pub text: String,
    pub comment: String,
    /// The comment before it said it is for every host (an `export`).
    pub every_host: bool,
}

pub fn readme_block() -> Vec<Step> {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let sec = readme
        .find("## Running on several servers")
        .expect("README has a section \"Running on several servers\"");
    let start = sec + readme[sec..].find("```sh\n").expect("its ```sh block") + 6;
    let end = start + readme[start..].find("\n```").unwrap();
    let mut role = Role::Operator;
    let mut every_host = false;
    let mut steps = Vec::new();
    let mut pending = String::new();
    for raw in readme[start..end].lines() {
        let t = raw.trim();
        if pending.is_empty() && t.starts_with('#') {
            let c = t.to_lowercase();
            if c.contains("on an operator's machine")
                || c.contains("with the operator's identity")
                || c.contains("from the operator's machine")
            {
                role = Role::Operator;
            } else if c.starts_with("# on every server") {
                role = Role::Server;
            } else if c.starts_with("# on the client host") {
                role = Role::Client;
            }
            if c.contains("on every host") {
                every_host = true;
            }
            if c.contains("etcd 3 or 5 members") {
                steps.push(Step::StartEtcd);
            }
            continue;
        }
        if t.is_empty() {
            continue;
        }
        let (code, comment) = split_comment(raw);
        if let Some(head) = code.trim_end().strip_suffix('\\') {
            pending += head;
            pending.push(' ');
            continue;
        }
        pending += code;
        steps.push(Step::Cmd(Line {
            role,
            text: pending.trim().to_string(),
            comment: comment.trim().to_string(),
            every_host,
        }));
        every_host = false;
        pending.clear();
    }
    steps
}

/// A shell line's code and its comment (from an unquoted `#` that starts a word).
pub fn split_comment(line: &str) -> (&str, &str) {
    let (mut single, mut double) = (false, false);
    let mut prev = ' ';
    for (i, ch) in line.char_indices() {
        match ch {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            '#' if !single && !double && prev.is_whitespace() => {
                return (&line[..i], &line[i + 1..]);
            }
            _ => {}
        }
        prev = ch;
    }
    (line, "")
}

/// Words as a shell splits them (quotes removed; no expansions: the block has none).
pub fn words(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quote: Option<char> = None;
    let mut any = false;
    for ch in code.chars() {
        match (quote, ch) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => cur.push(c),
            (None, '\'' | '"') => {
                quote = Some(ch);
                any = true;
            }
            (None, c) if c.is_whitespace() => {
                if any || !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
                any = false;
            }
            (None, c) => cur.push(c),
        }
    }
    assert!(quote.is_none(), "unbalanced quotes in {code:?}");
    if any || !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// Server `i`'s version of a line written for server 1.
pub fn for_server(s: &str, i: u32) -> String {
    let zone = (b'a' + (i - 1) as u8) as char;
    s.replace("10.0.1.11", &format!("10.0.1.{}", 10 + i))
        .replace("node-1", &format!("node-{i}"))
        .replace("node 1 ", &format!("node {i} "))
        .replace("--id 1 ", &format!("--id {i} "))
        .replace("rack-a", &format!("rack-{zone}"))
}

/// etcd member `i`'s version of a line written for member 1.
pub fn for_etcd_member(s: &str, i: u32) -> String {
    s.replace("10.0.0.1", &format!("10.0.0.{i}"))
        .replace("etcd-1", &format!("etcd-{i}"))
}

/// `100G` becomes `1G`: the block's sizes, cut to fit a test machine's disk.
pub fn scaled(w: String) -> String {
    match w.strip_suffix('G').and_then(|n| n.parse::<u64>().ok()) {
        Some(n) if n >= 100 && n % 100 == 0 => format!("{}G", n / 100),
        _ => w,
    }
}

/// The paragraph after the block, applied to a command's words: no `ca` or `etcd rbac`
/// commands and no identities, `--insecure` for `--tls-dir DIR`, `http://` for etcd and
/// `nbd://` without `tls-certificates` for NBD. `None`: the command is left out.
pub fn without_certificates(w: Vec<String>) -> Option<Vec<String>> {
    if w[0] == "trireme" {
        let sub: Vec<&str> = w[1..]
            .iter()
            .map(String::as_str)
            .filter(|a| !a.starts_with('-') && !a.starts_with('.'))
            .collect();
        if sub.first() == Some(&"ca") || sub.windows(2).any(|p| p == ["etcd", "rbac"]) {
            return None;
        }
    }
    if w[0] == "export" && w[1].starts_with("TRIREME_TLS_IDENTITY=") {
        return None;
    }
    let mut out = Vec::new();
    let mut it = w.into_iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--tls-identity" => {
                it.next();
            }
            "--tls-dir" => {
                it.next();
                out.push("--insecure".to_string());
            }
            _ if a.starts_with("nbds://") => {
                let plain = a.replacen("nbds://", "nbd://", 1);
                out.push(match plain.split_once("?tls-certificates=") {
                    Some((uri, _)) => uri.to_string(),
                    None => plain,
                });
            }
            _ => out.push(a.replace("https://", "http://")),
        }
    }
    Some(out)
}
