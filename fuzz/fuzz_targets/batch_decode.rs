//! Arbitrary bytes as a message from an agent: header parsing and bytecheck
//! validation must reject garbage with a reason, never panic or read out of
//! bounds; whatever decodes must encode back to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use slowrank_shared::wire::{self, Batch, Hello, HelloReply};

fuzz_target!(|data: &[u8]| {
    if let Ok((_kind, body)) = wire::split_header(data) {
        assert_eq!(body.len(), data.len() - wire::HEADER_LEN);
    }
    if let Ok(b) = wire::decode::<Batch>(data) {
        let again = wire::encode(&b).expect("a decoded batch encodes");
        assert_eq!(wire::decode::<Batch>(&again).expect("re-decodes"), b);
    }
    let _ = wire::decode::<Hello>(data);
    let _ = wire::decode::<HelloReply>(data);
});
