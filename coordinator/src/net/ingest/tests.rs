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
