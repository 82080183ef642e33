//! Reading one batch off a QUIC stream: its size is capped before a byte is
//! buffered, and a stream that stalls past its deadline is dropped.

use super::*;

/// Reads and checks one batch stream within [`STREAM_READ_TIMEOUT`].
pub(super) async fn read_batch(
    answer: quinn::SendStream,
    mut stream: quinn::RecvStream,
    agent_id: &str,
    host: &str,
    stats: &IngestStats,
    budget: (Arc<Semaphore>, Arc<Semaphore>),
    order: Turn,
) -> StreamRead {
    match read_checked(&mut stream, agent_id, host, stats, budget, order).await {
        Ok((batch, held)) => StreamRead::Batch(Box::new(batch), answer, held),
        Err(Refused::Told) => {
            reject(answer);
            StreamRead::Rejected
        }
        Err(Refused::Quietly) => StreamRead::Lost,
        Err(Refused::TimedOut) => timed_out(agent_id, stats, stream, answer),
    }
}

/// Why a stream gave no batch, and what its agent hears of it.
enum Refused {
    /// Counted and logged; the answer says [`wire::BATCH_REJECTED`].
    Told,
    /// Nothing more to say: a broken stream (counted and logged) or a
    /// budget that closed.
    Quietly,
    /// Past the deadline: [`timed_out`] counts it and resets both ways.
    TimedOut,
}

/// The header, the budget in stream order, the rest and the decode, all
/// within one deadline; the batch with the budget it holds.
async fn read_checked(
    stream: &mut quinn::RecvStream,
    agent_id: &str,
    host: &str,
    stats: &IngestStats,
    budget: (Arc<Semaphore>, Arc<Semaphore>),
    order: Turn,
) -> Result<(Batch, Held), Refused> {
    let deadline = tokio::time::Instant::now() + STREAM_READ_TIMEOUT;
    let mut head = [0u8; HEADER_LEN];
    let declared = read_header(stream, &mut head, deadline, agent_id, stats).await?;
    let held = take_budget(declared, budget, order, deadline).await?;
    // No more than the header declared (and the budget was taken for).
    let rest = tokio::time::timeout_at(deadline, stream.read_to_end(declared)).await;
    let bytes = match rest {
        Ok(Ok(b)) => [&head[..], &b].concat(),
        Ok(Err(quinn::ReadToEndError::TooLong)) => {
            stats.reject(agent_id, "oversized");
            warn!(agent = %agent_id, "rejected batch: larger than the cap");
            return Err(Refused::Told);
        }
        Ok(Err(e)) => {
            stats.reject(agent_id, "stream_error");
            debug!(agent = %agent_id, "rejected batch: stream error: {e}");
            return Err(Refused::Quietly);
        }
        Err(_) => return Err(Refused::TimedOut),
    };
    let batch = decode_batch(&bytes, agent_id, host, stats)?;
    Ok((batch, held))
}

/// Reads the header into `head`; the archive bytes it declares.
async fn read_header(
    stream: &mut quinn::RecvStream,
    head: &mut [u8; HEADER_LEN],
    deadline: tokio::time::Instant,
    agent_id: &str,
    stats: &IngestStats,
) -> Result<usize, Refused> {
    let got = tokio::time::timeout_at(deadline, stream.read_exact(head)).await;
    let declared = match got {
        Ok(Ok(())) => wire::peek_header(head).map(|(_, n)| n),
        // Shorter than a header: decoding what came says how it is wrong.
        Ok(Err(quinn::ReadExactError::FinishedEarly(n))) => {
            wire::decode::<Batch>(&head[..n]).map(|_| 0)
        }
        Ok(Err(quinn::ReadExactError::ReadError(e))) => {
            stats.reject(agent_id, "stream_error");
            debug!(agent = %agent_id, "rejected batch: stream error: {e}");
            return Err(Refused::Quietly);
        }
        Err(_) => return Err(Refused::TimedOut),
    };
    declared.map_err(|e| {
        stats.reject(agent_id, e.class());
        warn!(agent = %agent_id, "rejected batch: {e}");
        Refused::Told
    })
}

/// In stream order: waits for the stream before (or its end), takes this
/// batch's share of the connection's and the global budget, lets the next
/// one go.
async fn take_budget(
    declared: usize,
    budget: (Arc<Semaphore>, Arc<Semaphore>),
    order: Turn,
    deadline: tokio::time::Instant,
) -> Result<Held, Refused> {
    let _ = order.turn.await;
    let kib = batch_kib(declared);
    let (conn_budget, global) = budget;
    let held = tokio::time::timeout_at(deadline, async {
        let c = conn_budget.acquire_many_owned(kib).await.ok()?;
        let g = global.acquire_many_owned(kib).await.ok()?;
        Some((c, g))
    })
    .await;
    let _ = order.next.send(());
    match held {
        Ok(Some(h)) => Ok(h),
        Ok(None) => Err(Refused::Quietly),
        Err(_) => Err(Refused::TimedOut),
    }
}

/// Decodes the batch and checks it is the connection's agent's; counts it.
/// The connection's identity wins over the host the batch says.
fn decode_batch(
    bytes: &[u8],
    agent_id: &str,
    host: &str,
    stats: &IngestStats,
) -> Result<Batch, Refused> {
    match wire::decode::<Batch>(bytes) {
        Ok(mut batch) => {
            if batch.agent_id != agent_id {
                stats.reject(agent_id, "agent_id_mismatch");
                warn!(agent = %agent_id, claimed = %batch.agent_id, "rejected batch: claims another agent");
                return Err(Refused::Told);
            }
            batch.host = host.to_owned();
            stats.batches_ok.fetch_add(1, Ordering::Relaxed);
            stats
                .bytes_ok
                .fetch_add(bytes.len() as u64, Ordering::Relaxed);
            if let Some(mut a) = stats.agents.get_mut(agent_id) {
                a.batches += 1;
                a.last_seq = Some(batch.seq);
            }
            Ok(batch)
        }
        Err(e) => {
            stats.reject(agent_id, e.class());
            warn!(agent = %agent_id, "rejected batch: {e}");
            Err(Refused::Told)
        }
    }
}

/// A stream not finished within [`STREAM_READ_TIMEOUT`]: dropped, counted.
pub(super) fn timed_out(
    agent_id: &str,
    stats: &IngestStats,
    mut stream: quinn::RecvStream,
    answer: quinn::SendStream,
) -> StreamRead {
    stats.reject(agent_id, "stream_timeout");
    warn!(agent = %agent_id, "rejected batch: not finished within {STREAM_READ_TIMEOUT:?}");
    let _ = stream.stop(2u32.into());
    let mut answer = answer;
    let _ = answer.reset(2u32.into());
    StreamRead::Lost
}

pub(super) fn reject(mut answer: quinn::SendStream) {
    tokio::spawn(async move {
        let _ = answer.write_all(&[wire::BATCH_REJECTED]).await;
        let _ = answer.finish();
    });
}
