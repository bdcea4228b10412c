//! Who may read an HTTP endpoint: whoever holds its token. The token lives in a file only its
//! owner can read (0600), as the control socket takes only its owner's processes: the same
//! access rule, over HTTP. A request carries it as `Authorization: Bearer TOKEN` (Prometheus:
//! `authorization: {credentials_file: ...}`), or a browser opens `/?token=TOKEN` once and gets
//! it back as a cookie for the page's own requests.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::DaemonError;

/// The name of the cookie a browser keeps the token of the endpoint on `port` in. Cookies
/// are kept per host, not per port: two clusters on one host each need their own.
pub fn cookie(port: u16) -> String {
    format!("trireme_token_{port}")
}

#[derive(Clone)]
pub struct Token(String);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

impl Token {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The token in `file` if given, else the one in `dir/http-token` (made if missing).
    pub fn for_dir(file: Option<&Path>, dir: &Path) -> Result<Token, DaemonError> {
        match file {
            Some(f) => Token::load(f),
            None => Token::load_or_create(&dir.join("http-token")),
        }
    }

    /// Reads the token in `path`, or makes one there (0600) if there is none.
    pub fn load_or_create(path: &Path) -> Result<Token, DaemonError> {
        match Token::load(path) {
            Ok(t) => return Ok(t),
            Err(_) if !path.exists() => {}
            Err(e) => return Err(e),
        }
        let mut bytes = [0u8; 16];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
            .map_err(|e| DaemonError::Runtime(format!("/dev/urandom: {e}")))?;
        let text: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let tmp = path.with_extension("tmp");
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(format!("{text}\n").as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        Ok(Token(text))
    }

    /// Reads the token in `path`: one line of 16 to 256 visible ASCII characters.
    pub fn load(path: &Path) -> Result<Token, DaemonError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| DaemonError::Usage(format!("HTTP token file {}: {e}", path.display())))?;
        Token::parse(&text)
            .map_err(|e| DaemonError::Usage(format!("HTTP token file {}: {e}", path.display())))
    }

    /// A token file's text: one line of 16 to 256 visible ASCII characters.
    pub fn parse(text: &str) -> Result<Token, String> {
        let t = text.trim();
        if !(16..=256).contains(&t.len()) || !t.bytes().all(|b| b.is_ascii_graphic()) {
            return Err("expected one line of 16 to 256 visible ASCII characters".into());
        }
        Ok(Token(t.to_string()))
    }

    /// Compares in time independent of where the strings differ.
    pub fn matches(&self, given: &str) -> bool {
        let (a, b) = (self.0.as_bytes(), given.as_bytes());
        a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
    }

    /// The token a request carries, if any: bearer header, cookie, or `token=` in the query
    /// (the last says to set the cookie).
    pub fn carried(req: &axum::extract::Request, cookie: &str) -> Option<(String, bool)> {
        let headers = req.headers();
        // `Bearer TOKEN`, or the bare token: Prometheus 2.42's HTTP service discovery sends
        // its `credentials_file` without the scheme unless `type: Bearer` is spelled out.
        if let Some(v) = headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
        {
            let v = v.trim();
            return Some((
                v.strip_prefix("Bearer ").unwrap_or(v).trim().to_string(),
                false,
            ));
        }
        for v in headers.get_all(axum::http::header::COOKIE) {
            let Ok(v) = v.to_str() else { continue };
            for kv in v.split(';') {
                if let Some(t) = kv.trim().strip_prefix(&format!("{cookie}=")) {
                    return Some((t.to_string(), false));
                }
            }
        }
        req.uri()
            .query()
            .into_iter()
            .flat_map(|q| q.split('&'))
            .find_map(|kv| kv.strip_prefix("token="))
            .map(|t| (t.to_string(), true))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn made_once_kept_private_and_read_back() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("sub").join("http-token");
        let a = Token::load_or_create(&p).unwrap();
        assert_eq!(a.as_str().len(), 32);
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let b = Token::load_or_create(&p).unwrap();
        assert!(a.matches(b.as_str()));
        assert!(!a.matches("x"));
        assert!(!a.matches(&b.as_str().replace(&b.as_str()[..1], "#")));
        std::fs::write(&p, "short\n").unwrap();
        assert!(
            Token::load_or_create(&p).is_err(),
            "a bad token file is not replaced"
        );
    }

    #[test]
    fn found_in_header_cookie_or_query() {
        let req = |h: Option<(&str, &str)>, uri: &str| {
            let mut b = axum::http::Request::builder().uri(uri);
            if let Some((k, v)) = h {
                b = b.header(k, v);
            }
            b.body(axum::body::Body::empty()).unwrap()
        };
        let c = cookie(8080);
        assert_eq!(
            Token::carried(&req(Some(("authorization", "Bearer abc")), "/metrics"), &c),
            Some(("abc".into(), false))
        );
        assert_eq!(
            Token::carried(&req(Some(("authorization", "abc")), "/targets"), &c),
            Some(("abc".into(), false))
        );
        assert_eq!(
            Token::carried(
                &req(Some(("cookie", "a=1; trireme_token_8080=xyz")), "/"),
                &c
            ),
            Some(("xyz".into(), false))
        );
        // Another endpoint's cookie on the same host is not this one's.
        assert_eq!(
            Token::carried(&req(Some(("cookie", "trireme_token_9090=xyz")), "/"), &c),
            None
        );
        assert_eq!(
            Token::carried(&req(None, "/?x=1&token=q"), &c),
            Some(("q".into(), true))
        );
        assert_eq!(Token::carried(&req(None, "/"), &c), None);
    }
}
