//! Blocking hub client. One connection per thread: a stream executor blocked
//! in a collective must not hold up another stream's collective.

use std::{
    cell::RefCell,
    collections::HashMap,
    io::{BufRead, BufReader, Write},
    os::unix::net::UnixStream,
    path::Path,
};

use serde_json::Value;

use super::{
    protocol::{Reply, Request},
    HubError,
};
use crate::report::Report;

/// One exchange to join.
#[derive(Debug, Clone)]
pub struct ExchangeReq {
    pub key: String,
    pub n: u32,
    pub idx: u32,
    pub payload: Value,
}

/// A connection to the hub.
pub struct HubClient {
    writer: UnixStream,
    reader: BufReader<UnixStream>,
    next_id: u64,
}

impl HubClient {
    pub fn connect(path: &Path) -> Result<Self, HubError> {
        let stream = UnixStream::connect(path).map_err(|source| HubError::Connect {
            path: path.display().to_string(),
            source,
        })?;
        Ok(Self {
            reader: BufReader::new(stream.try_clone()?),
            writer: stream,
            next_id: 1,
        })
    }

    /// Connects to the hub named by [`crate::env::HUB`].
    pub fn from_env() -> Result<Self, HubError> {
        let path = std::env::var_os(crate::env::HUB).ok_or(HubError::NoEnv(crate::env::HUB))?;
        Self::connect(Path::new(&path))
    }

    fn send(&mut self, req: &Request) -> Result<(), HubError> {
        let mut line = serde_json::to_string(req).map_err(|e| HubError::Protocol(e.to_string()))?;
        line.push('\n');
        self.writer.write_all(line.as_bytes())?;
        Ok(())
    }

    fn recv(&mut self) -> Result<Reply, HubError> {
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err(HubError::Closed);
        }
        let reply: Reply =
            serde_json::from_str(&line).map_err(|e| HubError::Protocol(e.to_string()))?;
        match reply.error {
            Some(e) => Err(HubError::Refused(e)),
            None => Ok(reply),
        }
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Joins one exchange and waits for everyone's payloads.
    pub fn exchange(
        &mut self,
        key: &str,
        n: u32,
        idx: u32,
        payload: Value,
    ) -> Result<Vec<Value>, HubError> {
        let mut out = self.exchange_many(&[ExchangeReq {
            key: key.to_string(),
            n,
            idx,
            payload,
        }])?;
        Ok(out.remove(0))
    }

    /// Joins several exchanges at once (a `ncclGroupStart/End` of send+recv)
    /// and waits for all of them; results are in request order.
    pub fn exchange_many(&mut self, reqs: &[ExchangeReq]) -> Result<Vec<Vec<Value>>, HubError> {
        let mut slot_of = HashMap::new();
        for (i, r) in reqs.iter().enumerate() {
            let id = self.id();
            slot_of.insert(id, i);
            self.send(&Request::Exchange {
                id,
                key: r.key.clone(),
                n: r.n,
                idx: r.idx,
                payload: r.payload.clone(),
            })?;
        }
        let mut out: Vec<Option<Vec<Value>>> = vec![None; reqs.len()];
        for _ in 0..reqs.len() {
            let reply = self.recv()?;
            let slot = slot_of
                .get(&reply.id)
                .ok_or_else(|| HubError::Protocol(format!("unexpected reply id {}", reply.id)))?;
            out[*slot] = Some(reply.payloads);
        }
        Ok(out.into_iter().map(|o| o.unwrap_or_default()).collect())
    }

    pub fn set(&mut self, key: &str, value: &str) -> Result<(), HubError> {
        self.send(&Request::Set {
            key: key.into(),
            value: value.into(),
        })
    }

    /// Waits until `key` is set and returns its value.
    pub fn get(&mut self, key: &str) -> Result<String, HubError> {
        let id = self.id();
        self.send(&Request::Get {
            id,
            key: key.into(),
        })?;
        let reply = self.recv()?;
        reply
            .value
            .ok_or_else(|| HubError::Protocol("get reply without a value".into()))
    }

    pub fn report(&mut self, report: Report) -> Result<(), HubError> {
        self.send(&Request::Report { report })
    }
}

thread_local! {
    static LOCAL: RefCell<Option<HubClient>> = const { RefCell::new(None) };
}

/// Runs `f` with this thread's own connection to the hub from the
/// environment, opening it on first use.
pub fn with_local<T>(f: impl FnOnce(&mut HubClient) -> Result<T, HubError>) -> Result<T, HubError> {
    LOCAL.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(HubClient::from_env()?);
        }
        let client = slot.as_mut().expect("just set");
        let out = f(client);
        if out.is_err() {
            // A broken connection is not reused.
            *slot = None;
        }
        out
    })
}
