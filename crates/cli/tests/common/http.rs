//! HTTP and TLS clients for tests: one request per connection, as a browser or Prometheus
//! would make it, and raw bytes over mutual TLS (`openssl s_client`).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// Sends `bytes` to `addr` over TLS with the client identity in `dir` (`openssl s_client`),
/// and returns what came back within two seconds.
pub fn tls_exchange(addr: &str, dir: &Path, bytes: &[u8]) -> Vec<u8> {
    use std::io::{Read, Write};
    let mut child = Command::new("openssl")
        .args(["s_client", "-quiet", "-ign_eof", "-connect", addr])
        .arg("-CAfile")
        .arg(dir.join("ca-cert.pem"))
        .arg("-cert")
        .arg(dir.join("client-cert.pem"))
        .arg("-key")
        .arg(dir.join("client-key.pem"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(bytes).unwrap();
    let mut out = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut got = Vec::new();
        let _ = out.read_to_end(&mut got);
        got
    });
    std::thread::sleep(Duration::from_secs(2));
    let _ = child.kill();
    let _ = child.wait();
    reader.join().unwrap()
}

/// One HTTP/1.1 request to `addr` (`host:port`) on a connection closed after it: the status
/// and the body (a chunked one put together).
pub fn http(addr: &str, method: &str, path: &str, body: Option<&str>) -> (u16, Vec<u8>) {
    http_full(addr, method, path, &[], body)
}

/// [`http`] with extra headers and no body.
pub fn http_with(addr: &str, method: &str, path: &str, headers: &[(&str, &str)]) -> (u16, Vec<u8>) {
    http_full(addr, method, path, headers, None)
}

fn http_full(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> (u16, Vec<u8>) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("{addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let body = body.unwrap_or("");
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{extra}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    // Read until the body is whole (some servers keep the connection open regardless).
    let mut out = Vec::new();
    let mut buf = [0u8; 65536];
    let (split, head) = loop {
        if let Some(p) = out.windows(4).position(|w| w == b"\r\n\r\n") {
            break (p, String::from_utf8_lossy(&out[..p]).to_string());
        }
        let n = s.read(&mut buf).unwrap();
        assert!(
            n > 0,
            "{method} {path}: closed before the headers ended: {:?}",
            String::from_utf8_lossy(&out)
        );
        out.extend_from_slice(&buf[..n]);
    };
    let lower = head.to_ascii_lowercase();
    let length = lower
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map(|v| v.trim().parse::<usize>().unwrap());
    let chunked = lower.contains("transfer-encoding: chunked");
    loop {
        let have = out.len() - split - 4;
        let done = match length {
            Some(l) => have >= l,
            None if chunked => out.ends_with(b"0\r\n\r\n"),
            None => false,
        };
        if done {
            break;
        }
        let n = s.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("{method} {path}: bad status line {head:?}"));
    let mut body = out[split + 4..].to_vec();
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        let mut whole = Vec::new();
        let mut rest = &body[..];
        loop {
            let eol = rest
                .windows(2)
                .position(|w| w == b"\r\n")
                .expect("chunk size line");
            let size_text = String::from_utf8_lossy(&rest[..eol]).to_string();
            let size = usize::from_str_radix(size_text.split(';').next().unwrap().trim(), 16)
                .unwrap_or_else(|_| panic!("bad chunk size {size_text:?}"));
            rest = &rest[eol + 2..];
            if size == 0 {
                break;
            }
            whole.extend_from_slice(&rest[..size]);
            rest = &rest[size + 2..];
        }
        body = whole;
    }
    (code, body)
}

/// GET of a JSON document.
pub fn http_json(addr: &str, path: &str) -> serde_json::Value {
    let (code, body) = http(addr, "GET", path, None);
    assert_eq!(code, 200, "GET {path}: {}", String::from_utf8_lossy(&body));
    serde_json::from_slice(&body).unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

/// Percent-encodes a query parameter.
pub fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The status line and headers of `GET path` on `addr`, lowercased.
pub fn http_head(addr: &str, path: &str, headers: &[(&str, &str)]) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("{addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{extra}\r\n"
    )
    .unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while !out.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = s.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&out).to_ascii_lowercase()
}
