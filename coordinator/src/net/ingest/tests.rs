use super::handshake::{agent_id_of_host, token_matches};

#[test]
fn agent_ids_belong_to_the_host_they_start_with() {
    assert!(agent_id_of_host("node-1-4242-99", "node-1"));
    assert!(agent_id_of_host("node-1", "node-1"));
    assert!(!agent_id_of_host("node-0-4242-99", "node-1"));
    assert!(!agent_id_of_host("node-10-4242-99", "node-1"));
    assert!(!agent_id_of_host("agent-0", "node-1"));
}

#[test]
fn token_comparison() {
    assert!(token_matches("abc", "abc"));
    assert!(!token_matches("abd", "abc"));
    assert!(!token_matches("ab", "abc"));
    assert!(!token_matches("abcd", "abc"));
    assert!(!token_matches("", "abc"));
}

#[test]
fn batches_after_a_lost_one_wait_for_it_to_come_again() {
    use super::{Forward, OrderGate, StreamReadKind};
    let mut g = OrderGate::default();
    assert_eq!(g.next(&StreamReadKind::Batch), Forward::Ingest);
    // Rejected for good: the agent does not resend it; the next goes in.
    assert_eq!(g.next(&StreamReadKind::Rejected), Forward::Nothing);
    assert_eq!(g.next(&StreamReadKind::Batch), Forward::Ingest);
    // Lost (cut off, unanswered): nothing after it on this connection.
    assert_eq!(g.next(&StreamReadKind::Lost), Forward::Nothing);
    assert_eq!(g.next(&StreamReadKind::Batch), Forward::Hold);
    assert_eq!(g.next(&StreamReadKind::Batch), Forward::Hold);
}
