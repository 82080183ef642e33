//! Prometheus `/metrics` over plain HTTP: a bounded server on a small tokio
//! runtime of its own thread (so a scrape never competes with ingest for
//! the main runtime), each connection a task, not a thread.
//!
//! Anyone who can reach the port may connect, so every resource is capped:
//! connections at once ([`MAX_CONNECTIONS`], more are closed at once and
//! counted), request head size ([`MAX_HEAD_BYTES`]), time to send the
//! request ([`READ_TIMEOUT`]) and to take the answer ([`WRITE_TIMEOUT`]).
//! Requests are parsed by `httparse`; routes are dispatched in [`route`].

use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::Duration,
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::{oneshot, Semaphore},
};

/// Connections served at once. Prometheus scrapes with one; a few dozen
/// leave room for people and dashboards while a flood of idle connections
/// costs at most this many small tasks.
pub const MAX_CONNECTIONS: usize = 64;
/// Largest request head (request line and headers) read: a scrape sends a
/// few hundred bytes; more is refused with 431.
pub const MAX_HEAD_BYTES: usize = 8 * 1024;
/// The whole request head must arrive within this (slow-loris connections
/// are closed).
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// The answer must be taken within this.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("cannot listen for /metrics on {addr}: {message}")]
    Bind { addr: SocketAddr, message: String },
}

/// Renders the exposition text on each scrape.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// What the server counts about itself.
#[derive(Debug, Default)]
pub struct HttpStats {
    /// Connections closed unserved because [`MAX_CONNECTIONS`] were open.
    pub refused: AtomicU64,
    /// Requests dropped: too slow, too large or malformed.
    pub bad_requests: AtomicU64,
}

pub struct MetricsServer {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
    pub stats: Arc<HttpStats>,
}

/// One answer.
pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub body: String,
}

/// What the server answers: the exposition, and optionally the report
/// page at `/`.
#[derive(Clone)]
pub struct Routes {
    pub metrics: Render,
    pub page: Option<Render>,
}

/// The routes: `/metrics`, `/` (the report page, when there is one), else
/// 404.
pub fn route(path: &str, routes: &Routes) -> Response {
    match (path, &routes.page) {
        ("/metrics", _) => Response {
            status: 200,
            content_type: "text/plain; version=0.0.4; charset=utf-8",
            body: (routes.metrics)(),
        },
        ("/", Some(page)) => Response {
            status: 200,
            content_type: "text/html; charset=utf-8",
            body: page(),
        },
        _ => Response {
            status: 404,
            content_type: "text/plain; charset=utf-8",
            body: "slowrank: see /metrics\n".into(),
        },
    }
}

impl MetricsServer {
    pub fn start(addr: SocketAddr, render: Render) -> Result<Self, MetricsError> {
        Self::start_with(
            addr,
            Routes {
                metrics: render,
                page: None,
            },
            Arc::default(),
        )
    }

    /// Same, with the routes given and counting into `stats` (which the
    /// render may show).
    pub fn start_with(
        addr: SocketAddr,
        render: Routes,
        stats: Arc<HttpStats>,
    ) -> Result<Self, MetricsError> {
        let bind_err = |e: std::io::Error| MetricsError::Bind {
            addr,
            message: e.to_string(),
        };
        let listener = std::net::TcpListener::bind(addr).map_err(bind_err)?;
        listener.set_nonblocking(true).map_err(bind_err)?;
        let local = listener.local_addr().map_err(bind_err)?;
        let (stop_tx, stop_rx) = oneshot::channel();
        let st = stats.clone();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            // Renders run here, one at a time.
            .max_blocking_threads(1)
            .build()
            .map_err(bind_err)?;
        let thread = std::thread::Builder::new()
            .name("slowrank-metrics".into())
            .spawn(move || {
                rt.block_on(async move {
                    match TcpListener::from_std(listener) {
                        Ok(l) => serve(l, render, st, stop_rx).await,
                        Err(e) => tracing::warn!("/metrics listener: {e}"),
                    }
                });
            })
            .map_err(bind_err)?;
        Ok(Self {
            addr: local,
            stop: Some(stop_tx),
            thread: Some(thread),
            stats,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn serve(
    listener: TcpListener,
    render: Routes,
    stats: Arc<HttpStats>,
    mut stop: oneshot::Receiver<()>,
) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let conn = tokio::select! {
            c = listener.accept() => c,
            _ = &mut stop => return,
        };
        let Ok((conn, _)) = conn else {
            // Out of descriptors, say: wait a little instead of spinning.
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            stats.refused.fetch_add(1, Ordering::Relaxed);
            drop(conn);
            continue;
        };
        let (render, stats) = (render.clone(), stats.clone());
        tokio::spawn(async move {
            handle(conn, &render, &stats).await;
            drop(slot);
        });
    }
}

/// Reads the request head (bounded in size and time); `Err(status)` when
/// it is too large or malformed, `None` when the peer was too slow or left.
async fn read_head(conn: &mut TcpStream) -> Option<Result<String, u16>> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        let n = conn.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&buf) {
            Ok(httparse::Status::Complete(_)) => {
                let path = req.path.unwrap_or("/");
                return Some(Ok(path.split('?').next().unwrap_or("/").to_owned()));
            }
            Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD_BYTES => {}
            Ok(httparse::Status::Partial) | Err(httparse::Error::TooManyHeaders) => {
                return Some(Err(431))
            }
            Err(_) => return Some(Err(400)),
        }
    }
}

