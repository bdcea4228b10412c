//! What a request to the HTTP endpoint carries as its token (bearer header, cookie, query),
//! and the sizes, rates and durations an operator writes on the command line: never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

#[path = "../../crates/cli/src/units.rs"]
#[allow(dead_code)]
mod units;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let _ = units::parse_size(s);
    let _ = units::parse_duration(s);
    let _ = units::parse_interval(s);
    let _ = units::parse_dirty_grain(s);
    let mut parts = s.splitn(3, '\n');
    let (auth, cookie, query) = (
        parts.next().unwrap_or(""),
        parts.next().unwrap_or(""),
        parts.next().unwrap_or(""),
    );
    let mut b = axum::http::Request::builder().uri(format!("/metrics?{}", query.replace(' ', "")));
    if !auth.is_empty() {
        b = b.header("authorization", auth);
    }
    if !cookie.is_empty() {
        b = b.header("cookie", cookie);
    }
    if let Ok(t) = trireme_daemon::http::Token::parse(s) {
        assert!(t.matches(s.trim()));
    }
    if let Ok(req) = b.body(axum::body::Body::empty()) {
        if let Some((t, _)) = trireme_daemon::http::Token::carried(&req, "trireme_token_1") {
            let token = trireme_daemon::http::Token::parse("0123456789abcdef0123456789abcdef").unwrap();
            let _ = token.matches(&t);
        }
    }
});
