//! The hub server: an accept thread plus one reader thread per connection.
//! Nothing blocks inside the hub: an exchange is answered by the thread of
//! whichever member arrives last, writing to every member's connection.

use std::{
    collections::HashMap,
    io::{BufRead, BufReader, Write},
    os::unix::net::{UnixListener, UnixStream},
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc::Sender,
        Arc, Mutex,
    },
    thread::JoinHandle,
};

use serde_json::Value;
use tracing::{debug, warn};

use super::{
    protocol::{Reply, Request},
    HubError,
};
use crate::{clock, report::Report};

type Conn = Arc<Mutex<UnixStream>>;

/// An exchange some but not all members have joined.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingExchange {
    pub key: String,
    pub n: u32,
    /// Members that arrived, ascending.
    pub arrived: Vec<u32>,
    /// Monotonic ns of the first arrival.
    pub since_ns: u64,
}

struct Pending {
    n: u32,
    since_ns: u64,
    members: Vec<(u32, Value, Conn, u64)>,
}

#[derive(Default)]
struct State {
    exchanges: HashMap<String, Pending>,
    store: HashMap<String, String>,
    waiting_gets: HashMap<String, Vec<(Conn, u64)>>,
    completed: u64,
}

struct Shared {
    state: Mutex<State>,
    reports: Mutex<Option<Sender<Report>>>,
    stop: AtomicBool,
}

/// A running hub; stops (and removes its socket) when dropped.
pub struct Hub {
    path: PathBuf,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

/// One reply as a protocol line (with its newline).
fn encode(reply: &Reply) -> Option<String> {
    match serde_json::to_string(reply) {
        Ok(mut l) => {
            l.push('\n');
            Some(l)
        }
        Err(e) => {
            warn!("cannot encode hub reply: {e}");
            None
        }
    }
}

fn write_line(conn: &Conn, line: &str) {
    let mut stream = conn.lock().unwrap_or_else(|p| p.into_inner());
    // A member that went away is not the others' problem.
    if let Err(e) = stream.write_all(line.as_bytes()) {
        debug!("hub reply dropped: {e}");
    }
}

fn write_reply(conn: &Conn, reply: &Reply) {
    if let Some(line) = encode(reply) {
        write_line(conn, &line);
    }
}

/// Which member of a completed exchange is answered first: from the
/// exchange's completion count and key, so that over many exchanges every
/// member is first (and last) about as often.
fn first_reply(seq: u64, key: &str, n: usize) -> usize {
    if n == 0 {
        return 0;
    }
    (crate::rng::hash(&[seq, crate::rng::fnv1a(key.as_bytes())]) % n as u64) as usize
}

fn refuse(conn: &Conn, id: u64, why: String) {
    write_reply(
        conn,
        &Reply {
            id,
            payloads: vec![],
            value: None,
            error: Some(why),
        },
    );
}

impl Shared {
    fn handle(&self, conn: &Conn, req: Request) {
        match req {
            Request::Exchange {
                id,
                key,
                n,
                idx,
                payload,
            } => self.exchange(conn, id, key, n, idx, payload),
            Request::Set { key, value } => {
                let waiters = {
                    let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
                    st.store.insert(key.clone(), value.clone());
                    st.waiting_gets.remove(&key).unwrap_or_default()
                };
                for (c, id) in waiters {
                    write_reply(
                        &c,
                        &Reply {
                            id,
                            payloads: vec![],
                            value: Some(value.clone()),
                            error: None,
                        },
                    );
                }
            }
            Request::Get { id, key } => {
                let value = {
                    let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
                    match st.store.get(&key) {
                        Some(v) => Some(v.clone()),
                        None => {
                            st.waiting_gets
                                .entry(key)
                                .or_default()
                                .push((conn.clone(), id));
                            None
                        }
                    }
                };
                if let Some(value) = value {
                    write_reply(
                        conn,
                        &Reply {
                            id,
                            payloads: vec![],
                            value: Some(value),
                            error: None,
                        },
                    );
                }
            }
            Request::Report { report } => {
                if let Some(tx) = self
                    .reports
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .as_ref()
                {
                    let _ = tx.send(report);
                }
            }
        }
    }

