//! Prometheus `/metrics` over plain HTTP (tiny_http on its own thread, so a
//! scrape never competes with ingest for the async runtime).

use std::{net::SocketAddr, sync::Arc, thread::JoinHandle};

#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("cannot listen for /metrics on {addr}: {message}")]
    Bind { addr: SocketAddr, message: String },
}

/// Renders the exposition text on each scrape.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

pub struct MetricsServer {
    server: Arc<tiny_http::Server>,
    thread: Option<JoinHandle<()>>,
    addr: SocketAddr,
}

impl MetricsServer {
    pub fn start(addr: SocketAddr, render: Render) -> Result<Self, MetricsError> {
        Self::start_with_page(addr, render, None)
    }

    /// Also serves `page` (the HTML report) at `/`.
    pub fn start_with_page(
        addr: SocketAddr,
        render: Render,
        page: Option<Render>,
    ) -> Result<Self, MetricsError> {
        let server = tiny_http::Server::http(addr).map_err(|e| MetricsError::Bind {
            addr,
            message: e.to_string(),
        })?;
        let addr = server.server_addr().to_ip().unwrap_or(addr);
        let server = Arc::new(server);
        let s = server.clone();
        let thread = std::thread::Builder::new()
            .name("slowrank-metrics".into())
            .spawn(move || {
                for req in s.incoming_requests() {
                    let path = req.url().split('?').next().unwrap_or("");
                    let resp = if path == "/metrics" {
                        let header = tiny_http::Header::from_bytes(
                            &b"Content-Type"[..],
                            &b"text/plain; version=0.0.4; charset=utf-8"[..],
                        )
                        .expect("static header");
                        tiny_http::Response::from_string(render()).with_header(header)
                    } else if let (true, Some(page)) = (path == "/", &page) {
                        let header = tiny_http::Header::from_bytes(
                            &b"Content-Type"[..],
                            &b"text/html; charset=utf-8"[..],
                        )
                        .expect("static header");
                        tiny_http::Response::from_string(page()).with_header(header)
                    } else {
                        tiny_http::Response::from_string("slowrank: see /metrics\n")
                            .with_status_code(404)
                    };
                    if let Err(e) = req.respond(resp) {
                        tracing::debug!("metrics scrape: {e}");
                    }
                }
            })
            .ok();
        Ok(Self {
            server,
            thread,
            addr,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
