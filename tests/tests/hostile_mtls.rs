//! Issue 27, identity under mutual TLS: with per-host agent certificates
//! (`slowrank certs --hosts`), an agent is the host its certificate names.
//! An agent holding node-1's certificate that claims node-0 — whether
//! node-0's own agent is away (under a token it would then own node-0) or
//! connected — or that takes an agent id of node-0's, is refused with a
//! reason naming its certificate's host, logged and counted; node-0 and
//! node-1 with their own certificates get in and are reported under the
//! names their certificates give.

mod hostile;

use hostile::*;
use slowrank_shared::wire;

fn refused(r: &serde_json::Value, reason: &str) -> u64 {
    r["ingest"]["agents_refused_by"][reason]
        .as_u64()
        .unwrap_or(0)
}

/// Connects with `cert_host`'s certificate and says hello as `host`,
/// `agent_id`: the connection and whether it was accepted (and why not).
async fn hello_as(
    coord: &Coord,
    cert_host: &str,
    host: &str,
    agent_id: &str,
) -> (quinn::Endpoint, quinn::Connection, wire::HelloReply) {
    let (ep, conn) = raw_connect_with(coord, "127.0.0.1", coord.client_as(cert_host))
        .await
        .unwrap_or_else(|e| panic!("{cert_host}'s certificate is the job's: {e}"));
    // The certificate is the credential: no token.
    let reply = raw_hello(&conn, &hello(host, agent_id, ""))
        .await
        .expect("a reply to the hello");
    (ep, conn, reply)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_is_the_host_its_certificate_names() {
    for rep in 0..repetitions() {
        let coord = Coord::start_mtls("mtls", &["node-0", "node-1"]);

        // node-1's certificate claiming node-0 while node-0 is away.
        let (_e, c, r) = hello_as(&coord, "node-1", "node-0", "node-0-1-1").await;
        assert!(!r.accepted, "node-1's certificate let in as node-0");
        assert!(
            r.reason.contains("certificate is for \"node-1\""),
            "{}",
            r.reason
        );
        let b = batch("node-0", "node-0-1-1", 1, vec![identity(0, 2, 0)]);
        assert!(
            raw_send(&c, &b).await.is_err(),
            "a refused connection still took a batch"
        );

        // node-1's certificate as node-1, with an agent id of node-0's.
        let (_e, _c, r) = hello_as(&coord, "node-1", "node-1", "node-0-1-1").await;
        assert!(!r.accepted, "node-1 took an agent id of node-0's");
        assert!(r.reason.contains("agent id"), "{}", r.reason);

        // node-0 with its own certificate: in, and its batch ingested.
        let (_e0, c0, r) = hello_as(&coord, "node-0", "node-0", "node-0-7-7").await;
        assert!(r.accepted, "node-0 refused: {}", r.reason);
        let b = batch("node-0", "node-0-7-7", 1, vec![identity(0, 2, 0)]);
        assert_eq!(raw_send(&c0, &b).await, Ok(wire::BATCH_INGESTED));

        // The impostor again, now that node-0 is connected: refused for its
        // certificate, before any question of who holds node-0.
        let (_e, _c, r) = hello_as(&coord, "node-1", "node-0", "node-0-9-9").await;
        assert!(!r.accepted, "node-1's certificate let in as node-0");
        assert!(
            r.reason.contains("certificate is for \"node-1\""),
            "{}",
            r.reason
        );

        // node-1 as itself is in.
        let (_e1, c1, r) = hello_as(&coord, "node-1", "node-1", "node-1-3-3").await;
        assert!(r.accepted, "node-1 refused: {}", r.reason);
        let b = batch("node-1", "node-1-3-3", 1, vec![identity(1, 2, 0)]);
        assert_eq!(raw_send(&c1, &b).await, Ok(wire::BATCH_INGESTED));

        // Counted in the report and in /metrics, and logged.
        let r = coord.wait_report("the refusals and both agents", |r| {
            refused(r, "host_not_in_certificate") == 2
                && refused(r, "agent_id_not_in_certificate") == 1
                && r["job"]["ranks_seen"] == 2
        });
        assert_eq!(r["ingest"]["agents_refused"], 3, "{:#}", r["ingest"]);
        let hosts: Vec<(&str, &str)> = r["agents"]
            .as_array()
            .expect("agents")
            .iter()
            .map(|a| (a["agent_id"].as_str().unwrap(), a["host"].as_str().unwrap()))
            .collect();
        assert_eq!(
            hosts.len(),
            2,
            "only the two accepted agents are known: {hosts:?}"
        );
        assert!(hosts.contains(&("node-0-7-7", "node-0")), "{hosts:?}");
        assert!(hosts.contains(&("node-1-3-3", "node-1")), "{hosts:?}");
        let m = coord.scrape();
        assert_eq!(
            metric(
                &m,
                "slowrank_connections_refused_total{reason=\"host_not_in_certificate\"}"
            ),
            2,
            "{m}"
        );
        let log = std::fs::read_to_string(coord.dir.join("coordinator.log")).unwrap();
        assert!(
            log.lines().any(|l| l.contains("refused connection")
                && l.contains("host_not_in_certificate")
                && l.contains("node-1")),
            "the refusal is not in the log:\n{log}"
        );
        eprintln!("repetition {rep}: held");
    }
}
