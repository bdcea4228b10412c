//! The handshake: greeting and option haggling, up to the export a client picks.

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::codec::{decode_go, decode_meta};
use crate::consts::*;
use crate::server::{Allowed, Outcome, Session, Tls, MAX_OPTION, MAX_OPTION_SKIP};
use crate::{BlockDevice, Exports, NbdError, MAX_REQUEST, PREFERRED_BLOCK};

pub(crate) async fn opt_reply<W: AsyncWrite + Unpin>(
    w: &mut W,
    opt: u32,
    kind: u32,
    data: &[u8],
) -> std::io::Result<()> {
    let mut b = Vec::with_capacity(20 + data.len());
    b.extend_from_slice(&REPLY_MAGIC.to_be_bytes());
    b.extend_from_slice(&opt.to_be_bytes());
    b.extend_from_slice(&kind.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    w.write_all(&b).await
}

pub(crate) async fn opt_error<W: AsyncWrite + Unpin>(
    w: &mut W,
    opt: u32,
    kind: u32,
    msg: &str,
) -> std::io::Result<()> {
    tracing::debug!(opt, kind, "option refused: {msg}");
    opt_reply(w, opt, kind, msg.as_bytes()).await
}

pub(crate) fn transmission_flags<B: BlockDevice>(b: &B, structured: bool) -> u16 {
    let mut f =
        TF_HAS_FLAGS | TF_SEND_FLUSH | TF_SEND_FUA | TF_SEND_WRITE_ZEROES | TF_SEND_FAST_ZERO;
    if structured {
        f |= TF_SEND_DF;
    }
    let caps = b.caps();
    if caps.trim {
        f |= TF_SEND_TRIM;
    }
    if caps.shared_flush {
        f |= TF_CAN_MULTI_CONN;
    }
    if caps.read_only {
        f |= TF_READ_ONLY;
    }
    f
}

/// Sends the greeting and reads the client's flags; returns whether it wants no zeroes.
pub(crate) async fn greet<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S) -> Result<bool, NbdError> {
    let mut greet = Vec::with_capacity(18);
    greet.extend_from_slice(&NBDMAGIC.to_be_bytes());
    greet.extend_from_slice(&IHAVEOPT.to_be_bytes());
    greet.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    s.write_all(&greet).await?;
    s.flush().await?;
    let client_flags = s.read_u32().await?;
    if client_flags & !(CLIENT_FIXED_NEWSTYLE | CLIENT_NO_ZEROES) != 0 {
        return Err(NbdError::Protocol(format!(
            "unknown client flags {client_flags:#x}"
        )));
    }
    Ok(client_flags & CLIENT_NO_ZEROES != 0)
}