async fn handle(mut conn: TcpStream, render: &Routes, stats: &HttpStats) {
    let head = tokio::time::timeout(READ_TIMEOUT, read_head(&mut conn)).await;
    let resp = match head {
        Ok(Some(Ok(path))) => {
            let render = render.clone();
            match tokio::task::spawn_blocking(move || route(&path, &render)).await {
                Ok(r) => r,
                Err(_) => return,
            }
        }
        Ok(Some(Err(status))) => {
            stats.bad_requests.fetch_add(1, Ordering::Relaxed);
            Response {
                status,
                content_type: "text/plain; charset=utf-8",
                body: "bad request\n".into(),
            }
        }
        Ok(None) | Err(_) => {
            stats.bad_requests.fetch_add(1, Ordering::Relaxed);
            return;
        }
    };
    let reason = match resp.status {
        200 => "OK",
        404 => "Not Found",
        431 => "Request Header Fields Too Large",
        _ => "Bad Request",
    };
    let head = format!(
        "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        resp.status,
        resp.content_type,
        resp.body.len()
    );
    let _ = tokio::time::timeout(WRITE_TIMEOUT, async {
        conn.write_all(head.as_bytes()).await?;
        conn.write_all(resp.body.as_bytes()).await?;
        conn.shutdown().await
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn get(addr: SocketAddr, req: &[u8]) -> String {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(req).unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }

    #[test]
    fn serves_metrics_refuses_huge_heads_and_idle_floods_do_not_block_it() {
        let server = MetricsServer::start(
            "127.0.0.1:0".parse().unwrap(),
            Arc::new(|| "slowrank_up 1\n".to_owned()),
        )
        .unwrap();
        let addr = server.local_addr();
        let ok = get(addr, b"GET /metrics?x=1 HTTP/1.0\r\nHost: x\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
        assert!(ok.ends_with("slowrank_up 1\n"), "{ok}");
        assert!(get(addr, b"GET / HTTP/1.0\r\n\r\n").starts_with("HTTP/1.1 404"));
        let mut big = b"GET /metrics HTTP/1.0\r\nX: ".to_vec();
        big.extend(std::iter::repeat_n(b'a', 2 * MAX_HEAD_BYTES));
        big.extend_from_slice(b"\r\n\r\n");
        assert!(get(addr, &big).starts_with("HTTP/1.1 431"));
        // Idle connections past the cap: the extra ones are closed at once,
        // the rest time out; a scrape gets through afterwards.
        let idle: Vec<_> = (0..MAX_CONNECTIONS + 20)
            .map(|_| std::net::TcpStream::connect(addr).unwrap())
            .collect();
        let deadline = std::time::Instant::now() + READ_TIMEOUT * 3;
        while server.stats.refused.load(Ordering::Relaxed) < 20 {
            assert!(std::time::Instant::now() < deadline, "cap not applied");
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(READ_TIMEOUT + Duration::from_millis(500));
        let ok = get(addr, b"GET /metrics HTTP/1.0\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
        drop(idle);
    }
}