    fn exchange(&self, conn: &Conn, id: u64, key: String, n: u32, idx: u32, payload: Value) {
        if n == 0 || idx >= n {
            return refuse(conn, id, format!("exchange {key}: member {idx} of {n}"));
        }
        let done = {
            let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            let p = st.exchanges.entry(key.clone()).or_insert_with(|| Pending {
                n,
                since_ns: clock::mono_ns(),
                members: Vec::with_capacity(n as usize),
            });
            if p.n != n {
                let msg = format!("exchange {key}: {n} members, others said {}", p.n);
                drop(st);
                return refuse(conn, id, msg);
            }
            if p.members.iter().any(|m| m.0 == idx) {
                drop(st);
                return refuse(
                    conn,
                    id,
                    format!("exchange {key}: member {idx} joined twice"),
                );
            }
            p.members.push((idx, payload, conn.clone(), id));
            if p.members.len() == n as usize {
                st.completed += 1;
                st.exchanges.remove(&key).map(|p| (p, st.completed))
            } else {
                None
            }
        };
        if let Some((mut p, seq)) = done {
            p.members.sort_by_key(|m| m.0);
            let payloads: Vec<Value> = p.members.iter().map(|m| m.1.clone()).collect();
            // Every reply is encoded before the first is written, and the
            // writing starts at a different member each time: each write
            // wakes its member, who on a loaded machine can take the CPU from
            // this thread, so a fixed order made the last-indexed member of
            // every collective late by a wake-up per member before it (on 2
            // vCPUs beside a CPU hog rank 7 of a healthy dp8 job was ~7 ms
            // behind rank 0 every step, and named a straggler). A rotating
            // start spreads that over all members as noise.
            let lines: Vec<(Conn, Option<String>)> = p
                .members
                .iter()
                .map(|(_, _, c, id)| {
                    let reply = Reply {
                        id: *id,
                        payloads: payloads.clone(),
                        value: None,
                        error: None,
                    };
                    (c.clone(), encode(&reply))
                })
                .collect();
            let first = first_reply(seq, &key, lines.len());
            for (c, line) in lines[first..].iter().chain(&lines[..first]) {
                if let Some(line) = line {
                    write_line(c, line);
                }
            }
        }
    }
}

fn serve(shared: Arc<Shared>, stream: UnixStream) {
    let conn: Conn = match stream.try_clone() {
        Ok(s) => Arc::new(Mutex::new(s)),
        Err(e) => return warn!("hub connection: {e}"),
    };
    let reader = BufReader::new(stream);
    for line in reader.lines() {
        let Ok(line) = line else { break };
        match serde_json::from_str::<Request>(&line) {
            Ok(req) => shared.handle(&conn, req),
            Err(e) => warn!("bad hub request ({e}): {line}"),
        }
    }
}

impl Hub {
    /// Listens on `path` (replacing a stale socket); reports go to `reports`.
    pub fn start(path: &Path, reports: Option<Sender<Report>>) -> Result<Hub, HubError> {
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path).map_err(|source| HubError::Connect {
            path: path.display().to_string(),
            source,
        })?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            reports: Mutex::new(reports),
            stop: AtomicBool::new(false),
        });
        let s = shared.clone();
        let accept = std::thread::Builder::new()
            .name("hub-accept".into())
            .spawn(move || {
                for stream in listener.incoming() {
                    if s.stop.load(Ordering::Acquire) {
                        break;
                    }
                    match stream {
                        Ok(stream) => {
                            let s = s.clone();
                            let _ = std::thread::Builder::new()
                                .name("hub-conn".into())
                                .stack_size(256 * 1024)
                                .spawn(move || serve(s, stream));
                        }
                        Err(e) => warn!("hub accept: {e}"),
                    }
                }
            })?;
        Ok(Hub {
            path: path.to_path_buf(),
            shared,
            accept: Some(accept),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Exchanges still waiting for members, oldest first: what a hung
    /// collective looks like from the network's side.
    pub fn pending(&self) -> Vec<PendingExchange> {
        let st = self.shared.state.lock().unwrap_or_else(|p| p.into_inner());
        let mut out: Vec<PendingExchange> = st
            .exchanges
            .iter()
            .map(|(k, p)| {
                let mut arrived: Vec<u32> = p.members.iter().map(|m| m.0).collect();
                arrived.sort_unstable();
                PendingExchange {
                    key: k.clone(),
                    n: p.n,
                    arrived,
                    since_ns: p.since_ns,
                }
            })
            .collect();
        out.sort_by_key(|p| p.since_ns);
        out
    }

    /// Exchanges completed so far.
    pub fn completed(&self) -> u64 {
        self.shared
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .completed
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared
            .reports
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        // Wake the accept loop so it sees `stop`.
        let _ = UnixStream::connect(&self.path);
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hub::{ExchangeReq, HubClient};
    use serde_json::json;

    fn sock(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("slowrank-hub-{name}-{}.sock", std::process::id()))
    }

    #[test]
    fn no_member_is_always_answered_last() {
        // The member answered last of 8 over 800 collectives of one
        // communicator: each should be last about 100 times, none never.
        let mut last = [0u32; 8];
        for seq in 1..=800u64 {
            let first = first_reply(seq, "comm-7/allreduce", 8);
            last[(first + 7) % 8] += 1;
        }
        for (m, n) in last.iter().enumerate() {
            assert!(
                (50..=150).contains(n),
                "member {m} last {n} times of 800: {last:?}"
            );
        }
    }

    #[test]
    fn exchange_returns_all_payloads_in_member_order() {
        let path = sock("x");
        let hub = Hub::start(&path, None).unwrap();
        let handles: Vec<_> = (0..4u32)
            .map(|i| {
                let path = path.clone();
                std::thread::spawn(move || {
                    let mut c = HubClient::connect(&path).unwrap();
                    c.exchange("k", 4, 3 - i, json!(3 - i)).unwrap()
                })
            })
            .collect();
        for h in handles {
            assert_eq!(
                h.join().unwrap(),
                vec![json!(0), json!(1), json!(2), json!(3)]
            );
        }
        assert_eq!(hub.completed(), 1);
        assert!(hub.pending().is_empty());
    }

    #[test]
    fn incomplete_exchange_is_pending_and_duplicates_are_refused() {
        let path = sock("p");
        let hub = Hub::start(&path, None).unwrap();
        let p2 = path.clone();
        // Member 0 of 2 waits forever on its own thread.
        std::thread::spawn(move || {
            let mut c = HubClient::connect(&p2).unwrap();
            let _ = c.exchange("hang", 2, 0, json!(null));
        });
        let mut c = HubClient::connect(&path).unwrap();
        // A store round trip orders us after the other thread's request
        // only probabilistically, so poll the pending list.
        let mut seen = vec![];
        for _ in 0..200 {
            seen = hub.pending();
            if !seen.is_empty() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].key, "hang");
        assert_eq!(seen[0].arrived, vec![0]);
        let err = c.exchange("hang", 2, 0, json!(null)).unwrap_err();
        assert!(err.to_string().contains("twice"), "{err}");
        let err = c.exchange("hang", 3, 1, json!(null)).unwrap_err();
        assert!(err.to_string().contains("members"), "{err}");
    }

    #[test]
    fn store_get_waits_for_set_and_group_exchanges_complete_together() {
        let path = sock("s");
        let _hub = Hub::start(&path, None).unwrap();
        let p2 = path.clone();
        let getter =
            std::thread::spawn(move || HubClient::connect(&p2).unwrap().get("id").unwrap());
        std::thread::sleep(std::time::Duration::from_millis(20));
        HubClient::connect(&path).unwrap().set("id", "abc").unwrap();
        assert_eq!(getter.join().unwrap(), "abc");

        // Two ranks each send and receive in one group: both exchanges must
        // complete even though each rank joins them in a different order.
        let mk = |key: &str, idx| ExchangeReq {
            key: key.into(),
            n: 2,
            idx,
            payload: json!(idx),
        };
        let p3 = path.clone();
        let a = std::thread::spawn(move || {
            HubClient::connect(&p3)
                .unwrap()
                .exchange_many(&[mk("0->1", 0), mk("1->0", 1)])
                .unwrap()
        });
        let b = HubClient::connect(&path)
            .unwrap()
            .exchange_many(&[mk("1->0", 0), mk("0->1", 1)])
            .unwrap();
        assert_eq!(b.len(), 2);
        assert_eq!(a.join().unwrap()[0], vec![json!(0), json!(1)]);
    }
}
