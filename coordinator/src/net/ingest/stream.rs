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
    let deadline = tokio::time::Instant::now() + STREAM_READ_TIMEOUT;
    let mut head = [0u8; HEADER_LEN];
    let got = tokio::time::timeout_at(deadline, stream.read_exact(&mut head)).await;
    let declared = match got {
        Ok(Ok(())) => wire::peek_header(&head).map(|(_, n)| n),
        // Shorter than a header: decoding what came says how it is wrong.
        Ok(Err(quinn::ReadExactError::FinishedEarly(n))) => {
            wire::decode::<Batch>(&head[..n]).map(|_| 0)
        }
        Ok(Err(quinn::ReadExactError::ReadError(e))) => {
            stats.reject(agent_id, "stream_error");
            debug!(agent = %agent_id, "rejected batch: stream error: {e}");
            return StreamRead::Rejected;
        }
        Err(_) => return timed_out(agent_id, stats, stream, answer),
    };
    let declared = match declared {
        Ok(n) => n,
        Err(e) => {
            stats.reject(agent_id, e.class());
            warn!(agent = %agent_id, "rejected batch: {e}");
            reject(answer);
            return StreamRead::Rejected;
        }
    };
    // In stream order: wait for the stream before (or its end), take this
    // batch's share, let the next one go.
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
    let held = match held {
        Ok(Some(h)) => h,
        Ok(None) => return StreamRead::Rejected,
        Err(_) => return timed_out(agent_id, stats, stream, answer),
    };
    // No more than the header declared (and the budget was taken for).
    let rest = tokio::time::timeout_at(deadline, stream.read_to_end(declared)).await;
    let bytes = match rest {
        Ok(Ok(b)) => [&head[..], &b].concat(),
        Ok(Err(quinn::ReadToEndError::TooLong)) => {
            stats.reject(agent_id, "oversized");
            warn!(agent = %agent_id, "rejected batch: larger than the cap");
            reject(answer);
            return StreamRead::Rejected;
        }
        Ok(Err(e)) => {
            stats.reject(agent_id, "stream_error");
            debug!(agent = %agent_id, "rejected batch: stream error: {e}");
            return StreamRead::Rejected;
        }
        Err(_) => return timed_out(agent_id, stats, stream, answer),
    };
    match wire::decode::<Batch>(&bytes) {
        Ok(mut batch) => {
            if batch.agent_id != agent_id {
                stats.reject(agent_id, "agent_id_mismatch");
                warn!(agent = %agent_id, claimed = %batch.agent_id, "rejected batch: claims another agent");
                reject(answer);
                return StreamRead::Rejected;
            }
            // The connection's identity wins over what the batch says.
            batch.host = host.to_owned();
            stats.batches_ok.fetch_add(1, Ordering::Relaxed);
            stats
                .bytes_ok
                .fetch_add(bytes.len() as u64, Ordering::Relaxed);
            if let Some(mut a) = stats.agents.get_mut(agent_id) {
                a.batches += 1;
                a.last_seq = Some(batch.seq);
            }
            StreamRead::Batch(Box::new(batch), answer, held)
        }
        Err(e) => {
            stats.reject(agent_id, e.class());
            warn!(agent = %agent_id, "rejected batch: {e}");
            reject(answer);
            StreamRead::Rejected
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
    StreamRead::Rejected
}

pub(super) fn reject(mut answer: quinn::SendStream) {
    tokio::spawn(async move {
        let _ = answer.write_all(&[wire::BATCH_REJECTED]).await;
        let _ = answer.finish();
    });
}
