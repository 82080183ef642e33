//! The handshake: an agent proves its token (and, with mTLS, the host its
//! certificate names) in its hello before any batch is read; a refusal says
//! why in one line and is counted.

use super::*;

/// How soon an agent refused because another connection holds its host or
/// id is told to try again. A killed agent's connection is closed after
/// [`AGENT_SILENCE_TIMEOUT`]; its restarted successor, refused until then,
/// connects within this of it (with its own backoff, 200 ms doubling to
/// 5 s, it once connected 7 s after the kill, after its job had ended).
/// A handshake every half second from one host costs nothing.
const IN_USE_RETRY: Duration = Duration::from_millis(500);

/// Compares without an early exit, so timing does not leak the token.
pub(super) fn token_matches(given: &str, expected: &str) -> bool {
    let (a, b) = (given.as_bytes(), expected.as_bytes());
    let mut diff = a.len() ^ b.len();
    for i in 0..a.len().max(b.len()) {
        diff |= usize::from(a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0));
    }
    diff == 0
}

/// Reads the hello, all of it within [`HELLO_TIMEOUT`].
pub(super) async fn read_hello(conn: &Connection) -> Result<(quinn::SendStream, Hello), Refusal> {
    let read = async {
        let (send, mut recv) = conn.accept_bi().await.map_err(|e| {
            Refusal::new(
                "lost_before_hello",
                format!("connection lost before hello: {e}"),
            )
        })?;
        let bytes = recv.read_to_end(MAX_HELLO).await.map_err(|e| match e {
            quinn::ReadToEndError::TooLong => Refusal::new(
                "malformed_hello",
                format!("hello larger than {MAX_HELLO} bytes"),
            ),
            e => Refusal::new("lost_before_hello", format!("reading hello: {e}")),
        })?;
        let hello: Hello = wire::decode(&bytes)
            .map_err(|e| Refusal::new("malformed_hello", format!("malformed hello: {e}")))?;
        Ok((send, hello))
    };
    tokio::time::timeout(HELLO_TIMEOUT, read)
        .await
        .map_err(|_| Refusal::new("hello_timeout", "no complete hello within 10 s"))?
}

pub(super) async fn reply(
    send: &mut quinn::SendStream,
    accepted: bool,
    reason: String,
    retry_after_ms: u32,
) {
    let r = HelloReply {
        accepted,
        reason,
        retry_after_ms,
    };
    if let Ok(bytes) = wire::encode(&r) {
        let _ = send.write_all(&bytes).await;
        let _ = send.finish();
        // Bounded: a peer that never acknowledges must not hold us here.
        let _ = tokio::time::timeout(HELLO_TIMEOUT, send.stopped()).await;
    }
}

/// The host the peer's verified certificate binds it to (mutual TLS with
/// per-host certificates); `None` without a certificate or for a job-wide one.
pub(super) fn certificate_host(conn: &Connection) -> Result<Option<String>, Refusal> {
    let Some(chain) = conn
        .peer_identity()
        .and_then(|id| id.downcast::<Vec<CertificateDer<'static>>>().ok())
    else {
        return Ok(None);
    };
    match chain.first() {
        Some(leaf) => crate::net::tls::cert_host(leaf)
            .map_err(|e| Refusal::new("bad_certificate", format!("agent certificate: {e}"))),
        None => Ok(None),
    }
}

/// Whether `agent_id` may be used by an agent bound to `host`: the agent
/// makes its id as `<host>-<pid>-<time>`, so one host's certificate cannot
/// take (or poison the batch numbering of) another host's agent id.
pub(super) fn agent_id_of_host(agent_id: &str, host: &str) -> bool {
    agent_id
        .strip_prefix(host)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('-'))
}

/// Reads and judges the hello: a valid token, the host its certificate is
/// bound to (if it is), and an agent id and host no other live connection
/// holds (claimed for `conn` on success).
pub(super) async fn handshake(conn: &Connection, shared: &Shared) -> Result<Hello, Refusal> {
    let (mut send, hello) = read_hello(conn).await?;
    let bound = certificate_host(conn)?;
    let refusal = if !token_matches(&hello.token, &shared.token) {
        Some(Refusal::new("invalid_token", "invalid job token"))
    } else if let Some(h) = bound.as_ref().filter(|h| **h != hello.host) {
        Some(Refusal::new(
            "host_not_in_certificate",
            format!(
                "the hello claims host {:?} but the agent's certificate is for {h:?} \
                 (run the agent with --host {h})",
                hello.host
            ),
        ))
    } else if let Some(h) = bound
        .as_ref()
        .filter(|h| !agent_id_of_host(&hello.agent_id, h))
    {
        Some(Refusal::new(
            "agent_id_not_in_certificate",
            format!(
                "agent id {:?} is not one of host {h:?}'s (`{h}-...`), which the certificate is for",
                hello.agent_id
            ),
        ))
    } else {
        lock(&shared.claims)
            .claim(&hello.agent_id, &hello.host, conn.stable_id() as u64)
            .err()
            .map(|e| Refusal::new(e.label(), e.to_string()).for_now(IN_USE_RETRY))
    };
    if let Some(r) = &refusal {
        // Counted before the reply leaves, so whoever sees the refusal also
        // sees it in the stats.
        shared.refused(
            r.label,
            conn.remote_address(),
            &format!(
                "{} (host {:?}, agent {:?})",
                r.detail, hello.host, hello.agent_id
            ),
        );
    }
    reply(
        &mut send,
        refusal.is_none(),
        refusal
            .as_ref()
            .map(|r| r.detail.clone())
            .unwrap_or_default(),
        refusal.as_ref().map_or(0, |r| r.retry_after_ms),
    )
    .await;
    match refusal {
        Some(r) => {
            conn.close(1u32.into(), r.detail.as_bytes());
            Err(r)
        }
        None => Ok(hello),
    }
}
