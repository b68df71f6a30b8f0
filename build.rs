//! Sets `proxalloc_tsan` in ThreadSanitizer builds (`-Zsanitizer=thread`, which cargo
//! reports to build scripts as the `sanitize` cfg): there the restartable sequences are
//! not compiled and per-CPU allocators use per-thread caches, as on other platforms.
//! ThreadSanitizer cannot see the assembly that hands an object from one thread to
//! another through a CPU's cache, and would report the next owner's first write as a
//! race.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    // The sanitizer comes with the flags: run again when they change, even where they do
    // not reach the build script itself (`--target` builds).
    // (A cargo config file's `rustflags` are not watched: give a sanitized build its own
    // target directory, as `.ci/sanitizers` does.)
    println!("cargo:rerun-if-env-changed=RUSTFLAGS");
    println!("cargo:rerun-if-env-changed=CARGO_ENCODED_RUSTFLAGS");
    println!("cargo:rerun-if-env-changed=CARGO_BUILD_RUSTFLAGS");
    if let Ok(target) = std::env::var("TARGET") {
        let triple = target.to_uppercase().replace(['-', '.'], "_");
        println!("cargo:rerun-if-env-changed=CARGO_TARGET_{triple}_RUSTFLAGS");
    }
    let sanitizers = std::env::var("CARGO_CFG_SANITIZE").unwrap_or_default();
    if sanitizers.split(',').any(|s| s == "thread") {
        println!("cargo:rustc-cfg=proxalloc_tsan");
    }
}
