//! What the network side hands the runtime: an agent came or went, a batch
//! (with the answer its agent waits for), a clock sample. Plain data at the
//! bottom of the net layer, so the QUIC ingest, the control stream and the
//! clock port all speak it without speaking to each other.

use slowrank_shared::wire::Batch;

use crate::clock::ClockSample;

/// The pending answer to the agent for one batch.
#[derive(Debug, Default)]
pub struct Ack(pub(crate) Option<tokio::sync::oneshot::Sender<()>>);

impl Ack {
    /// An answer nobody waits for (batches fed in-process).
    pub fn none() -> Self {
        Self(None)
    }

    /// The batch is ingested: tell the agent it may drop it.
    pub fn done(mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}

/// What the ingest path hands to the rest of the coordinator.
#[derive(Debug)]
pub enum IngestEvent {
    AgentUp {
        agent_id: String,
        host: String,
        /// The agent's monotonic clock when it connected (its hello): its
        /// batches cut before this were spooled while it was away.
        connected_mono_ns: u64,
    },
    Batch {
        agent_id: String,
        batch: Box<Batch>,
        /// Answer the agent once the batch is ingested ([`Ack::done`]);
        /// dropped unanswered, the agent keeps it spooled and resends it.
        ack: Ack,
    },
    /// One answered clock probe of `host`'s agent.
    Clock {
        agent_id: String,
        host: String,
        sample: ClockSample,
    },
    AgentDown {
        agent_id: String,
        reason: String,
    },
}
