//! `slowrank-trainer`: the simulated training job of one rank. Started by
//! `slowrank-scenario run` with torchrun's environment; not meant to be run
//! by hand.

fn main() {
    if std::env::args().any(|a| a == "--help" || a == "-h") {
        println!(
            "slowrank-trainer: one rank of a simulated training job.\n\
             Started by `slowrank-scenario run SPEC --out DIR`, which sets RANK, WORLD_SIZE,\n\
             LOCAL_RANK, ..., SLOWRANK_SPEC and LD_LIBRARY_PATH (the stand-in libraries)."
        );
        return;
    }
    if let Err(e) = slowrank_scenarios::trainer::main() {
        eprintln!("slowrank-trainer: {e}");
        std::process::exit(1);
    }
}