/// Runs the option haggling on `s` (everything negotiated before TLS is forgotten after it).
pub(crate) async fn options<S, B>(
    s: &mut S,
    exports: &Exports<B>,
    no_zeroes: bool,
    tls: Tls,
    gate: Option<&Allowed<'_>>,
) -> Result<Outcome<B>, NbdError>
where
    S: AsyncRead + AsyncWrite + Unpin,
    B: BlockDevice,
{
    let mut structured = false;
    // The contexts set, and for which export (a GO to another one drops them).
    let mut meta: (String, Vec<(u32, String)>) = (String::new(), Vec::new());
    let mut warned = false;
    loop {
        s.flush().await?;
        let magic = match s.read_u64().await {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(Outcome::Quit),
            Err(e) => return Err(e.into()),
        };
        if magic != IHAVEOPT {
            return Err(NbdError::Protocol(format!(
                "expected an option, got magic {magic:#018x}"
            )));
        }
        let opt = s.read_u32().await?;
        let len = s.read_u32().await?;
        if len > MAX_OPTION {
            if len > MAX_OPTION_SKIP {
                return Err(NbdError::Protocol(format!(
                    "option {opt} with a {len}-byte payload"
                )));
            }
            tokio::io::copy(&mut (&mut *s).take(u64::from(len)), &mut tokio::io::sink()).await?;
            opt_error(s, opt, REP_ERR_TOO_BIG, "option payload too large").await?;
            continue;
        }
        let mut data = vec![0u8; len as usize];
        s.read_exact(&mut data).await?;
        if tls == Tls::Required && opt != OPT_STARTTLS && opt != OPT_ABORT {
            if opt == OPT_EXPORT_NAME {
                // No error reply exists for this option: closing is the answer.
                return Err(NbdError::Refused(
                    "a plaintext client asked for an export; this listener requires TLS".into(),
                ));
            }
            if !warned {
                tracing::warn!(
                    opt,
                    "NBD client sent an option before STARTTLS: refused, this listener requires TLS"
                );
                warned = true;
            }
            opt_error(
                s,
                opt,
                REP_ERR_TLS_REQD,
                "TLS is required: send NBD_OPT_STARTTLS first",
            )
            .await?;
            continue;
        }
        match opt {
            OPT_EXPORT_NAME => {
                let name = String::from_utf8_lossy(&data);
                if Allowed::denies(gate, &name) {
                    // No error reply exists for this option: closing is the answer.
                    return Err(NbdError::Refused(format!(
                        "export {name:?} is not open to this client"
                    )));
                }
                let Some((_, _, b)) = exports.get(&name) else {
                    // The protocol has no error reply here: closing is the answer.
                    return Err(NbdError::Protocol(format!("unknown export {name:?}")));
                };
                let mut out = Vec::with_capacity(134);
                out.extend_from_slice(&b.size().to_be_bytes());
                out.extend_from_slice(&transmission_flags(&**b, structured).to_be_bytes());
                if !no_zeroes {
                    out.extend_from_slice(&[0u8; 124]);
                }
                s.write_all(&out).await?;
                s.flush().await?;
                return Ok(Outcome::Go(Session {
                    backend: b.clone(),
                    structured,
                    contexts: contexts_for(&meta, &name, exports),
                    live_size: false,
                }));
            }
            OPT_ABORT => {
                opt_reply(s, opt, REP_ACK, &[]).await?;
                s.flush().await?;
                return Ok(Outcome::Quit);
            }
            OPT_LIST => {
                if !data.is_empty() {
                    opt_error(s, opt, REP_ERR_INVALID, "NBD_OPT_LIST takes no data").await?;
                    continue;
                }
                for (name, _) in exports.names() {
                    if gate.is_some_and(|g| !(g.allow)(name, g.client)) {
                        continue;
                    }
                    let mut d = Vec::with_capacity(4 + name.len());
                    d.extend_from_slice(&(name.len() as u32).to_be_bytes());
                    d.extend_from_slice(name.as_bytes());
                    opt_reply(s, opt, REP_SERVER, &d).await?;
                }
                opt_reply(s, opt, REP_ACK, &[]).await?;
            }
            OPT_INFO | OPT_GO => {
                let req = match decode_go(&data) {
                    Ok(r) => r,
                    Err(e) => {
                        opt_error(s, opt, REP_ERR_INVALID, &e.to_string()).await?;
                        continue;
                    }
                };
                if Allowed::denies(gate, &req.name) {
                    opt_error(
                        s,
                        opt,
                        REP_ERR_POLICY,
                        &format!("export {:?} is not open to this client", req.name),
                    )
                    .await?;
                    continue;
                }
                let Some((name, desc, b)) = exports.get(&req.name) else {
                    opt_error(
                        s,
                        opt,
                        REP_ERR_UNKNOWN,
                        &format!("no export named {:?}", req.name),
                    )
                    .await?;
                    continue;
                };
                let mut d = Vec::with_capacity(12);
                d.extend_from_slice(&INFO_EXPORT.to_be_bytes());
                d.extend_from_slice(&b.size().to_be_bytes());
                d.extend_from_slice(&transmission_flags(&**b, structured).to_be_bytes());
                opt_reply(s, opt, REP_INFO, &d).await?;
                for &i in &req.info {
                    let mut d = Vec::new();
                    d.extend_from_slice(&i.to_be_bytes());
                    match i {
                        INFO_NAME => d.extend_from_slice(name.as_bytes()),
                        INFO_DESCRIPTION => d.extend_from_slice(desc.as_bytes()),
                        INFO_BLOCK_SIZE => {
                            let min = b.min_block();
                            d.extend_from_slice(&min.to_be_bytes());
                            d.extend_from_slice(&PREFERRED_BLOCK.max(min).to_be_bytes());
                            d.extend_from_slice(&MAX_REQUEST.to_be_bytes());
                        }
                        _ => continue,
                    }
                    opt_reply(s, opt, REP_INFO, &d).await?;
                }
                opt_reply(s, opt, REP_ACK, &[]).await?;
                if opt == OPT_GO {
                    s.flush().await?;
                    return Ok(Outcome::Go(Session {
                        backend: b.clone(),
                        structured,
                        contexts: contexts_for(&meta, &req.name, exports),
                        live_size: false,
                    }));
                }
            }
            OPT_STRUCTURED_REPLY => {
                if !data.is_empty() {
                    opt_error(
                        s,
                        opt,
                        REP_ERR_INVALID,
                        "NBD_OPT_STRUCTURED_REPLY takes no data",
                    )
                    .await?;
                    continue;
                }
                structured = true;
                opt_reply(s, opt, REP_ACK, &[]).await?;
            }
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => {
                if !structured {
                    opt_error(
                        s,
                        opt,
                        REP_ERR_INVALID,
                        "negotiate structured replies first",
                    )
                    .await?;
                    continue;
                }
                let req = match decode_meta(&data) {
                    Ok(r) => r,
                    Err(e) => {
                        opt_error(s, opt, REP_ERR_INVALID, &e.to_string()).await?;
                        continue;
                    }
                };
                // Nothing is said of an export this client may not open (not even that it
                // exists).
                if Allowed::denies(gate, &req.name) {
                    opt_error(
                        s,
                        opt,
                        REP_ERR_POLICY,
                        &format!("export {:?} is not open to this client", req.name),
                    )
                    .await?;
                    continue;
                }
                let Some((_, _, b)) = exports.get(&req.name) else {
                    opt_error(
                        s,
                        opt,
                        REP_ERR_UNKNOWN,
                        &format!("no export named {:?}", req.name),
                    )
                    .await?;
                    continue;
                };
                let listing = opt == OPT_LIST_META_CONTEXT;
                let mut offered = vec![BASE_ALLOCATION.to_string()];
                offered.extend(b.contexts().await);
                let chosen = choose_contexts(&offered, &req.queries, listing);
                let ids: Vec<(u32, String)> = chosen
                    .into_iter()
                    .enumerate()
                    .map(|(k, name)| {
                        let id = if listing {
                            0
                        } else if name == BASE_ALLOCATION {
                            BASE_ALLOCATION_ID
                        } else {
                            BASE_ALLOCATION_ID + 1 + k as u32
                        };
                        (id, name)
                    })
                    .collect();
                for (id, name) in &ids {
                    let mut d = Vec::with_capacity(4 + name.len());
                    d.extend_from_slice(&id.to_be_bytes());
                    d.extend_from_slice(name.as_bytes());
                    opt_reply(s, opt, REP_META_CONTEXT, &d).await?;
                }
                if !listing {
                    meta = (req.name.clone(), ids);
                }
                opt_reply(s, opt, REP_ACK, &[]).await?;
            }
            OPT_STARTTLS => match tls {
                Tls::Off => {
                    opt_error(
                        s,
                        opt,
                        REP_ERR_UNSUP,
                        "no TLS on this listener (a unix socket, or a TCP export started with --insecure)",
                    )
                    .await?
                }
                Tls::On => opt_error(s, opt, REP_ERR_INVALID, "TLS is already on").await?,
                Tls::Required if !data.is_empty() => {
                    opt_error(s, opt, REP_ERR_INVALID, "NBD_OPT_STARTTLS takes no data").await?
                }
                Tls::Required => {
                    opt_reply(s, opt, REP_ACK, &[]).await?;
                    s.flush().await?;
                    return Ok(Outcome::StartTls);
                }
            },
            _ => opt_error(s, opt, REP_ERR_UNSUP, "unsupported option").await?,
        }
    }
}

/// The contexts of `offered` that `queries` pick. Setting takes exact names only; listing
/// also takes a namespace (`base:`, `qemu:`) or a leading part ending in `:`
/// (`qemu:dirty-bitmap:`), and no query at all lists everything.
pub(crate) fn choose_contexts(
    offered: &[String],
    queries: &[String],
    listing: bool,
) -> Vec<String> {
    offered
        .iter()
        .filter(|name| {
            (listing && queries.is_empty())
                || queries.iter().any(|q| {
                    *q == **name
                        || (listing
                            && (q.is_empty() || q.ends_with(':'))
                            && name.starts_with(q.as_str()))
                })
        })
        .cloned()
        .collect()
}

/// The contexts set for `export`, if the last `SET_META_CONTEXT` named it (the empty name and
/// the default export's own name are the same export).
fn contexts_for<B: BlockDevice>(
    meta: &(String, Vec<(u32, String)>),
    export: &str,
    exports: &Exports<B>,
) -> Vec<(u32, String)> {
    let name = |n: &str| exports.get(n).map(|e| e.0.to_string());
    if name(&meta.0).is_some() && name(&meta.0) == name(export) {
        meta.1.clone()
    } else {
        Vec::new()
    }
}
