//! A connection's batches, forwarded to the analyzer in the order the
//! agent opened their streams, and what happens after one is lost.

use super::*;

/// What to do with a connection's next batch, in opening order
/// ([`forward_in_order`]).
#[derive(Debug, Default)]
pub(super) struct OrderGate {
    /// A batch before this one was lost.
    gap: bool,
}

#[derive(Debug, PartialEq, Eq)]
pub(super) enum Forward {
    Ingest,
    /// Left unanswered (reset): it comes again after the lost one.
    Hold,
    Nothing,
}

impl OrderGate {
    /// Once a batch is lost, the ones after it on the same connection are
    /// not ingested: the agent resends from the lost one on, in order, and
    /// ingesting the later ones first put its records behind newer ones of
    /// the same ranks (612 rejected as going backwards in a CI run of the
    /// link-down test: a batch cut off on the dead connection, the next
    /// one read whole and ingested when that connection closed, then the
    /// first again on the new connection).
    pub(super) fn next(&mut self, read: &StreamReadKind) -> Forward {
        match read {
            StreamReadKind::Lost => {
                self.gap = true;
                Forward::Nothing
            }
            StreamReadKind::Rejected => Forward::Nothing,
            StreamReadKind::Batch if self.gap => Forward::Hold,
            StreamReadKind::Batch => Forward::Ingest,
        }
    }
}

/// [`StreamRead`] without its payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum StreamReadKind {
    Batch,
    Rejected,
    Lost,
}

/// Forwards the batches read to the analyzer in stream order, answering
/// each once ingested; returns why it stopped ("" when the streams ran out).
pub(super) async fn forward_in_order(
    mut order_rx: mpsc::Receiver<tokio::task::JoinHandle<StreamRead>>,
    events: mpsc::Sender<IngestEvent>,
    agent_id: String,
) -> String {
    let mut gate = OrderGate::default();
    while let Some(read) = order_rx.recv().await {
        let read = read.await.unwrap_or(StreamRead::Lost);
        let kind = match &read {
            StreamRead::Batch(..) => StreamReadKind::Batch,
            StreamRead::Rejected => StreamReadKind::Rejected,
            StreamRead::Lost => StreamReadKind::Lost,
        };
        let StreamRead::Batch(batch, mut answer, held) = read else {
            gate.next(&kind);
            continue;
        };
        match gate.next(&kind) {
            Forward::Ingest => {}
            Forward::Hold | Forward::Nothing => {
                let _ = answer.reset(3u32.into());
                drop(held);
                continue;
            }
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        // The channel's waiters are served in turn, so each
        // connection gets its share of the analyzer.
        if events
            .send(IngestEvent::Batch {
                agent_id: agent_id.clone(),
                batch,
                ack: Ack(Some(tx)),
            })
            .await
            .is_err()
        {
            return "coordinator shutting down".to_owned();
        }
        // Answer when ingested, without holding up the next batch.
        tokio::spawn(async move {
            let ingested = rx.await.is_ok();
            // Ingested (or dropped): its memory is free again.
            drop(held);
            if ingested {
                let _ = answer.write_all(&[wire::BATCH_INGESTED]).await;
                let _ = answer.finish();
            }
        });
    }
    String::new()
}
