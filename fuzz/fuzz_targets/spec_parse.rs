//! Arbitrary text as a scenario spec: parsing and validation must answer
//! with an error naming the problem, never panic (overflowing arithmetic
//! included); an accepted spec must survive a TOML round trip.
#![no_main]

use libfuzzer_sys::fuzz_target;
use slowrank_scenarios::spec::Spec;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(spec) = Spec::parse(text) else {
        return;
    };
    let _ = spec.layout();
    let _ = spec.sim_model();
    for f in &spec.faults {
        let _ = f.targets();
        let _ = f.slowdown();
        let _ = f.network();
        let _ = f.host_function();
        for it in [
            0,
            f.start_iteration,
            f.start_iteration.saturating_add(1),
            u64::MAX,
        ] {
            let _ = f.active_at(it);
        }
    }
    for h in 0..spec.hosts {
        let _ = spec.clock.offset_us(h);
        let _ = spec.clock.drift_ppm(h);
    }
    if let Ok(again) = toml::to_string(&spec) {
        let back = Spec::parse(&again)
            .unwrap_or_else(|e| panic!("accepted spec fails to re-parse: {e}\n{again}"));
        assert_eq!(back.world_size(), spec.world_size());
    }
});
