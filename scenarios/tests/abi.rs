//! The stand-ins look like the real libraries from outside: file names,
//! sonames, exported symbols (weak NCCL aliases, versioned CUDA and verbs
//! symbols, no exported provider data path) and the verbs struct layout of
//! the installed `infiniband/verbs.h`.

use std::{path::Path, process::Command};

use slowrank_scenarios::{
    libs::{prepare, LibDir},
    scratch::ScratchDir,
};

/// The laid-out stand-ins, and the directory that holds them while in use.
fn libs(name: &str) -> (LibDir, ScratchDir) {
    let dir = ScratchDir::new(&format!("abi-{name}")).expect("scratch dir");
    (prepare(&dir).expect("stand-ins are built"), dir)
}

fn tool(cmd: &str, args: &[&str], file: &Path) -> String {
    let out = Command::new(cmd)
        .args(args)
        .arg(file)
        .output()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(out.status.success(), "{cmd} {args:?} {}", file.display());
    String::from_utf8(out.stdout).expect("utf-8")
}

/// (bind, name@version, value) of every defined dynamic symbol.
fn dynsyms(file: &Path) -> Vec<(String, String, String)> {
    tool("readelf", &["--dyn-syms", "-W"], file)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 8 && f[6] != "UND" && f[3] == "FUNC")
                .then(|| (f[4].to_string(), f[7].to_string(), f[1].to_string()))
        })
        .collect()
}

fn soname(file: &Path) -> String {
    let d = tool("readelf", &["-d"], file);
    let line = d
        .lines()
        .find(|l| l.contains("(SONAME)"))
        .expect("has a soname");
    line.split('[')
        .nth(1)
        .unwrap()
        .trim_end_matches(']')
        .to_string()
}

#[test]
fn files_and_sonames_are_the_real_ones() {
    let (l, _dir) = libs("soname");
    for (path, name) in [
        (&l.nccl, "libnccl.so.2"),
        (&l.cudart, "libcudart.so.12"),
        (&l.verbs, "libibverbs.so.1"),
        (&l.provider, "libmlx5.so.1"),
    ] {
        assert_eq!(path.file_name().unwrap(), name);
        assert_eq!(soname(path), name);
    }
}

#[test]
fn nccl_exports_weak_aliases_of_pnccl() {
    let (l, _dir) = libs("nccl");
    let syms = dynsyms(&l.nccl);
    for name in [
        "ncclGetVersion",
        "ncclGetUniqueId",
        "ncclCommInitRank",
        "ncclCommInitRankConfig",
        "ncclCommSplit",
        "ncclCommDestroy",
        "ncclCommAbort",
        "ncclAllReduce",
        "ncclAllGather",
        "ncclReduceScatter",
        "ncclBroadcast",
        "ncclReduce",
        "ncclSend",
        "ncclRecv",
        "ncclGroupStart",
        "ncclGroupEnd",
    ] {
        let weak = syms
            .iter()
            .find(|s| s.1 == name)
            .unwrap_or_else(|| panic!("{name} missing"));
        let strong = syms
            .iter()
            .find(|s| s.1 == format!("p{name}"))
            .unwrap_or_else(|| panic!("p{name} missing"));
        assert_eq!(weak.0, "WEAK", "{name}");
        assert_eq!(strong.0, "GLOBAL", "p{name}");
        assert_eq!(weak.2, strong.2, "{name} is not an alias of p{name}");
    }
}

#[test]
fn cudart_symbols_carry_the_library_version() {
    let (l, _dir) = libs("cudart");
    let syms = dynsyms(&l.cudart);
    for name in [
        "cudaLaunchKernel",
        "cudaLaunchKernelExC",
        "cudaStreamSynchronize",
        "cudaEventRecord",
        "cudaEventSynchronize",
        "cudaDeviceSynchronize",
        "cudaMemcpyAsync",
        "cudaMalloc",
        "cudaFree",
        "cudaGraphLaunch",
        "cudaLaunchHostFunc",
    ] {
        let want = format!("{name}@@libcudart.so.12");
        assert!(
            syms.iter().any(|s| s.1 == want && s.0 == "GLOBAL"),
            "{want} missing"
        );
    }
    // Nothing unversioned leaks out.
    assert!(syms.iter().all(|s| s.1.contains("@@")), "{syms:?}");
}

#[test]
fn verbs_data_path_is_only_reachable_through_the_ops_table() {
    let (l, _dir) = libs("verbs");
    let verbs = dynsyms(&l.verbs);
    for name in [
        "ibv_get_device_list",
        "ibv_open_device",
        "ibv_alloc_pd",
        "ibv_create_cq",
        "ibv_create_qp",
        "ibv_modify_qp",
        "ibv_reg_mr",
    ] {
        let want = format!("{name}@@IBVERBS_1.1");
        assert!(verbs.iter().any(|s| s.1 == want), "{want} missing");
    }
    for lib in [&l.verbs, &l.provider] {
        let syms = dynsyms(lib);
        assert!(
            !syms
                .iter()
                .any(|s| s.1.contains("post_send") || s.1.contains("poll_cq")),
            "{} exports a data-path symbol: {syms:?}",
            lib.display()
        );
    }
    let provider = dynsyms(&l.provider);
    assert_eq!(provider.len(), 1, "{provider:?}");
    assert_eq!(provider[0].1, "mlx5dv_is_supported@@MLX5_1.8");
}

#[test]
fn verbs_structs_match_the_installed_header() {
    use slowrank_scenarios::sim::abi::verbs::OFFSETS;
    let header = Path::new("/usr/include/infiniband/verbs.h");
    assert!(header.exists(), "libibverbs-dev is not installed");
    let dir = ScratchDir::new("abi-c").expect("scratch dir");
    let mut c = String::from("#include <stdio.h>\n#include <stddef.h>\n#include <infiniband/verbs.h>\nint main(void) {\n");
    for (expr, _) in OFFSETS {
        c.push_str(&format!("  printf(\"%zu\\n\", (size_t)({expr}));\n"));
    }
    c.push_str("  return 0;\n}\n");
    let src = dir.join("offsets.c");
    let exe = dir.join("offsets");
    std::fs::write(&src, c).unwrap();
    let st = Command::new("cc")
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .status()
        .expect("cc");
    assert!(st.success(), "cannot compile against verbs.h");
    let out = Command::new(&exe).output().unwrap();
    let got: Vec<usize> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(got.len(), OFFSETS.len());
    let wrong: Vec<String> = OFFSETS
        .iter()
        .zip(&got)
        .filter(|((_, ours), theirs)| ours != *theirs)
        .map(|((e, ours), theirs)| format!("{e}: ours {ours}, header {theirs}"))
        .collect();
    assert!(wrong.is_empty(), "{wrong:#?}");
}
